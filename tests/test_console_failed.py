"""Failed (dead) jobs on the console, on a real durable server (two shards, workq):
the finished list tells completed from failed jobs (outcome and error
columns), ``?state=failed`` lists a queue's failed jobs and ``/failed``
every queue's, both filtered by outcome, age, priority and payload text,
and many jobs are retried or deleted at once with the token (picked on
the page, or all that match), each such action logged once with its
count. Over plain HTTP, and in a real browser for what a person does.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from browser import screenshot
from serverproc import Answer, HttpNode, ServerProcess, wait_for
from wire import Wire, add, names_on_distinct_shards

TOKEN = "tok-" + uuid.uuid4().hex

class Node(HttpNode):
    """The console's port, with the failed lists' and bulk actions' helpers."""

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def bulk(self, path: str, fields: List[Tuple[str, str]], token: Optional[str] = TOKEN) -> Answer:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if token is not None:
            headers["X-Queueserver-Token"] = token
        return self.request("POST", path, urlencode(fields).encode(), headers)

    def listed(self, path: str) -> List[str]:
        """The ids a list page shows, in order."""
        status, _, body = self.get(path)
        assert status == 200, (path, body[:300])
        return re.findall(r'<tr data-job="([^"]+)"', body.decode())

    def state(self, id: str) -> Optional[str]:
        status, _, body = self.get(f"/api/job?id={id}")
        return json.loads(body)["job"]["state"] if status == 200 else None

    def jobs(self, queue: str, spec: List[Tuple[str, int, bytes]]) -> Dict[str, str]:
        """Add one job per ``(outcome, priority, payload)``, lease each and finish it so:
        ``failed <error>`` (one attempt), ``completed``, or ``ready`` (left alone); id -> outcome."""
        made: Dict[str, str] = {str(uuid.uuid4()): outcome for outcome, _, _ in spec}
        w = Wire(self.proc.connect("workq"))

        def put(id: str, priority: int, payload: bytes) -> None:
            flags = f"-priority={priority} -max-attempts=1" if priority else "-max-attempts=1"
            assert w.call(add(id, queue, payload, 60_000, 3_600_000, flags)) == b"+OK\r\n"
        try:
            jobs = list(zip(made, spec))
            for id, (outcome, priority, payload) in jobs:   # the ones to finish first (leases take them all)
                if outcome != "ready":
                    put(id, priority, payload)
            for id, outcome in made.items():
                if outcome == "ready":
                    continue
                reply = w.call(f"lease {queue} 1000\r\n".encode())
                got = reply.split(b"\r\n")[1].split(b" ")[0].decode()
                error = f"HTTP 502 from {got[:8]}".encode()
                if made[got] == "failed":
                    assert w.call(f"fail {got} {len(error)}\r\n".encode() + error + b"\r\n") == b"+OK\r\n"
                else:
                    assert w.call(f"complete {got} 2\r\nok\r\n".encode()) == b"+OK\r\n"
            for id, (outcome, priority, payload) in jobs:
                if outcome == "ready":
                    put(id, priority, payload)
        finally:
            w.close()
        return made


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    home = tmp_path_factory.mktemp("console-failed")
    (home / "tokens").write_text(f"ops {TOKEN}\n")
    (home / "qs.toml").write_text(f'[console]\ntoken_file = "{home / "tokens"}"\n')
    # durable, with its job history: a bulk action's batches wait for the log, and the history names the console
    with ServerProcess(shards=2, protocols=["workq"],
                       extra=["--config", str(home / "qs.toml"), "--data-dir", str(home / "data")]) as proc:
        yield Node(proc)


