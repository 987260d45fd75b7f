"""The console's HTTP side: a request (method, target, headers, body) in, a
:class:`Response` out. No sockets here: :mod:`queueserver.console.http`
hands over every request that is not ``/metrics`` or ``/status``.

Routes (``<name>`` and ``<ident>`` are one percent-encoded path segment,
so a queue name may hold a ``/``):

* ``GET /[?range=]``: the overview of every queue (live), the node's charts over ``range``
* ``GET /queues/<name>?state=&page=&per_page=&outcome=&older=&newer=&priority=&text=``: a
  queue's jobs by state (``failed``: its failed ones), filtered; its chart
* ``GET /failed?queue=&...``: the failed (dead) jobs of every queue, with the same filters
* ``GET /jobs/<ident>``: a job (UUID or number), found anywhere in the cluster
* ``GET /search?q=``: queue names and a job id or number
* ``GET /workers``: client connections per router and shard, and who holds which lease (live)
* ``GET /cluster``: nodes, shards, moves, links
* ``GET /history/report``: the last ``queueserver history`` report (sandboxed)
* ``GET /static/console.js``: the pages' script
* ``GET /api/queues[?format=html]``: the overview's rows as JSON (or its live HTML)
* ``GET /api/queues/<name>/rates[?format=svg&range=]``: a queue's rate samples (or its chart)
* ``GET /api/series?range=30m|1h|6h|24h|7d[&queue=][&format=html]``: the node's (or a
  queue's) throughput and jobs held over time (or the charts a page refreshes)
* ``GET /api/job?id=<ident>[&scope=node]``: a job as JSON (other nodes ask with ``scope=node``)
* ``GET /api/workers[?format=html]``: the workers page's data as JSON (or its live HTML)
* ``POST /jobs/<ident>/delete``: delete a job
* ``POST /jobs/<ident>/requeue``: requeue a leased or finished job
* ``POST /queues/<name>/purge``: purge a queue; without ``confirm=<name>``, the confirmation page
* ``POST /queues/<name>/bulk``, ``POST /failed/bulk``: retry or delete the jobs picked (``id``
  fields, ``action=retry|delete``) or all of a list (``action=retry-all|delete-all`` with its
  ``state`` and filters); logged once, with the count

With an access file, every request needs its verb (:mod:`.access`):
``inspect`` on every queue for the node-wide pages, on a queue for its
pages and its jobs'; an action ``admin`` on the queue it touches, *and* a
token. A refused one is a 403 (a page, or JSON under ``/api/``).

An action needs a token (:mod:`.auth`); a form post also its CSRF field and
a same-origin ``Origin``/``Referer``. An action on GET is 405. A form post
is answered with a redirect to the page it changed (a flash line says what
was done); a post with the token in the ``X-Queueserver-Token`` header with
the :class:`~.model.ActionResult` as JSON. The shard logs each action (who,
what) at INFO; a refused one is logged here, as a warning with the client's
address. A :class:`~.errors.ConsoleError` is a page (or, under ``/api/``, for
requests with the token header and for a POST no browser sent, JSON
``{"error": ...}``) with its status;
anything else a 500 page with no traceback (the traceback goes to the log).
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from ..access import Permissions
from ..engine.ops import ADMIN, INSPECT
from . import pages
from .access import EVERY_QUEUE, require
from .assets import CONSOLE_JS
from .auth import TOKEN_HEADER, Auth
from .charts import rate_chart
from .errors import BadRequest, ConsoleError, Forbidden, NotFound
from .layout import url
from .series import RANGES
from .model import (LISTS, MAX_PER_PAGE, OUTCOMES, ActionResult, ClusterView, Filters, JobDetail, JobPage,
                    QueueRow, RatePoint, SearchResult, WorkersView)

log = logging.getLogger("queueserver.console")

#: Most bytes of a POST body (the handler answers 413 beyond it).
MAX_BODY = 64 * 1024
#: Most characters of an id, a queue name or a search (longer: 400, before the source is asked).
MAX_TEXT = 300
#: The highest page number asked for (a larger one is a 400, not a scan).
MAX_PAGE = 1_000_000
#: The default page size of a queue's list.
PER_PAGE = 50
#: Most fields a query or form may have (a page's picked jobs, its filters, a few more).
MAX_FIELDS = MAX_PER_PAGE + 64
#: Most characters of a filter's text.
MAX_FILTER_TEXT = 200
_DURATION = re.compile(r"\A([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*(ms|s|m|h|d|w)?\Z")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}
_PRIORITY = re.compile(r"\A[+-]?[0-9]{1,19}\Z")

#: Every console page's security headers: our own script only, no framing, no sniffing.
SECURITY_HEADERS = [
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; connect-src 'self'; "
                                "style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
]
#: A served history report runs in a sandbox (an opaque origin: its scripts cannot act on the console).
REPORT_HEADERS = [("Content-Security-Policy", "sandbox allow-scripts allow-popups"),
                  ("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store")]

HTML = "text/html; charset=utf-8"
JSON = "application/json"
_DIGITS = re.compile(r"\A[0-9]+\Z")
_UUID = re.compile(r"\A[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\Z")


class Source(Protocol):
    """What the app asks of the console's data source (:class:`~.source.ConsoleSource`)."""

    def queues(self) -> List[QueueRow]: ...
    def jobs(self, queue: Optional[str], state: str, page: int = 1, per_page: int = 50,
             filters: Optional[Filters] = None) -> JobPage: ...
    def job(self, ident: str, cluster_wide: bool = True) -> JobDetail: ...
    def search(self, text: str) -> SearchResult: ...
    def rates(self, queue: Optional[str] = None, seconds: float = 1800) -> List[RatePoint]: ...
    def cluster(self) -> ClusterView: ...
    def workers(self) -> WorkersView: ...
    def delete_job(self, ident: str, who: str) -> ActionResult: ...
    def requeue_job(self, ident: str, who: str) -> ActionResult: ...
    def purge_queue(self, queue: str, who: str) -> ActionResult: ...
    def bulk(self, action: str, who: str, queue: Optional[str], state: str, ids: Optional[List[str]],
             filters: Optional[Filters] = None) -> ActionResult: ...
    def history_report(self) -> Optional[str]: ...
    def token_names(self) -> Dict[str, str]: ...


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = HTML
    headers: List[Tuple[str, str]] = field(default_factory=list)

    def all_headers(self) -> List[Tuple[str, str]]:
        return [("Content-Type", self.content_type), *self.headers]


