"""The console's renderers and its auth checks, called as plain functions on
hand-built records of :mod:`queueserver.console.model` (no server): every
page escapes what it shows, the chart keeps headroom, empty states say so,
pagination links stay in range, and the token and CSRF checks refuse what
they must.
"""
from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any, Dict, List, Optional

import pytest

from queueserver.console import pages
from queueserver.console.auth import CSRF_LIFETIME, Auth, same_origin
from queueserver.console.charts import HEIGHT, TOP, rate_chart
from queueserver.console.errors import Forbidden
from queueserver.console.layout import fmt_age, fmt_rate, nice_ceiling, url
from queueserver.console.model import ClusterView, JobDetail, JobPage, JobRow, QueueRow, RatePoint

EVIL = '<script>alert("x")</script>&"\''


def queue_row(name: str = "emails", **kw: Any) -> QueueRow:
    row: Dict[str, Any] = dict(name=name, node="", shard=0, ready=5, scheduled=1, leased=2, finished=3,
                               added_per_s=1.5, completed_per_s=1.0, failed_per_s=0.0, oldest_ready_age_s=12.0,
                               protocols=["workq"])
    row.update(kw)
    return row   # type: ignore[return-value]


def job_row(id: str = "7f3c0d2e-0000-4000-8000-000000000001", **kw: Any) -> JobRow:
    row: Dict[str, Any] = dict(id=id, number=7, queue="emails", state="ready", priority=0, attempts=0,
                               age_s=3.0, ttr_left_s=None, ttl_left_s=60.0, outcome=None, error=None)
    row.update(kw)
    return row   # type: ignore[return-value]


def detail(**kw: Any) -> JobDetail:
    d: Dict[str, Any] = dict(job=job_row(), node="", shard=0, payload_size=5, payload_text="hello",
                             payload_hex="68656c6c6f", result=None, max_attempts=None, lease=None, history=[],
                             extra={})
    d.update(kw)
    return d   # type: ignore[return-value]


def job_page(jobs: List[JobRow], total: int, page: int = 1, pages_: int = 1, per_page: int = 50,
             state: str = "ready", queue: str = "emails") -> JobPage:
    return {"queue": queue, "state": state, "page": page, "pages": pages_, "per_page": per_page, "total": total,
            "jobs": jobs}