def q(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# ------------------------------------------------------------ the lists
def test_finished_jobs_show_their_outcome_and_failed_ones_their_error(node):
    queue = q("outcomes")
    made = node.jobs(queue, [("failed", 0, b"a"), ("completed", 0, b"b"), ("failed", 0, b"c"),
                             ("completed", 0, b"d")])
    failed = [id for id, outcome in made.items() if outcome == "failed"]
    status, _, body = node.get(f"/queues/{queue}?state=finished")
    assert status == 200
    page = body.decode()
    for id, outcome in made.items():
        row = re.search(rf'<tr data-job="{id}">(.*?)</tr>', page).group(1)
        assert f">{outcome}</span>" in row                              # the outcome column
        assert (f"HTTP 502 from {id[:8]}" in row) == (outcome == "failed")   # the error column
    status, _, body = node.get(f"/queues/{queue}?state=failed")   # was a 400
    assert status == 200, body[:300]
    assert node.listed(f"/queues/{queue}?state=failed") == failed
    assert re.search(rb'class="on"[^>]*>Failed<span class=count>2</span>', body)
    assert node.listed(f"/queues/{queue}?state=finished&outcome=completed") == [
        id for id, outcome in made.items() if outcome == "completed"]


def test_lists_are_filtered_by_age_priority_and_payload_text(node):
    queue = q("filters")
    made = node.jobs(queue, [("failed", 5, b'{"to": "alice@example.com"}'), ("failed", 0, b'{"to": "bob"}'),
                             ("failed", 5, b'{"to": "carol"}'), ("ready", 5, b'{"to": "alice@example.org"}')])
    ids = list(made)
    assert node.listed(f"/queues/{queue}?state=failed&priority=5") == [ids[0], ids[2]]
    assert node.listed(f"/queues/{queue}?state=failed&text=alice") == [ids[0]]
    assert node.listed(f"/queues/{queue}?state=failed&text=502") == ids[:3]   # the error's text too
    assert node.listed(f"/queues/{queue}?state=ready&text=alice") == [ids[3]]  # any list
    assert node.listed(f"/queues/{queue}?state=failed&newer=1h") == ids[:3]
    assert node.listed(f"/queues/{queue}?state=failed&older=1h") == []
    assert node.listed(f"/queues/{queue}?state=failed&older=0s&priority=0&text=bob") == [ids[1]]
    for bad in ("older=soon", "newer=-5m", "priority=high", "outcome=lost", "state=dead"):
        status, _, body = node.get(f"/queues/{queue}?state=failed&{bad}".replace("state=failed&state", "state"))
        assert status == 400 and b"Traceback" not in body, (bad, body[:200])


def test_every_queues_failed_jobs_on_one_page_across_shards(node):
    first, second = names_on_distinct_shards(2, 2)
    on_second = node.jobs(second, [("failed", 0, b"x")] * 2)
    made = {**node.jobs(first, [("failed", 0, b"x")] * 3 + [("completed", 0, b"y")]), **on_second}
    mine = {id for id, outcome in made.items() if outcome == "failed"}
    listed = set(node.listed("/failed?text=x&per_page=100"))
    assert mine <= listed and not (set(made) - mine) & listed
    # pages across the shards: each job once
    paged: List[str] = []
    for number in range(1, 10):
        status, _, body = node.get(f"/failed?queue=&per_page=2&page={number}&text=x")
        if status == 400:
            break
        paged += re.findall(r'<tr data-job="([^"]+)"', body.decode())
    assert sorted(paged) == sorted(listed) and len(paged) == len(set(paged))
    assert set(node.listed(f"/failed?queue={second}")) == set(on_second)   # narrowed to one queue
    status, _, _ = node.get("/failed?queue=no-such-queue")
    assert status == 404


# ------------------------------------------------------------ bulk actions
def bulk_lines(log: str, verb: str) -> List[str]:
    return [line for line in log.splitlines() if f"console: ops {verb} " in line and "(bulk:" in line]


def test_bulk_retry_and_delete_with_the_token_each_logged_once(node):
    queue = q("bulk")
    made = node.jobs(queue, [("failed", 0, b"old"), ("failed", 0, b"old"), ("failed", 0, b"new"),
                             ("completed", 0, b"new"), ("ready", 0, b"new")])
    ids = list(made)
    path = f"/queues/{queue}/bulk"
    before = len(node.proc.log())
    # no token: refused, nothing changes
    status, _, body = node.bulk(path, [("action", "retry-all"), ("state", "failed")], token=None)
    assert status == 403 and json.loads(body)["error"].startswith("Token missing")
    status, _, body = node.bulk(path, [("action", "retry"), ("state", "failed")])   # nothing picked
    assert status == 400
    assert node.listed(f"/queues/{queue}?state=failed") == ids[:3]
    # retry all failed jobs whose payload says "old": two, back to ready
    status, headers, body = node.bulk(path, [("action", "retry-all"), ("state", "failed"), ("text", "old")])
    assert status == 200 and headers["content-type"] == "application/json", body[:300]
    assert json.loads(body)["count"] == 2
    assert [node.state(id) for id in ids[:3]] == ["ready", "ready", "finished"]

    def history(id: str) -> List[str]:
        return json.loads(node.get(f"/api/job?id={id}")[2])["history"]
    wait_for(lambda: any("retried" in line and "console (ops)" in line for line in history(ids[0])), 10,
             lambda: f"the retry in the job's history: {history(ids[0])}")
    # delete picked jobs: one failed, one completed, one unknown id (on no shard)
    status, _, body = node.bulk(path, [("action", "delete"), ("state", "finished"), ("id", ids[2]),
                                       ("id", ids[3]), ("id", str(uuid.uuid4()))])
    assert status == 200 and json.loads(body)["count"] == 2
    assert node.state(ids[2]) is None and node.state(ids[3]) is None
    # retry picked jobs of which one is neither failed nor leased: left as it was, and said
    status, _, body = node.bulk(path, [("action", "retry"), ("state", "ready"), ("id", ids[4])])
    assert status == 200 and json.loads(body)["count"] == 0 and "left as they were" in json.loads(body)["message"]
    wait_for(lambda: len(bulk_lines(node.proc.log()[before:], "deleted")) >= 1, 10, "the bulk delete's log line")
    log = node.proc.log()[before:]
    retried, deleted = bulk_lines(log, "retried"), bulk_lines(log, "deleted")
    assert len(retried) == 2 and "retried 2 jobs" in retried[0] and "text 'old'" in retried[0], retried
    assert len(deleted) == 1 and "deleted 2 jobs" in deleted[0], deleted   # once, with its count
    assert "console: ops deleted job" not in log   # not once per job


def test_failed_jobs_retried_and_deleted_in_the_browser(node, page):
    queue = q("browser")
    made = node.jobs(queue, [("failed", 0, b'{"order": %d}' % i) for i in range(5)] + [("completed", 0, b"{}")])
    failed = [id for id, outcome in made.items() if outcome == "failed"]
    page.on("dialog", lambda dialog: dialog.accept())   # the "all" buttons ask first
    page.goto(node.origin + "/")
    page.click("nav.main a:has-text('Failed')")
    page.wait_for_url(re.compile(r"/failed$"))
    page.fill("form.filters input[name=queue]", queue)
    page.click("form.filters button:has-text('Filter')")
    page.wait_for_url(re.compile(r"/failed\?"))
    expect(page.locator("#jobs tbody tr")).to_have_count(5)
    for id in failed:
        assert "HTTP 502 from" in page.locator(f'tr[data-job="{id}"]').inner_text()
    screenshot(page, "console-failed")
    page.check(f'tr[data-job="{failed[0]}"] input[name=id]')
    page.check(f'tr[data-job="{failed[1]}"] input[name=id]')
    page.fill("#bulk input[name=token]", TOKEN)
    page.click("#bulk button:has-text('Retry selected')")
    page.wait_for_url(re.compile(r"notice=retried-many"))
    assert "Retried 2 jobs." in page.inner_text(".flash")
    expect(page.locator("#jobs tbody tr")).to_have_count(3)
    assert node.state(failed[0]) == "ready" and node.state(failed[1]) == "ready"
    screenshot(page, "console-failed-retried")
    # the queue's own failed list: pick every job of the page with the head box, then delete all of the list
    page.goto(f"{node.origin}/queues/{queue}?state=failed")
    expect(page.locator("#jobs tbody tr")).to_have_count(3)
    page.check("#jobs th input.select-all")
    assert page.locator("#jobs tbody input[name=id]:checked").count() == 3
    page.fill("#bulk input[name=token]", TOKEN)
    page.click("#bulk button:has-text('Delete all 3')")
    page.wait_for_url(re.compile(r"notice=deleted-many"))
    assert "Deleted 3 jobs." in page.inner_text(".flash")
    assert "No failed jobs" in page.inner_text("#jobs")
    assert all(node.state(id) is None for id in failed[2:])
    screenshot(page, "console-failed-deleted")