class MethodNotAllowed(ConsoleError):
    status = 405

    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message)
        self.allow = allow


@dataclass
class Request:
    method: str
    segments: List[str]          # the path's segments, each percent-decoded
    query: Dict[str, str]        # the first value of each query field
    headers: Dict[str, str]      # lower-case names
    form: Dict[str, str]         # the body's form fields (POST), the first value of each
    client: str
    ids: List[str] = field(default_factory=list)   # every ``id`` field of the form (jobs picked)
    #: what the client's identity may do (None: no access file, anything)
    permissions: Optional[Permissions] = None
    target: str = ""

    def require(self, verb: str, queue: str, of_job: bool = False) -> None:
        """:class:`~.access.Refused` (a 403) unless the identity may ``verb`` ``queue``."""
        require(self.permissions, verb, queue, f"{self.method} {self.target[:200]}", self.client, of_job)

    @property
    def api(self) -> bool:
        return bool(self.segments) and self.segments[0] == "api"

    def param(self, name: str, default: str = "") -> str:
        return self.query.get(name, default)


def from_browser(headers: Mapping[str, str]) -> bool:
    """Whether a request looks like a browser's: it names where it comes from
    (``Origin``/``Referer``, which browsers send with a form post) or asks
    for HTML. ``headers``: lower-case names."""
    return "origin" in headers or "referer" in headers or "text/html" in headers.get("accept", "")


def _all_fields(text: str) -> Dict[str, List[str]]:
    try:
        return parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FIELDS, strict_parsing=False)
    except ValueError:
        raise BadRequest("Too many query or form fields.") from None