class Parsed(HTMLParser):
    """The tags and text of a page (for checking it is whole HTML with no raw script)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: List[str] = []
        self.scripts: List[Dict[str, Optional[str]]] = []
        self.text: List[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: List[Any]) -> None:
        self.tags.append(tag)
        if tag == "script":
            self.scripts.append(dict(attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def only_our_script(html: str) -> None:
    parsed = Parsed(html)
    assert all(s.get("src") == "/static/console.js" for s in parsed.scripts), parsed.scripts
    assert "<script>alert" not in html


# ------------------------------------------------------------ escaping
def test_every_page_escapes_names_ids_payloads_and_messages():
    row = queue_row(EVIL, protocols=[EVIL])
    only_our_script(pages.overview([row], EVIL))
    only_our_script(pages.queue_page(job_page([job_row(EVIL, queue=EVIL)], 1, queue=EVIL), row, [], EVIL, EVIL))
    only_our_script(pages.job_page(detail(job=job_row(EVIL, queue=EVIL), payload_text=EVIL, result=EVIL,
                                          history=[EVIL], extra={EVIL: EVIL},
                                          lease={"connection": EVIL, "protocol": EVIL, "ttr_left_s": 1.0}),
                                   EVIL, EVIL))
    only_our_script(pages.search_page(EVIL, {"queues": [EVIL], "job": None}, EVIL))
    only_our_script(pages.error_page(404, EVIL, EVIL))
    only_our_script(pages.purge_confirm(EVIL, row, EVIL, EVIL))
    only_our_script(pages.cluster_page({"clustered": True, "moves": [{EVIL: EVIL}],
                                        "links": [{"source": EVIL, "target": EVIL, "state": EVIL}],
                                        "nodes": [{"name": EVIL, "host": EVIL, "up": True, "console": EVIL,
                                                   "shards": []}]}, EVIL))


def test_the_failed_workers_and_chart_pages_escape_what_clients_sent():
    """Errors, payload filters, addresses and protocols come from clients: escaped everywhere."""
    failed = job_row(EVIL, queue=EVIL, state="finished", outcome="failed", error=EVIL)
    shown = {"text": EVIL, "older": EVIL, "newer": EVIL, "priority": EVIL, "outcome": EVIL, "queue": EVIL}
    page_of = job_page([failed], 1, state="failed", queue=EVIL)
    only_our_script(pages.queue_page(page_of, queue_row(EVIL), [], EVIL, EVIL, shown=shown))
    only_our_script(pages.failed_page({**page_of, "queue": None}, EVIL, EVIL, shown))
    holder = {"address": EVIL, "protocol": EVIL, "client": EVIL, "via": EVIL, "left_s": 1.0}
    only_our_script(pages.workers_page({
        "connections": [{"router": EVIL, "connection": 1, "protocol": EVIL, "address": EVIL, "connected_s": 1.0,
                         "served_by": EVIL, "leases": 1}], "connections_total": 1,
        "leases": [{"job": job_row(EVIL, queue=EVIL, state="leased"), "shard": 0, "leased_s": 1.0,
                    "holder": holder}],
        "leases_total": 1, "leases_unknown": 0, "processes": [{"name": EVIL, "up": True, "connections": 1,
                                                               "leases": 1}]}, EVIL))
    only_our_script(pages.job_page(detail(job=job_row(state="leased", ttr_left_s=1.0), lease={
        "connection": EVIL, "protocol": EVIL, "ttr_left_s": 1.0, "client": EVIL, "via": EVIL, "leased_s": 2.0,
        "connected_s": 3.0, "left_s": 1.0}), EVIL, EVIL))
    assert EVIL not in pages.failed_page({**page_of, "queue": None}, "n", "c", shown)


def test_failed_lists_show_outcome_error_and_bulk_actions():
    failed = job_row("7f3c0d2e-0000-4000-8000-00000000000f", state="finished", outcome="failed",
                     error="HTTP 502 from the receiver")
    done = job_row("7f3c0d2e-0000-4000-8000-00000000000d", state="finished", outcome="completed")
    html = pages.queue_page(job_page([failed, done], 2, state="finished"), queue_row(), [], "n", "c")
    assert "HTTP 502 from the receiver" in html and ">failed</span>" in html and ">completed</span>" in html
    assert 'name=action value=retry-all' in html and 'name=action value=delete-all' in html
    assert html.count('type=checkbox name=id') == 2 and 'class=select-all' in html
    ready = pages.queue_page(job_page([job_row()], 1, state="ready"), queue_row(), [], "n", "c")
    assert "retry-all" not in ready and "delete-all" in ready   # nothing to retry among ready jobs
    assert "Outcome" not in ready


def test_queue_links_percent_encode_the_name():
    assert url("queues", "a/b c?") == "/queues/a%2Fb%20c%3F"
    assert url("queues", "q", state="ready", page=None) == "/queues/q?state=ready"
    html = pages.overview([queue_row("a/b")], "n")
    assert 'href="/queues/a%2Fb"' in html


# ------------------------------------------------------------ overview
def test_overview_rows_carry_sort_keys_and_bars():
    html = pages.overview([queue_row("big", ready=100), queue_row("small", ready=1, scheduled=0, leased=0,
                                                                   finished=0, oldest_ready_age_s=None)], "n")
    assert html.count("<tr data-queue=") == 2
    assert 'data-v="-1"' in html   # nothing ready: sorts below every age
    widths = [float(w) for w in re.findall(r'<i style="width:([0-9.]+)%', html)]
    assert max(widths) > 50 and min(widths) < 5   # bars against the widest queue
    assert 'id=live data-src="/api/queues?format=html"' in html
    assert "<th class=\"n sortable\" data-sort=\"num\">Ready</th>" in html


def test_overview_without_queues_says_so():
    html = pages.overview([], "n")
    assert "No queues yet" in html and "<table" not in html


def test_failed_and_leased_are_coloured():
    html = pages.queue_rows([queue_row(failed_per_s=2.0, leased=3)])
    assert 'class="n hot" data-v="2"' in html and 'class="n warm" data-v="3"' in html


# --------------------------------------------------------------- queue
def test_queue_page_lists_jobs_with_tabs_and_an_empty_state():
    row = queue_row()
    html = pages.queue_page(job_page([job_row()], 1), row, [], "n", "csrf")
    assert "7f3c0d2e-0000-4000-8000-000000000001" in html and "<td class=\"n\" data-v=\"7\">7</td>" in html
    for state in ("ready", "scheduled", "leased", "finished"):
        assert f"/queues/emails?state={state}" in html
    empty = pages.queue_page(job_page([], 0, state="leased"), row, [], "n", "csrf")
    assert "No jobs leased" in empty
    assert 'name="csrf" value="csrf"' in html and 'action="/queues/emails/purge"' in html


def test_pagination_links_stay_in_range():
    html = pages.queue_page(job_page([job_row()] * 50, 1000, page=1, pages_=20), None, [], "n", "c")
    assert "page=2" in html and "page=20" in html and "page=0" not in html and "page=21" not in html
    assert "1–50 of 1,000 jobs" in html
    last = pages.queue_page(job_page([job_row()] * 50, 1000, page=20, pages_=20), None, [], "n", "c")
    assert "page=19" in last and "page=21" not in last and "Next ›</span>" in last


def test_capped_page_size_is_said():
    html = pages.queue_page(job_page([], 0, per_page=100), None, [], "n", "c", capped=True)
    assert "At most 100 jobs a page" in html


# --------------------------------------------------------------- chart
def points(values: List[float]) -> List[RatePoint]:
    return [{"t": 1000.0 + 5 * i, "added": v, "completed": v / 2, "failed": 0.0} for i, v in enumerate(values)]


def test_chart_has_headroom_above_the_tallest_sample():
    svg = rate_chart(points([1, 40, 10, 5]))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    ys = [float(y) for y in re.findall(r"[ML][0-9.]+,([0-9.]+)", svg)]
    assert min(ys) >= TOP + (HEIGHT - TOP - 26) * 0.1   # the tallest sample stays below the top
    assert ">60<" in svg or ">50<" in svg   # a round top value


def test_chart_with_too_few_samples_says_so():
    assert "No rate samples yet" in rate_chart(points([3]))
    assert "No jobs added" in rate_chart(points([0, 0, 0]))


# ----------------------------------------------------------------- job
def test_job_page_has_text_and_hex_payload_and_actions():
    html = pages.job_page(detail(), "n", "c")
    assert "hello" in html and "68 65 6c 6c 6f" in html
    assert 'action="/jobs/7f3c0d2e-0000-4000-8000-000000000001/delete"' in html
    assert "requeue" not in html   # a ready job is not requeued
    leased = pages.job_page(detail(job=job_row(state="leased", ttr_left_s=4.0),
                                   lease={"connection": "127.0.0.1:5000", "protocol": "workq", "ttr_left_s": 4.0}),
                            "n", "c")
    assert "/requeue" in leased and "127.0.0.1:5000" in leased
    failed = pages.job_page(detail(job=job_row(state="finished"), extra={"outcome": "failed"}), "n", "c")
    completed = pages.job_page(detail(job=job_row(state="finished"), extra={"outcome": "completed"}), "n", "c")
    assert "/requeue" in failed and "/requeue" not in completed and ">failed</span>" in failed
    binary = pages.job_page(detail(payload_text=None, payload_hex="00ff"), "n", "c")
    assert "Not valid UTF-8" in binary and "id=pt-hex checked" in binary


def test_job_history_lines_or_why_none():
    assert "history is off" in pages.job_page(detail(), "n", "c")
    assert "added attempt 0" in pages.job_page(detail(history=["2026 added attempt 0 by workq"]), "n", "c")


# ------------------------------------------------------------- helpers
@pytest.mark.parametrize("seconds, text", [(None, "—"), (0.25, "250ms"), (42, "42s"), (192, "3m 12s"),
                                           (7500, "2h 05m"), (3 * 86400 + 4 * 3600, "3d 4h")])
def test_ages(seconds, text):
    assert fmt_age(seconds) == text


def test_rates_and_ceilings():
    assert [fmt_rate(x) for x in (0, 0.01, 0.5, 12.4, 340, 1234, 45000)] == \
           ["0", "<0.1", "0.5", "12", "340", "1.2k", "45k"]
    assert [nice_ceiling(x) for x in (0.3, 1, 3, 7, 11, 230)] == [0.5, 1, 5, 10, 20, 250]


def test_error_page_shows_status_and_message_only():
    html = pages.error_page(503, "shard 1 did not answer", "n")
    assert "503" in html and "Shard 1 did not answer." in html and "Traceback" not in html


def test_cluster_page_of_a_single_node():
    view: ClusterView = {"clustered": False, "moves": [], "links": [],
                         "nodes": [{"name": "local", "host": "127.0.0.1", "up": True, "console": "",
                                    "shards": [{"shard": 0, "name": "0", "up": True, "jobs": 3, "queues": 1,
                                                "slots": "", "role": "primary", "lag": None}]}]}
    html = pages.cluster_page(view, "n")
    assert "A single node" in html and "No moves in progress" in html and "primary" in html


# ---------------------------------------------------------------- auth
class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_tokens_name_who_acts():
    auth = Auth(lambda: {"s3cret": "alice", "other": "bob"}, b"k")
    assert auth.who("s3cret") == "alice" and auth.who("other") == "bob"
    assert auth.who("s3cre") is None and auth.who("") is None and auth.who(None) is None
    assert Auth(lambda: {}, b"k").who("") is None


def test_csrf_tokens_are_ours_and_expire():
    clock = Clock()
    auth = Auth(lambda: {}, b"key", clock)
    token = auth.csrf_token()
    assert auth.csrf_valid(token)
    assert not Auth(lambda: {}, b"another", clock).csrf_valid(token)   # another process's
    assert not auth.csrf_valid(token.replace(".", ".0")) and not auth.csrf_valid("") and not auth.csrf_valid(None)
    assert not auth.csrf_valid("\u00b2.ab") and not auth.csrf_valid("9" * 40 + ".ab")
    clock.now += CSRF_LIFETIME + 1
    assert not auth.csrf_valid(token)


def test_a_form_post_needs_csrf_and_same_origin_a_header_call_does_not():
    auth = Auth(lambda: {"s3cret": "alice"}, b"k")
    same = {"host": "127.0.0.1:9000", "origin": "http://127.0.0.1:9000"}
    form = {"token": "s3cret", "csrf": auth.csrf_token()}
    assert auth.authorize(same, form) == "alice"
    with pytest.raises(Forbidden, match="not posted from"):
        auth.authorize({"host": "127.0.0.1:9000", "origin": "http://evil.example"}, form)
    with pytest.raises(Forbidden, match="not posted from"):
        auth.authorize({"host": "127.0.0.1:9000"}, form)   # neither Origin nor Referer
    with pytest.raises(Forbidden, match="expired"):
        auth.authorize(same, {"token": "s3cret"})
    with pytest.raises(Forbidden, match="not valid"):
        auth.authorize(same, {**form, "token": "wrong"})
    assert auth.authorize({"x-queueserver-token": "s3cret"}, {}) == "alice"
    with pytest.raises(Forbidden, match="not valid"):
        auth.authorize({"x-queueserver-token": "nope"}, {})
    with pytest.raises(Forbidden, match="turned off"):
        Auth(lambda: {}, b"k").authorize({"x-queueserver-token": "s3cret"}, {})


def test_same_origin_by_referer_when_there_is_no_origin():
    assert same_origin({"host": "h:1", "referer": "http://h:1/jobs/x"})
    assert not same_origin({"host": "h:1", "referer": "http://h:2/jobs/x"})
    assert not same_origin({"host": "h:1", "origin": "null"})
    assert not same_origin({"host": "h:1", "origin": "javascript://h:1"})


# ------------------------------------------------------------ the app
class Broken:
    """A source whose every read fails as a bug would (for the app's last line of defence)."""

    def token_names(self) -> Dict[str, str]:
        return {}

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise KeyError("internal detail")
        return fail


def test_a_bug_is_a_500_page_without_a_traceback(caplog):
    from queueserver.console.app import ConsoleApp
    app = ConsoleApp(Broken(), "n")   # type: ignore[arg-type]
    answer = app.handle("GET", "/", {})
    assert answer.status == 500 and b"Traceback" not in answer.body and b"internal detail" not in answer.body
    assert "Traceback" in caplog.text   # the log has it
    answer = app.handle("GET", "/api/queues", {})
    assert answer.status == 500 and answer.content_type == "application/json"
    assert app.handle("GET", "/jobs/x/delete", {}).status == 405
    answer = app.handle("POST", "/cluster", {})
    assert answer.status == 405 and ("Allow", "GET, HEAD") in answer.headers
    assert app.handle("GET", "/jobs/%C2%B2", {}).status == 400   # a superscript two is no number
    assert app.handle("GET", "/queues/q?page=%C2%B2", {}).status == 400
    assert app.handle("GET", "/static/console.js", {}).status == 200
