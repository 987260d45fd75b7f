"""The console's data and actions: what the pages show, gathered from this
node's shards (and, for a job, from the cluster's other nodes), and the
actions (delete, requeue, purge, and retry or delete many jobs at once).

:class:`ConsoleSource` runs in the supervisor (no event loop; any thread:
the HTTP server's request threads call it at once). It asks each shard of
this node over its control socket (``shard-<i>.ctl`` in the runtime
directory, :mod:`queueserver.metrics.control`) with ``["console", op,
...]`` requests, which the shard answers in its loop a bounded piece per
loop turn (:mod:`queueserver.shard.console`, :mod:`queueserver.engine.browse`).

Scope: :meth:`ConsoleSource.queues`, :meth:`~ConsoleSource.jobs`,
:meth:`~ConsoleSource.rates` and the actions are about this node's shards
(in a cluster, each node's console shows its own queues; the cluster page
links to the others). :meth:`~ConsoleSource.job` and
:meth:`~ConsoleSource.search` find a job anywhere in the cluster: this
node's shards first, then every other node's console over HTTP (HTTPS
with this node's certificate when its HTTP port speaks HTTPS: :mod:`.peers`)::

    GET http(s)://<node host>:<metrics_port>/api/job?id=<ident>&scope=node

which the app answers with ``job(ident, cluster_wide=False)`` as JSON (the
:class:`~.model.JobDetail`) with status 200, or ``{"error": ...}`` with the
:class:`~.errors.ConsoleError`'s status (404: not on that node). Each node
is given :data:`NODE_TIMEOUT` seconds; one that does not answer makes a job
not found elsewhere an :class:`~.errors.Unavailable`, not a NotFound.
The cluster page asks the other nodes' ``GET /status`` the same way; the
followers of this node's shards (with replicas) are listed on the nodes
they run on, role ``follower``, up while in sync, ``lag`` in events.

Bounds: a page lists at most :data:`~.model.MAX_PER_PAGE` jobs (a larger
``per_page`` is cut to it) and starts before job
:data:`~queueserver.engine.browse.MAX_OFFSET` of its state; deeper pages
are a :class:`~.errors.BadRequest`. ``JobPage.total`` is the true count,
``JobPage.pages`` only the pages that may be asked for (so ``total >
pages * per_page`` says the list goes on past what can be browsed).

Rates and depth: :meth:`~ConsoleSource.start` runs a daemon thread that asks
the shards' counters and jobs held every :data:`SAMPLE_SECONDS` seconds and
keeps them in a :class:`~.series.Series` (the last hour every 5 s, the last
day every minute, the last week every 10 minutes), for the node and for the
most active queues.

Idents: a job's id is a UUID (any case; the engine keeps them lower case),
its number (goqueue, takeanumber) a decimal number; anything else is a
:class:`~.errors.BadRequest`.

Why one module, though a long one: :class:`ConsoleSource` is the console's
one way to its data (the pages, the API and the actions call nothing
else), and its parts (overview, workers, jobs, cluster, actions) share the
asking of shards and nodes, its timeouts and the mapping of their errors.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import msgpack

from ..config import Config
from ..engine.browse import MAX_OFFSET
from ..metrics.control import ask
from .series import Series
from ..metrics.uses import merge
from .peers import NODE_TIMEOUT, PeerConsoles, https_files
from .errors import BY_STATUS, BadRequest, ConsoleError, NotFound, Unavailable
from .model import (LISTS, MAX_LISTED, MAX_PER_PAGE, ActionResult, ClusterView, ConnectionRow, Filters,
                    JobDetail, JobPage, JobRow, Lease, LeaseRow, LinkView, NodeInfo, ProcessCount, QueueRow,
                    RatePoint, SearchResult, ShardView, WorkersView)

log = logging.getLogger("queueserver.console")

#: Seconds a read waits for a shard.
READ_TIMEOUT = 5.0
#: Seconds a delete or requeue waits for a shard (a durable one answers once its log holds it).
ACTION_TIMEOUT = 30.0
#: Seconds a purge waits (it deletes in batches, one per loop turn).
PURGE_TIMEOUT = 600.0
#: Seconds between samples of the counters (the finest resolution of :mod:`.series`).
SAMPLE_SECONDS = 5.0
#: Seconds a chart shows unless asked for another range.
DEFAULT_RANGE = 1800
#: Queues a search lists.
MAX_SEARCH_QUEUES = 50
#: Bytes of a shard's history files read (newest first) for one job's lines.
HISTORY_SCAN_BYTES = 64 << 20
#: Lines of a job's history shown (the latest).
MAX_HISTORY_LINES = 200
#: A job number: decimal, as goqueue and takeanumber show them.
NUMBER = re.compile(r"\A[0-9]{1,18}\Z")
UUID = re.compile(r"\A[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")

_ATTEMPTS_CAP = 255   # what max-attempts 0 means (queueserver.engine.job.ATTEMPTS_CAP)


def parse_ident(ident: str) -> Tuple[str, Any]:
    """``("id", uuid)`` or ``("number", int)``; BadRequest for anything else."""
    text = ident.strip() if isinstance(ident, str) else ""
    if NUMBER.match(text):
        number = int(text)
        if number < 1:
            raise BadRequest(f"job number {text}: numbers start at 1")
        return "number", number
    if UUID.match(text):
        return "id", text.lower()
    shown = text if len(text) <= 60 else text[:57] + "..."
    raise BadRequest(f"{shown!r} is neither a job id (a UUID such as "
                     f"7f3c1e0a-5b2d-4c8e-9f10-2a3b4c5d6e7f) nor a job number (such as 42)")


def _preview(data: Optional[bytes]) -> Optional[str]:
    """``data`` as text when it is UTF-8 (a character cut at the end of the preview forgiven)."""
    if data is None:
        return None
    for cut in range(4):
        try:
            return data[:len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _seconds(us: Optional[int]) -> Optional[float]:
    return None if us is None else us / 1e6


def _row(raw: Dict[str, Any]) -> JobRow:
    error: Optional[bytes] = raw.get("error")
    return {"id": raw["id"], "number": raw["number"] or None, "queue": raw["queue"], "state": raw["state"],
            "priority": raw["priority"], "attempts": raw["attempts"], "age_s": max(0.0, raw["age"] / 1e6),
            "ttr_left_s": _seconds(raw["ttr_left"]), "ttl_left_s": _seconds(raw["ttl_left"]),
            "outcome": raw.get("outcome"),
            "error": None if error is None else error.decode("utf-8", "replace")}


def shard_filters(state: str, filters: Optional[Filters]) -> Tuple[str, Dict[str, Any]]:
    """A list's state (one of :data:`~.model.LISTS`) and filters as a shard
    takes them (:data:`queueserver.engine.browse.Filters`): ``failed`` is
    the finished jobs whose outcome is failed; times in µs, text as bytes."""
    filters = filters or {}
    out: Dict[str, Any] = {}
    if state == "failed":
        state, out["outcome"] = "finished", "failed"
    elif filters.get("outcome"):
        out["outcome"] = filters["outcome"]
    if filters.get("min_age_s") is not None:
        out["min_age"] = int(filters["min_age_s"] * 1e6)
    if filters.get("max_age_s") is not None:
        out["max_age"] = int(filters["max_age_s"] * 1e6)
    if filters.get("priority") is not None:
        out["priority"] = int(filters["priority"])
    if filters.get("text"):
        out["text"] = filters["text"].encode("utf-8")
    return state, out


def describe_selection(queue: Optional[str], state: str, filters: Optional[Filters]) -> str:
    """A bulk action's selection in words, for its log line."""
    filters = filters or {}
    parts = [f"queue {queue}" if queue else "every queue", state]
    if filters.get("outcome"):
        parts.append(f"outcome {filters['outcome']}")
    if filters.get("min_age_s") is not None:
        parts.append(f"older than {filters['min_age_s']:g} s")
    if filters.get("max_age_s") is not None:
        parts.append(f"newer than {filters['max_age_s']:g} s")
    if filters.get("priority") is not None:
        parts.append(f"priority {filters['priority']}")
    if filters.get("text"):
        parts.append(f"text {filters['text']!r}")
    return ", ".join(parts)