def _fields(text: str) -> Dict[str, str]:
    return {k: v[0] for k, v in _all_fields(text).items()}


def _form(headers: Mapping[str, str], body: bytes) -> Tuple[Dict[str, str], List[str]]:
    """A POST body's fields (the first value of each) and its ``id`` fields
    (a form's picked jobs; in JSON, ``"id"`` may be a list of them)."""
    if not body:
        return {}, []
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            data = json.loads(body)
        except ValueError:
            raise BadRequest("The body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise BadRequest("The JSON body must be an object.")
        ids = data.get("id")
        listed = [str(v) for v in ids if isinstance(v, (str, int))] if isinstance(ids, list) else []
        fields = {str(k): str(v) for k, v in data.items() if isinstance(v, (str, int))}
        return fields, listed or ([fields["id"]] if "id" in fields else [])
    try:
        every = _all_fields(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("The form is not valid UTF-8.") from None
    return {k: v[0] for k, v in every.items()}, every.get("id", [])


def _text(value: str, what: str) -> str:
    if not value:
        raise BadRequest(f"No {what} given.")
    if len(value) > MAX_TEXT or any(ch.isspace() or ord(ch) < 32 for ch in value):
        raise BadRequest(f"That is not a valid {what}.")
    return value


def check_ident(ident: str) -> str:
    """``ident`` if it looks like a job id (a UUID or a number), else :class:`BadRequest`."""
    ident = ident.strip()
    if _DIGITS.match(ident) and len(ident) <= 20 or _UUID.match(ident):
        return ident
    raise BadRequest(f"“{ident[:80]}” is not a job id: a job is named by its UUID "
                     "or by its number.")


def parse_duration(text: str, what: str) -> float:
    """``90``, ``90s``, ``1.5m``, ``2h``, ``3d``, ``1w``, ``250ms`` as seconds; BadRequest otherwise."""
    match = _DURATION.match(text.strip().lower())
    if not match:
        raise BadRequest(f"“{text[:40]}” is not a duration for {what}: say 90s, 10m, 2h or 3d.")
    return float(match[1]) * _UNITS[match[2]]


def list_filters(values: Mapping[str, str]) -> Tuple[Filters, Dict[str, str]]:
    """A list's filters from its query (or a bulk form's fields): the
    :class:`~.model.Filters`, and the fields as given (for the page's links
    and form). BadRequest for one that makes no sense."""
    filters: Filters = {}
    shown: Dict[str, str] = {}
    outcome = values.get("outcome", "").strip()
    if outcome:
        if outcome not in OUTCOMES:
            raise BadRequest(f"Unknown outcome “{outcome[:40]}”: {' or '.join(OUTCOMES)}.")
        filters["outcome"], shown["outcome"] = outcome, outcome
    older, newer = values.get("older", "").strip(), values.get("newer", "").strip()
    if older:
        filters["min_age_s"], shown["older"] = parse_duration(older, "“older than”"), older
    if newer:
        filters["max_age_s"], shown["newer"] = parse_duration(newer, "“newer than”"), newer
    priority = values.get("priority", "").strip()
    if priority:
        if not _PRIORITY.match(priority):
            raise BadRequest("The priority must be a whole number.")
        filters["priority"], shown["priority"] = int(priority), priority
    text = values.get("text", "")
    if text.strip():
        if len(text) > MAX_FILTER_TEXT:
            raise BadRequest(f"A filter's text is at most {MAX_FILTER_TEXT} characters.")
        filters["text"], shown["text"] = text, text
    return filters, shown


def _int(value: str, what: str, default: int, low: int, high: int) -> int:
    if value == "":
        return default
    if not _DIGITS.match(value) or len(value) > 12:
        raise BadRequest(f"The {what} must be a whole number.")
    number = int(value)
    if number < low:
        raise BadRequest(f"The {what} must be at least {low}.")
    return min(number, high)


class ConsoleApp:
    """Routes requests to pages, JSON and actions over ``source``."""

    def __init__(self, source: Source, node: str, auth: Optional[Auth] = None) -> None:
        self.source = source
        self.node = node
        self.auth = auth if auth is not None else Auth(source.token_names)
        self._routes: List[Tuple[str, Tuple[str, ...], Callable[..., Response]]] = [
            ("GET", (), self.overview),
            ("GET", ("queues", "*"), self.queue),
            ("GET", ("jobs", "*"), self.job),
            ("GET", ("search",), self.search),
            ("GET", ("workers",), self.workers),
            ("GET", ("failed",), self.failed),
            ("GET", ("cluster",), self.cluster),
            ("GET", ("history", "report"), self.history),
            ("GET", ("static", "console.js"), self.script),
            ("GET", ("api", "queues"), self.api_queues),
            ("GET", ("api", "queues", "*", "rates"), self.api_rates),
            ("GET", ("api", "job"), self.api_job),
            ("GET", ("api", "workers"), self.api_workers),
            ("GET", ("api", "series"), self.api_series),
            ("POST", ("jobs", "*", "delete"), self.delete),
            ("POST", ("jobs", "*", "requeue"), self.requeue),
            ("POST", ("queues", "*", "purge"), self.purge),
            ("POST", ("queues", "*", "bulk"), self.bulk),
            ("POST", ("failed", "bulk"), self.failed_bulk),
        ]

    # ------------------------------------------------------------ entry
    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"",
               client: str = "", permissions: Optional[Permissions] = None) -> Response:
        """The response to one request by a client with ``permissions``
        (None: no access file); never raises."""
        lower = {k.lower(): v for k, v in headers.items()}
        # JSON errors for the API and for scripts (a token in the header, or a
        # POST that no browser sent); pages for browsers.
        api = target.startswith("/api/") or TOKEN_HEADER.lower() in lower or (
            method == "POST" and not from_browser(lower))
        try:
            request = self._parse(method, target, lower, body, client)
            request.permissions, request.target = permissions, target
            return self._route(request)
        except ConsoleError as e:
            return self.error(e.status, e.message, api,
                              [("Allow", e.allow)] if isinstance(e, MethodNotAllowed) else [])
        except Exception:   # a bug costs this request only, and shows no traceback
            log.exception("console: %s %s failed", method, target[:200])
            return self.error(500, "Something went wrong on the server; its log has the details.", api)

    def _parse(self, method: str, target: str, headers: Dict[str, str], body: bytes, client: str) -> Request:
        parts = urlsplit(target)
        raw = [s for s in parts.path.split("/") if s]
        try:
            segments = [unquote(s, errors="strict") for s in raw]
        except UnicodeDecodeError:
            raise NotFound("No such page.") from None
        form, ids = _form(headers, body) if method == "POST" else ({}, [])
        return Request(method, segments, _fields(parts.query), headers, form, client, ids)

    def _route(self, request: Request) -> Response:
        allowed: List[str] = []
        for method, pattern, handler in self._routes:
            if len(pattern) != len(request.segments):
                continue
            if all(p == "*" or p == s for p, s in zip(pattern, request.segments)):
                args = [s for p, s in zip(pattern, request.segments) if p == "*"]
                if method == request.method or (method == "GET" and request.method == "HEAD"):
                    return handler(request, *args)
                allowed.append(method)
        if allowed:
            if "POST" in allowed:
                raise MethodNotAllowed("This is an action: it is done with a POST (a form's button), "
                                       "never by opening a link.", "POST")
            raise MethodNotAllowed("This page is only read (GET), never posted to.", "GET, HEAD")
        raise NotFound("No such page on this console.")

    # --------------------------------------------------------- responses
    def html(self, text: str, status: int = 200) -> Response:
        return Response(status, text.encode(), HTML, list(SECURITY_HEADERS))

    def json(self, data: Any, status: int = 200) -> Response:
        body = json.dumps(data, sort_keys=True, default=str).encode() + b"\n"
        return Response(status, body, JSON, [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")])

    def error(self, status: int, message: str, api: bool = False,
              headers: Optional[List[Tuple[str, str]]] = None) -> Response:
        response = self.json({"error": message}, status) if api else \
            self.html(pages.error_page(status, message, self.node), status)
        response.headers.extend(headers or [])
        return response

    def redirect(self, location: str) -> Response:
        response = self.html(f'<!doctype html><a href="{location}">continue</a>', 303)
        response.headers.append(("Location", location))
        return response

    def _notice(self, request: Request) -> str:
        return pages.flash(request.param("notice") or None, request.param("count"), request.param("job"))

    # ------------------------------------------------------------- pages
    @staticmethod
    def _span(request: Request) -> Tuple[str, int]:
        """The chart range a page asks for (``?range=``): its name and seconds."""
        span = request.param("range", pages.DEFAULT_SPAN) or pages.DEFAULT_SPAN
        if span not in RANGES:
            raise BadRequest(f"Unknown range “{span[:40]}”: one of {', '.join(RANGES)}.")
        return span, RANGES[span]

    def overview(self, request: Request) -> Response:
        request.require(INSPECT, EVERY_QUEUE)
        span, seconds = self._span(request)
        return self.html(pages.overview(self.source.queues(), self.node, self.source.rates(None, seconds), span))

    def _queue_row(self, name: str) -> Optional[QueueRow]:
        return next((row for row in self.source.queues() if row["name"] == name), None)

    @staticmethod
    def _list_state(values: Mapping[str, str], default: str) -> str:
        state = values.get("state", default) or default
        if state not in LISTS:
            raise BadRequest(f"Unknown state “{state[:40]}”: one of {', '.join(LISTS)}.")
        return state

    @staticmethod
    def _paging(request: Request) -> Tuple[int, int, bool]:
        """``(page, per_page, whether per_page was cut)``."""
        page = _int(request.param("page"), "page", 1, 1, MAX_PAGE)
        asked = _int(request.param("per_page"), "per_page", PER_PAGE, 1, 10 ** 12)
        return page, min(asked, MAX_PER_PAGE), asked > MAX_PER_PAGE

    def queue(self, request: Request, name: str) -> Response:
        name = _text(name, "queue name")
        request.require(INSPECT, name)
        state = self._list_state(request.query, "ready")
        filters, shown = list_filters(request.query)
        page, per_page, capped = self._paging(request)
        span, seconds = self._span(request)
        jobs = self.source.jobs(name, state, page, per_page, filters)
        row = self._queue_row(name)
        rates = self.source.rates(name, seconds)
        history = self.source.history_report() is not None
        return self.html(pages.queue_page(jobs, row, rates, self.node, self.auth.csrf_token(), history,
                                          capped=capped, notice=self._notice(request), shown=shown, span=span))

    def failed(self, request: Request) -> Response:
        """The failed jobs of every queue (or of ``?queue=``), with the list's filters."""
        filters, shown = list_filters(request.query)
        queue = request.param("queue").strip()
        if queue:
            shown["queue"] = _text(queue, "queue name")
        request.require(INSPECT, queue or EVERY_QUEUE)
        page, per_page, capped = self._paging(request)
        jobs = self.source.jobs(queue or None, "failed", page, per_page, filters)
        jobs["queue"] = None   # a list of this page's, whatever queue it is narrowed to
        return self.html(pages.failed_page(jobs, self.node, self.auth.csrf_token(), shown,
                                           notice=self._notice(request), capped=capped))

    def job(self, request: Request, ident: str) -> Response:
        detail = self._job(request, check_ident(ident), INSPECT)
        elsewhere: Optional[str] = None
        if detail["node"] and detail["node"] != self.node:   # found through another node's console
            elsewhere = ""
            try:
                elsewhere = next((n["console"] for n in self.source.cluster()["nodes"]
                                  if n["name"] == detail["node"]), "")
            except ConsoleError:
                pass
        return self.html(pages.job_page(detail, self.node, self.auth.csrf_token(), self._notice(request),
                                        elsewhere))

    def search(self, request: Request) -> Response:
        request.require(INSPECT, EVERY_QUEUE)
        text = request.param("q").strip()
        if not text:
            return self.redirect("/")
        if len(text) > MAX_TEXT:
            raise BadRequest("That search is too long.")
        found = self.source.search(text)
        job = found["job"]
        if job is not None and not found["queues"]:
            return self.redirect(url("jobs", job["job"]["id"]))
        if job is None and found["queues"] == [text]:
            return self.redirect(url("queues", text))
        return self.html(pages.search_page(text, found, self.node))

    def cluster(self, request: Request) -> Response:
        request.require(INSPECT, EVERY_QUEUE)
        return self.html(pages.cluster_page(self.source.cluster(), self.node))

    def workers(self, request: Request) -> Response:
        request.require(INSPECT, EVERY_QUEUE)
        return self.html(pages.workers_page(self.source.workers(), self.node))

    def history(self, request: Request) -> Response:
        request.require(INSPECT, EVERY_QUEUE)
        path = self.source.history_report()
        if path is None or not os.path.isfile(path):
            return self.html(pages.history_missing(self.node), 404)
        with open(path, "rb") as f:
            body = f.read()
        return Response(200, body, HTML, list(REPORT_HEADERS))

    def script(self, request: Request) -> Response:
        return Response(200, CONSOLE_JS.encode(), "text/javascript; charset=utf-8",
                        [("Cache-Control", "max-age=300"), ("X-Content-Type-Options", "nosniff")])

    # --------------------------------------------------------------- API
    def api_queues(self, request: Request) -> Response:
        request.require(INSPECT, EVERY_QUEUE)
        rows = self.source.queues()
        if request.param("format") == "html":
            return self.html(pages.overview_live(rows))
        return self.json({"node": self.node, "queues": rows})

    def api_rates(self, request: Request, name: str) -> Response:
        request.require(INSPECT, _text(name, "queue name"))
        span, seconds = self._span(request) if request.param("range") else ("30m", RANGES["30m"])
        points = self.source.rates(name, seconds)
        if request.param("format") == "svg":
            return self.html(rate_chart(points))
        return self.json({"queue": name, "range": span, "rates": points})

    def api_series(self, request: Request) -> Response:
        """The node's (or ``?queue=``'s) rates and jobs held over ``?range=``
        as JSON, or (``format=html``) the charts a page refreshes."""
        span, seconds = self._span(request)
        queue = request.param("queue") or None
        if queue is not None:
            queue = _text(queue, "queue name")
        request.require(INSPECT, queue or EVERY_QUEUE)
        points = self.source.rates(queue, seconds)
        if request.param("format") == "html":
            return self.html(pages.charts(points, queue))
        return self.json({"node": self.node, "queue": queue, "range": span, "seconds": seconds,
                          "step": points[-1]["step"] if points else None, "points": points})

    def api_workers(self, request: Request) -> Response:
        request.require(INSPECT, EVERY_QUEUE)
        view = self.source.workers()
        if request.param("format") == "html":
            return self.html(pages.workers_live(view))
        return self.json({"node": self.node, **view})

    def api_job(self, request: Request) -> Response:
        """A job as JSON; ``scope=node``: this node's shards only (what other nodes' consoles ask)."""
        ident = check_ident(request.param("id"))
        return self.json(self._job(request, ident, INSPECT, cluster_wide=request.param("scope") != "node"))

    def _job(self, request: Request, ident: str, verb: str, cluster_wide: bool = True) -> JobDetail:
        """Job ``ident``, which the identity may ``verb`` in its queue, or :class:`~.access.Refused`."""
        detail = self.source.job(ident, cluster_wide=cluster_wide)
        request.require(verb, detail["job"]["queue"], of_job=True)
        return detail

    # ----------------------------------------------------------- actions
    def _act(self, request: Request, what: str, do: Callable[[str], ActionResult],
             then: Callable[[ActionResult], str]) -> Response:
        try:
            who = self.auth.authorize(request.headers, request.form)
        except Forbidden as refused:
            log.warning("console: refused to %s (from %s): %s", what, request.client or "?", refused.message)
            raise
        result = do(who)
        # The shard logs the action itself at INFO (who, what, how many): here only where it came from.
        log.debug("console: %s by %s (from %s): %s", what, who, request.client or "?", result["message"])
        if TOKEN_HEADER.lower() in request.headers:
            return self.json(result, 200 if result["ok"] else 409)
        if not result["ok"]:
            raise ConsoleError(result["message"])
        return self.redirect(then(result))

    def delete(self, request: Request, ident: str) -> Response:
        ident = check_ident(ident)
        self._may_act_on_job(request, ident)
        queue = request.form.get("queue", "")
        return self._act(request, f"delete job {ident}", lambda who: self.source.delete_job(ident, who),
                         lambda r: url("queues", queue, notice="deleted", job=ident) if queue
                         else url(notice="deleted", job=ident))

    def requeue(self, request: Request, ident: str) -> Response:
        ident = check_ident(ident)
        self._may_act_on_job(request, ident)
        return self._act(request, f"requeue job {ident}", lambda who: self.source.requeue_job(ident, who),
                         lambda r: url("jobs", ident, notice="requeued", job=ident))

    def _may_act_on_job(self, request: Request, ident: str) -> None:
        """An action on a job needs ``admin`` on its queue: asked of the job
        first, unless the identity may administer every queue."""
        if request.permissions is not None and not request.permissions.matchers[ADMIN].everything:
            self._job(request, ident, ADMIN)

    def bulk(self, request: Request, name: str) -> Response:
        name = _text(name, "queue name")
        request.require(ADMIN, name)
        state = self._list_state(request.form, "failed")
        return self._bulk(request, name, state, lambda query: url("queues", name, state=state, **query))

    def failed_bulk(self, request: Request) -> Response:
        queue = request.form.get("queue", "").strip()
        name = _text(queue, "queue name") if queue else None
        request.require(ADMIN, name or EVERY_QUEUE)
        return self._bulk(request, name, "failed", lambda query: url("failed", queue=name, **query))

    def _bulk(self, request: Request, queue: Optional[str], state: str,
              back: Callable[[Dict[str, Any]], str]) -> Response:
        """Retry or delete the jobs picked (``id`` fields; ``action`` retry or
        delete) or every job of the list (``retry-all``, ``delete-all``: its
        ``state`` and filters, as the form carries them); a form's post goes
        ``back`` to the list (with the filters) and its notice."""
        action = request.form.get("action", "")
        if action not in ("retry", "delete", "retry-all", "delete-all"):
            raise BadRequest("Say what to do: action=retry, delete, retry-all or delete-all.")
        verb, _, scope = action.partition("-")
        filters, shown = list_filters(request.form)
        ids: Optional[List[str]] = None
        if not scope:
            ids = [check_ident(ident) for ident in request.ids]
            if not ids:
                raise BadRequest("No job was picked: tick the jobs to act on, or use the “all” button.")
        notice = "deleted-many" if verb == "delete" else "retried-many"
        return self._act(request, f"{verb} {'the picked' if ids else 'all'} jobs",
                         lambda who: self.source.bulk(verb, who, queue, state, ids, filters),
                         lambda r: back({**shown, "notice": notice, "count": r["count"]}))

    def purge(self, request: Request, name: str) -> Response:
        name = _text(name, "queue name")
        request.require(ADMIN, name)
        confirm = request.form.get("confirm", request.param("confirm") or None)
        api = TOKEN_HEADER.lower() in request.headers
        if confirm != name:
            # The first step, or a name typed wrong: nothing is done.
            if api:
                raise BadRequest("To purge, send confirm=<the queue's name> with the request.")
            self.auth.check_form(request.headers, request.form)
            self.source.jobs(name, "ready", 1, 1)   # an unknown queue is a 404 here already
            page = pages.purge_confirm(name, self._queue_row(name), self.node, self.auth.csrf_token(),
                                       mismatch=confirm is not None)
            return self.html(page, 200 if confirm is None else 400)
        return self._act(request, f"purge queue {name}", lambda who: self.source.purge_queue(name, who),
                         lambda r: url("queues", name, notice="purged", count=r["count"]))