def _ago(now: int, then: Optional[int]) -> Optional[float]:
    """Seconds from ``then`` to ``now`` (µs; None stays None)."""
    return None if not then else max(0.0, (now - then) / 1e6)


def _holder(view: Optional[Dict[str, Any]], now: int) -> Optional[Dict[str, Any]]:
    """A shard's view of a lease's holder (:meth:`~queueserver.links.clients.ClientRecord.view`)
    as the console shows it: times as seconds ago."""
    if not view:
        return None
    return {"address": view.get("address") or "", "protocol": view.get("protocol") or "",
            "client": str(view.get("name") or ""), "via": view.get("via") or "",
            "router": str(view.get("router", "")), "connection": view.get("connection"),
            "connected_s": _ago(now, view.get("since")), "left_s": _ago(now, view.get("left"))}


def _lease(raw: Dict[str, Any], now: int) -> Lease:
    """A leased job's lease as its shard told it: who holds it, since when."""
    holder = _holder(raw.get("holder"), now) or {}
    return {"connection": holder.get("address", ""), "protocol": holder.get("protocol", ""),
            "ttr_left_s": _seconds(raw["ttr_left"]) or 0.0, "client": holder.get("client", ""),
            "via": holder.get("via", ""), "leased_s": _ago(now, raw.get("leased_at")),
            "connected_s": holder.get("connected_s"), "left_s": holder.get("left_s")}


def _history_line(line: str) -> str:
    """A history line as a person reads it: time, event, attempt, who."""
    from ..shard.history import decode
    try:
        record = decode(line)
        when = datetime.fromtimestamp(record["time"] / 1e6, timezone.utc).isoformat(timespec="milliseconds")
    except (ValueError, KeyError, TypeError, OverflowError):
        return line.strip()
    parts = [when.replace("+00:00", "Z"), str(record.get("event")), f"attempt {record.get('attempt')}"]
    if record.get("protocol"):
        parts.append(f"by {record['protocol']}")
    if record.get("conn"):
        parts.append(f"({record['conn']})")
    parts.append(f"shard {record.get('shard')}")
    return " ".join(parts)


def history_lines(directory: str, id: str, budget: int = HISTORY_SCAN_BYTES,
                  most: int = MAX_HISTORY_LINES) -> List[str]:
    """The lines of job ``id`` in a shard's history directory, oldest first:
    its segments read newest first until ``budget`` bytes (older lines of
    a job past that are not shown)."""
    from ..shard.history import SEGMENT_NAME
    try:
        names = [n for n in os.listdir(directory) if SEGMENT_NAME.match(n)]
    except OSError:
        return []

    def order(name: str) -> Tuple[int, int]:
        match = SEGMENT_NAME.match(name)
        assert match is not None
        return int(match[1]), int(match[2])

    needle = f'"{id}"'.encode()
    found: List[List[str]] = []
    for name in sorted(names, key=order, reverse=True):
        if budget <= 0:
            break
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > budget:
                    f.seek(size - budget)
                    f.readline()   # a cut line
                data = f.read(budget)
        except OSError:
            continue
        budget -= len(data)
        if needle in data:
            found.append([line.decode("utf-8", "replace") for line in data.splitlines() if needle in line])
    lines = [line for segment in reversed(found) for line in segment]
    return [_history_line(line) for line in lines[-most:]]


class ConsoleSource:
    """The console's view of this node (see the module's docstring)."""

    def __init__(self, config: Config, runtime_file: Callable[[str], str]) -> None:
        self.config = config
        self.runtime_file = runtime_file
        self.node = config.node or ""
        self.shard_paths: Dict[int, str] = {i: runtime_file(f"shard-{i}.ctl") for i in range(config.shards)}
        self.router_paths: Dict[int, str] = {i: runtime_file(f"router-{i}.ctl") for i in range(config.routers)}
        #: the node's rates and depth over time (the charts), and every queue's rates at the last sample
        self._series = Series()
        self._queue_rates: Dict[str, Tuple[float, float, float]] = {}
        #: shard -> (its clock µs, name -> [added, completed, failed], totals) at the last sample
        self._last: Dict[int, Tuple[int, Dict[str, List[int]], List[int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pool = ThreadPoolExecutor(max_workers=max(4, min(32, 2 * len(self.shard_paths))),
                                        thread_name_prefix="console-ask")
        self._tokens: Tuple[Optional[Tuple[int, int, int]], Dict[str, str]] = (None, {})
        self._token_warned: Optional[str] = None
        #: how the other nodes' consoles are asked (HTTPS when this node's HTTP port speaks it)
        self.peers = PeerConsoles(https_files(config))

    # ------------------------------------------------------------ life cycle
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_loop, name="console-rates", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(READ_TIMEOUT + 1)
        self._pool.shutdown(wait=False)

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:   # a bug must not end the rates for good
                log.exception("console: sampling the counters failed")
            with self._lock:
                started = self._series.latest() is not None
            # until the first rates: every second (a console opened at start-up shows rates at once)
            self._stop.wait(SAMPLE_SECONDS if started else 1.0)

    def sample(self) -> None:
        """Ask every shard's counters once and keep the rates since the last
        time, and the jobs held now, in the series the charts draw."""
        answers = self._ask_all(["console", "counters"], READ_TIMEOUT)
        node = [0.0] * 7   # rates, then jobs by state (series.NODE_KEYS)
        queues: Dict[str, List[float]] = {}
        intervals: List[float] = []
        with self._lock:
            for shard, answer in answers.items():
                if answer is None or "error" in answer:
                    continue
                now, rows, totals = int(answer["now"]), answer["rows"], list(answer["totals"])
                last = self._last.get(shard)
                self._last[shard] = (now, rows, totals)
                for i, count in enumerate(answer.get("states", ())):
                    node[3 + i] += count
                for name, depth in answer.get("depth", {}).items():
                    queues.setdefault(name, [0.0, 0.0, 0.0, 0.0])[3] += depth
                if last is None or now <= last[0]:
                    continue
                seconds = (now - last[0]) / 1e6
                intervals.append(seconds)
                for i in range(3):
                    node[i] += max(0, totals[i] - last[2][i]) / seconds
                before = last[1]
                for name, counts in rows.items():
                    old = before.get(name)
                    if old == counts:
                        continue
                    old = old or [0, 0, 0]
                    values = queues.setdefault(name, [0.0, 0.0, 0.0, 0.0])
                    for i in range(3):
                        values[i] += max(0, counts[i] - old[i]) / seconds
            if intervals:   # a shard answered twice: rates since its last answer
                active = {name: (v[0], v[1], v[2], v[3]) for name, v in queues.items() if any(v)}
                self._series.add(time.time(), sum(intervals) / len(intervals), node, active)
                self._queue_rates = {name: v[:3] for name, v in active.items() if any(v[:3])}

    # -------------------------------------------------------------- asking
    def _ask(self, shard: int, request: Sequence[Any], timeout: float = READ_TIMEOUT) -> Dict[str, Any]:
        """One shard's answer; the shard's own error as its ConsoleError, Unavailable if it does not answer."""
        try:
            answer = ask(self.shard_paths[shard], request, timeout=timeout)
        except (OSError, ValueError, msgpack.UnpackException) as err:
            raise Unavailable(f"shard {shard} did not answer ({type(err).__name__}: {err})") from None
        if "error" in answer:
            status = answer.get("status", 500)
            raise BY_STATUS.get(status, Unavailable)(str(answer["error"]))
        return answer

    def _ask_all(self, request: Sequence[Any], timeout: float = READ_TIMEOUT) -> Dict[int, Optional[Dict[str, Any]]]:
        """Every shard's answer at once: None for one that did not answer;
        a shard's error stays in its answer (``{"error", "status"}``)."""
        def one(path: str) -> Optional[Dict[str, Any]]:
            try:
                return ask(path, request, timeout=timeout)
            except (OSError, ValueError, msgpack.UnpackException) as err:
                log.debug("console: no answer from %s: %s", path, err)
                return None
        futures = {shard: self._pool.submit(one, path) for shard, path in self.shard_paths.items()}
        return {shard: future.result() for shard, future in futures.items()}

    @staticmethod
    def _raise_for(answers: Dict[int, Optional[Dict[str, Any]]], what: str) -> None:
        """Every shard failed: the first shard error that is not a 404, or Unavailable."""
        for answer in answers.values():
            if answer is not None and answer.get("status") not in (None, 404):
                raise BY_STATUS.get(answer["status"], Unavailable)(str(answer["error"]))
        missing = [str(s) for s, a in answers.items() if a is None]
        if missing:
            raise Unavailable(f"{what}: shard {', '.join(missing)} did not answer")

    # ----------------------------------------------------------- overview
    def _latest_rates(self) -> Dict[str, Tuple[float, float, float]]:
        with self._lock:
            return self._queue_rates

    @staticmethod
    def _ask_router(path: str, request: Sequence[Any]) -> Optional[Dict[str, Any]]:
        """One router's answer (None if it does not answer, or answers an error)."""
        try:
            answer = ask(path, request, timeout=READ_TIMEOUT)
        except (OSError, ValueError, msgpack.UnpackException):
            return None
        return None if "error" in answer else answer

    @classmethod
    def _router_uses(cls, path: str) -> Dict[str, Any]:
        """Which protocols used each queue, as one router saw it ({} if it does not answer)."""
        uses = (cls._ask_router(path, ["console", "uses"]) or {}).get("uses")
        return uses if isinstance(uses, dict) else {}

    def queues(self) -> List[QueueRow]:
        routers = [self._pool.submit(self._router_uses, path) for path in self.router_paths.values()]
        answers = self._ask_all(["console", "queues"])
        uses: Dict[str, List[str]] = {}
        for future in routers:
            merge(uses, future.result())
        if all(a is None for a in answers.values()):
            raise Unavailable("no shard answered")
        rates = self._latest_rates()
        rows: List[QueueRow] = []
        for shard, answer in sorted(answers.items()):
            if answer is None or "error" in answer:
                continue
            now = answer["now"]
            for name, q in answer["queues"].items():
                added, completed, failed = rates.get(name, (0.0, 0.0, 0.0))
                oldest = q["oldest_ready"]
                rows.append({"name": name, "node": self.node, "shard": shard, "ready": q["ready"],
                             "scheduled": q["scheduled"], "leased": q["leased"], "finished": q["finished"],
                             "added_per_s": added, "completed_per_s": completed, "failed_per_s": failed,
                             "oldest_ready_age_s": None if oldest is None else max(0.0, (now - oldest) / 1e6),
                             "protocols": sorted(set(q["protocols"]) | set(uses.get(name, ())))})
        rows.sort(key=lambda row: row["name"])
        return rows

    def rates(self, queue: Optional[str] = None, seconds: float = DEFAULT_RANGE) -> List[RatePoint]:
        """The node's (or ``queue``'s) rates and jobs held over the last
        ``seconds``, oldest first, at the finest resolution that reaches
        that far back (see :mod:`.series`)."""
        with self._lock:
            step, window = self._series.window(seconds)
        points: List[RatePoint] = []
        for p in window:
            if queue is None:
                added, completed, failed, ready, scheduled, leased, finished = p.node
                points.append({"t": p.t, "step": step, "added": added, "completed": completed, "failed": failed,
                               "depth": ready + scheduled + leased + finished, "ready": ready,
                               "scheduled": scheduled, "leased": leased, "finished": finished})
                continue
            values = p.queue(queue)
            known: Tuple[Optional[float], ...] = values if values is not None else (None,) * 4
            points.append({"t": p.t, "step": step, "added": known[0], "completed": known[1], "failed": known[2],
                           "depth": known[3], "ready": None, "scheduled": None, "leased": None, "finished": None})
        return points

    # ------------------------------------------------------------- workers
    def workers(self) -> WorkersView:
        """Who is connected (each router's connections) and who holds which
        lease (each shard's leased jobs), counted per router and shard."""
        routers = {index: self._pool.submit(self._ask_router, path, ["console", "clients"])
                   for index, path in self.router_paths.items()}
        answers = self._ask_all(["console", "leases", MAX_LISTED])
        if all(answer is None or "error" in answer for answer in answers.values()):
            self._raise_for(answers, "leases")
            raise Unavailable("no shard answered")
        leases: List[LeaseRow] = []
        held: Dict[Tuple[str, int], int] = {}   # (router, connection) -> leases it holds
        shards: List[ProcessCount] = []
        total = unknown = 0
        for shard, answer in sorted(answers.items()):
            if answer is None or "error" in answer:
                shards.append({"name": f"shard {shard}", "up": False, "connections": 0, "leases": 0})
                continue
            now = int(answer["now"])
            total += int(answer["total"])
            unknown += int(answer["unknown"])
            for view, count in answer["holders"]:
                key = (str(view.get("router")), int(view.get("connection") or 0))
                held[key] = held.get(key, 0) + int(count)
            leases += [{"job": _row(raw), "shard": shard, "leased_s": _ago(now, raw.get("leased_at")),
                        "holder": _holder(raw.get("holder"), now)} for raw in answer["leases"]]
            shards.append({"name": f"shard {shard}", "up": True, "connections": len(answer["direct"]),
                           "leases": int(answer["total"])})
        now = time.time_ns() // 1000
        connections: List[ConnectionRow] = []
        processes: List[ProcessCount] = []
        listed = 0
        for index, future in sorted(routers.items()):
            clients = future.result()
            if clients is None:
                processes.append({"name": f"router {index}", "up": False, "connections": 0, "leases": 0})
                continue
            router_key = str(clients["router"])
            listed += int(clients["total"])
            for origin, protocol, address, since, _, served in (c[:6] for c in clients["clients"]):
                connections.append({"router": router_key, "connection": int(origin), "protocol": str(protocol),
                                    "address": str(address), "connected_s": _ago(now, since),
                                    "served_by": "router" if served is None else f"shard {served}",
                                    "leases": held.get((router_key, int(origin)), 0)})
            processes.append({"name": f"router {index}", "up": True, "connections": int(clients["total"]),
                              "leases": sum(n for (router, _), n in held.items() if router == router_key)})
        connections.sort(key=lambda c: (-c["leases"], -(c["connected_s"] or 0.0)))
        leases.sort(key=lambda lease: -(lease["leased_s"] if lease["leased_s"] is not None else -1.0))
        return {"connections": connections[:MAX_LISTED], "connections_total": listed,
                "leases": leases[:MAX_LISTED], "leases_total": total, "leases_unknown": unknown,
                "processes": processes + shards}

    # --------------------------------------------------------------- jobs
    def jobs(self, queue: Optional[str], state: str, page: int = 1, per_page: int = 50,
             filters: Optional[Filters] = None) -> JobPage:
        """A page of ``queue``'s jobs in ``state`` (one of :data:`~.model.LISTS`)
        that pass ``filters``; ``queue`` None: every queue's on this node."""
        if state not in LISTS:
            raise BadRequest(f"no job list {state!r}: one of {', '.join(LISTS)}")
        if not isinstance(page, int) or page < 1:
            raise BadRequest(f"page {page!r}: pages are numbered from 1")
        if not isinstance(per_page, int) or per_page < 1:
            raise BadRequest(f"per_page {per_page!r}: at least 1")
        per_page = min(per_page, MAX_PER_PAGE)
        offset = (page - 1) * per_page
        if offset >= MAX_OFFSET:
            raise BadRequest(f"page {page} starts past job {MAX_OFFSET:,}, the deepest the console lists "
                             f"(a queue's later jobs are not browsable page by page)")
        asked, narrowed = shard_filters(state, filters)
        if queue is None:
            total, rows = self._every_queue(asked, narrowed, offset, per_page)
        else:
            answers = self._ask_all(["console", "jobs", queue, asked, offset, per_page, narrowed])
            found = next((answer for _, answer in sorted(answers.items())
                          if answer is not None and "error" not in answer), None)
            if found is None:
                self._raise_for(answers, f"queue {queue}")
                raise NotFound(f"no queue {queue!r}" + (f" on node {self.node}" if self.node else ""))
            total, rows = int(found["total"]), [_row(raw) for raw in found["jobs"]]
        pages = max(1, -(-min(total, MAX_OFFSET) // per_page))
        if page > pages:
            raise BadRequest(f"page {page} of {queue or 'the list'} ({state}): there are {pages}")
        return {"queue": queue, "state": state, "page": page, "pages": pages, "per_page": per_page,
                "total": total, "jobs": rows}

    def _every_queue(self, state: str, filters: Dict[str, Any], offset: int, limit: int
                     ) -> Tuple[int, List[JobRow]]:
        """Every shard's jobs of every queue in ``state`` that pass ``filters``:
        how many, and those from ``offset`` (shard by shard, in each shard's
        order). The first page takes one question per shard; a later one two
        (how many each has, then the part of the page each holds)."""
        first = offset == 0
        answers = self._ask_all(["console", "jobs", None, state, 0, limit if first else 0, filters])
        if all(answer is None or "error" in answer for answer in answers.values()):
            self._raise_for(answers, "the list")
            raise Unavailable("no shard answered")
        counts = {shard: int(answer["total"]) for shard, answer in answers.items()
                  if answer is not None and "error" not in answer}
        total = sum(counts.values())
        rows: List[JobRow] = []
        if first:
            for shard in sorted(counts):
                rows += [_row(raw) for raw in (answers[shard] or {}).get("jobs", [])]
            return total, rows[:limit]
        start = 0
        for shard in sorted(counts):   # the part of [offset, offset + limit) each shard holds
            end = start + counts[shard]
            lo, hi = max(offset, start), min(offset + limit, end)
            if lo < hi:
                answer = self._ask(shard, ["console", "jobs", None, state, lo - start, hi - lo, filters])
                rows += [_row(raw) for raw in answer["jobs"]]
            start = end
        return total, rows[:limit]

    def _local_job(self, kind: str, key: Any) -> Optional[Tuple[int, Dict[str, Any]]]:
        """``(shard, its answer)`` for the shard of this node that holds the job; None if none does."""
        answers = self._ask_all(["console", "job" if kind == "id" else "number", key])
        for shard, answer in sorted(answers.items()):
            if answer is not None and answer.get("job") is not None:
                return shard, answer
        self._raise_for({s: a for s, a in answers.items() if a is None or "error" in a}, "job lookup")
        return None

    def _detail(self, shard: int, answer: Dict[str, Any]) -> JobDetail:
        raw = answer["job"]
        payload: bytes = raw["payload"]
        result: Optional[bytes] = raw["result"]
        history: List[str] = []
        if answer.get("history_dir"):
            history = history_lines(answer["history_dir"], raw["id"])
        lease: Optional[Lease] = None
        if raw["state"] == "leased":
            lease = _lease(raw, answer["now"])
        max_attempts = raw["max_attempts"]
        extra = {key: raw[key] for key in ("max_fails", "fails", "ttr", "ttl", "foreground", "outcome",
                                           "result_size")}
        extra["ttr_ms"] = extra.pop("ttr")
        extra["ttl_ms"] = extra.pop("ttl")
        extra["created"] = raw["created"] / 1e6
        extra["scheduled_for"] = None if raw["sched"] is None else raw["sched"] / 1e6
        text = _preview(result)
        return {"job": _row(raw), "node": self.node, "shard": shard, "payload_size": raw["payload_size"],
                "payload_text": _preview(payload), "payload_hex": payload.hex(),
                "result": None if result is None else text if text is not None else result.hex(),
                "max_attempts": None if max_attempts < 0 else max_attempts or _ATTEMPTS_CAP,
                "lease": lease, "history": history, "extra": extra}

    def job(self, ident: str, cluster_wide: bool = True) -> JobDetail:
        """The job ``ident`` names (see the module's docstring); with
        ``cluster_wide`` False, only this node's shards are asked (what
        ``/api/job?...&scope=node`` answers other nodes)."""
        kind, key = parse_ident(ident)
        found = self._local_job(kind, key)
        if found is not None:
            return self._detail(*found)
        silent: List[str] = []
        if cluster_wide:
            query = urllib.parse.urlencode({"id": str(key), "scope": "node"})
            asked = [(name, self._pool.submit(self.peers.get_json, name, f"{url}api/job?{query}"))
                     for name, url in self._other_consoles()]
            for name, future in asked:   # all at once: one node that does not answer costs NODE_TIMEOUT
                try:
                    detail = future.result()
                except NotFound:
                    continue
                except ConsoleError:
                    silent.append(name)
                    continue
                if isinstance(detail, dict) and "job" in detail:
                    return detail   # type: ignore[return-value]   # another node's JobDetail, as JSON
        if silent:
            raise Unavailable(f"job {key} is not on the nodes that answered; node {', '.join(silent)} "
                              f"did not answer")
        raise NotFound(f"no job {key}" + (" in the cluster" if self.config.cluster else ""))

    def search(self, text: str) -> SearchResult:
        text = (text or "").strip()
        if not text:
            return {"queues": [], "job": None}
        job: Optional[JobDetail] = None
        try:
            parse_ident(text)
        except BadRequest:
            pass
        else:
            try:
                job = self.job(text)
            except (NotFound, Unavailable):
                job = None
        needle = text.lower()
        try:
            names = sorted({row["name"] for row in self.queues() if needle in row["name"].lower()})
        except Unavailable:
            names = []
        names.sort(key=lambda name: (name.lower() != needle, name))
        return {"queues": names[:MAX_SEARCH_QUEUES], "job": job}

    # ------------------------------------------------------------- cluster
    def _cluster_spec(self) -> Any:
        if not self.config.cluster:
            return None
        from ..cluster.clusterfile import load_cluster
        try:
            return load_cluster(self.config.cluster)
        except (ValueError, OSError) as err:
            raise Unavailable(f"the cluster file cannot be read: {err}") from None

    def _other_consoles(self) -> List[Tuple[str, str]]:
        """``(node, console URL)`` of the cluster's other nodes."""
        spec = self._cluster_spec()
        if spec is None:
            return []
        return [(node.name, self.peers.url(node.host, node.metrics_port)) for node in spec.nodes
                if node.name != self.node and not node.removed]

    def cluster(self) -> ClusterView:
        answers = self._ask_all(["console", "shard"])
        spec = self._cluster_spec()
        names: Dict[int, str] = {}
        if spec is not None:
            names = {s.ordinal: s.name for s in spec.shards()}
        shards: List[ShardView] = []
        moves: List[Dict[str, Any]] = []
        links: List[LinkView] = []
        copies: List[Tuple[str, ShardView]] = []   # (the node it runs on, a follower of a shard here)
        for index, answer in sorted(answers.items()):
            if answer is None or "error" in answer:
                shards.append({"shard": index, "name": f"{self.node}/{index}" if self.node else str(index),
                               "up": False, "jobs": 0, "queues": 0, "slots": "", "role": "primary", "lag": None})
                continue
            slots = answer.get("slots")
            shards.append({"shard": index, "name": answer["name"], "up": True, "jobs": answer["jobs"],
                           "queues": answer["queues"], "slots": _ranges(slots["served"]) if slots else "",
                           "role": "primary", "lag": None})
            for move in (slots or {}).get("moving", []):
                moves.append({"source": answer["name"], "target": names.get(move["target"], str(move["target"])),
                              "epoch": move["epoch"], "slots": _ranges(move["ranges"]), "jobs": move["jobs"]})
            for follower in answer.get("followers", []):
                copies.append((str(follower["node"]), {
                    "shard": index, "name": f"{answer['name']} (copy)", "up": follower["state"] == "in-sync",
                    "jobs": answer["jobs"], "queues": answer["queues"], "slots": shards[-1]["slots"],
                    "role": "follower", "lag": int(follower["lag"])}))
            for ordinal, up in answer.get("links", []):
                links.append({"source": answer["name"], "target": names.get(ordinal, str(ordinal)),
                              "state": "up" if up else "down"})
        me: NodeInfo = {"name": self.node or "local", "host": self.config.metrics.bind or self.config.bind,
                        "up": True, "console": "", "shards": shards}
        if spec is None:
            return {"clustered": False, "nodes": [me], "moves": moves, "links": links}
        nodes: List[NodeInfo] = []
        others = {node.name: self._pool.submit(self.peers.get_json, node.name,
                                               self.peers.url(node.host, node.metrics_port) + "status")
                  for node in spec.nodes if not node.removed and node.name != self.node}
        for node in spec.nodes:
            if node.removed:
                continue
            url = self.peers.url(node.host, node.metrics_port)
            if node.name == self.node:
                me["host"], me["console"] = node.host, url
                nodes.append(me)
                continue
            info: NodeInfo = {"name": node.name, "host": node.host, "up": False, "console": url, "shards": []}
            try:
                status = others[node.name].result()
            except ConsoleError:
                status = None
            if isinstance(status, dict):
                info["up"] = True
                for s in status.get("shards", []):
                    index = s.get("shard", 0)
                    info["shards"].append({"shard": index, "name": f"{node.name}/{index}", "up": bool(s.get("up")),
                                           "jobs": int(s.get("jobs", 0)), "queues": int(s.get("queues", 0)),
                                           "slots": f"{s['slots_owned']} slots" if "slots_owned" in s else "",
                                           "role": "primary", "lag": None})
            nodes.append(info)
        # this node's shards' followers, on the nodes they run on (up: in sync; lag: events behind)
        by_name = {node["name"]: node for node in nodes}
        for where, copy in copies:
            by_name.get(where, me)["shards"].append(copy)
        return {"clustered": True, "nodes": nodes, "moves": moves, "links": links}

    # ------------------------------------------------------------- actions
    def _holder(self, ident: str) -> Tuple[int, str, str]:
        """``(shard, job id, queue)`` of the job ``ident`` names on this node."""
        kind, key = parse_ident(ident)
        found = self._local_job(kind, key)
        if found is None:
            where = ""
            if self.config.cluster:
                try:
                    detail = self.job(ident)
                except ConsoleError:
                    detail = None
                if detail is not None:
                    where = f": it is on node {detail['node']}, act on it from that node's console"
            raise NotFound(f"no job {key} on this node{where}")
        shard, answer = found
        return shard, answer["job"]["id"], answer["job"]["queue"]

    def _action(self, shard: int, request: Sequence[Any], timeout: float) -> ActionResult:
        answer = self._ask(shard, request, timeout)
        return {"ok": bool(answer["ok"]), "message": str(answer["message"]), "count": int(answer["count"])}

    def delete_job(self, ident: str, who: str) -> ActionResult:
        shard, id, _ = self._holder(ident)
        return self._action(shard, ["console", "delete", id, who], ACTION_TIMEOUT)

    def requeue_job(self, ident: str, who: str) -> ActionResult:
        shard, id, _ = self._holder(ident)
        return self._action(shard, ["console", "requeue", id, who], ACTION_TIMEOUT)

    def bulk(self, action: str, who: str, queue: Optional[str], state: str, ids: Optional[List[str]],
             filters: Optional[Filters] = None) -> ActionResult:
        """``retry`` (requeue) or ``delete`` the jobs ``ids`` names, or (``ids``
        None) every job of ``queue`` (None: of every queue) in ``state`` that
        passes ``filters``, on every shard of this node at once. Logged
        here, once, at INFO with the count (the shards log only at DEBUG)."""
        if action not in ("retry", "delete"):
            raise BadRequest(f"no bulk action {action!r}: retry or delete")
        if state not in LISTS:
            raise BadRequest(f"no job list {state!r}: one of {', '.join(LISTS)}")
        if ids is not None:
            kinds = [parse_ident(ident) for ident in ids]
            if any(kind != "id" for kind, _ in kinds):
                raise BadRequest("a bulk action names jobs by their ids (UUIDs)")
            ids = [key for _, key in kinds]
        asked, narrowed = shard_filters(state, filters)
        answers = self._ask_all(["console", "bulk", action, who, queue, asked, ids, narrowed], PURGE_TIMEOUT)
        done = [answer for answer in answers.values() if answer is not None and "error" not in answer]
        if not done:
            self._raise_for(answers, "the bulk action")
            raise Unavailable("no shard answered")
        count = sum(int(answer["count"]) for answer in done)
        skipped = sum(int(answer.get("skipped", 0)) for answer in done)
        verb = "deleted" if action == "delete" else "retried"
        what = f"{len(ids)} selected" if ids is not None else describe_selection(queue, state, filters)
        silent = len(answers) - len(done)
        log.info("console: %s %s %d jobs (bulk: %s)%s%s", who, verb, count, what,
                 f"; {skipped} neither failed nor leased were left as they were" if skipped else "",
                 f"; {silent} shard(s) did not answer" if silent else "")
        message = f"{verb.capitalize()} {count} jobs"
        if skipped:
            message += f"; {skipped} neither failed nor leased were left as they were"
        if silent:
            message += f"; {silent} shard(s) did not answer, their jobs are untouched"
        return {"ok": not silent, "message": message, "count": count}

    def purge_queue(self, queue: str, who: str) -> ActionResult:
        answers = self._ask_all(["console", "jobs", queue, "ready", 0, 1])
        for shard, answer in sorted(answers.items()):
            if answer is not None and "error" not in answer:
                try:
                    return self._action(shard, ["console", "purge", queue, who], PURGE_TIMEOUT)
                except Unavailable as err:
                    raise Unavailable(f"the purge of {queue} did not finish in time; it may go on "
                                      f"({err.message})") from None
        self._raise_for(answers, f"queue {queue}")
        raise NotFound(f"no queue {queue!r}" + (f" on node {self.node}" if self.node else ""))

    # --------------------------------------------------------------- files
    def history_report(self) -> Optional[str]:
        place = self.config.console_history_report
        if not place:
            return None
        path = os.path.join(place, "report.html") if os.path.isdir(place) else place
        return os.path.abspath(path) if os.path.isfile(path) else None

    def token_names(self) -> Dict[str, str]:
        path = self.config.console_token_file
        if not path:
            return {}
        try:
            st = os.stat(path)
        except OSError as err:
            self._warn_tokens(path, f"cannot be read ({err.strerror or err})")
            return {}
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if self._tokens[0] == identity:
                return dict(self._tokens[1])
        tokens: Dict[str, str] = {}
        try:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    fields = line.split()
                    if not fields or fields[0].startswith("#"):
                        continue
                    if len(fields) != 2:
                        self._warn_tokens(path, f"line {number} is not `name token`; ignored")
                        continue
                    name, token = fields
                    tokens[token] = name
        except (OSError, UnicodeDecodeError) as err:
            self._warn_tokens(path, f"cannot be read ({err})")
            return {}
        with self._lock:
            self._tokens = (identity, tokens)
        return dict(tokens)

    def _warn_tokens(self, path: str, problem: str) -> None:
        message = f"console: token file {path} {problem}"
        if self._token_warned != message:
            self._token_warned = message
            log.warning("%s", message)


def _ranges(runs: Sequence[Sequence[int]]) -> str:
    """``[[start, end, ...], ...]`` (end exclusive) as ``"0-8191, 9000"``."""
    parts = []
    for run in runs:
        start, end = int(run[0]), int(run[1])
        parts.append(str(start) if end - start == 1 else f"{start}-{end - 1}")
    return ", ".join(parts)
