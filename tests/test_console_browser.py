"""The web console in a real browser (Debian's Chromium driven by Playwright).

One real server (2 shards, workq and takeanumber, durable with its job
history, a token file and a history report named by its config) for the
module; jobs are added over workq and takeanumber, and each test drives the
pages a user would: the
overview (live, sortable), the search box with a job id and a number, a
queue's page, a job's page, deleting with the token through the form and
being refused without it or with a wrong one, a purge through its
confirmation step, the cluster page, the error pages, and a cluster of two
nodes (a job found through the other node's console). Every page is
saved under ``test-artifacts/screenshots/console-*.png`` for a person to
look at.
"""
from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Dict, Iterator, List

import pytest
from playwright.sync_api import expect

from queueserver.client import Client

from browser import screenshot
from serverproc import ServerProcess, wait_for

TOKEN = "tok-" + uuid.uuid4().hex
SHARDS = 2


class Console:
    """The server under test and what was added to it."""

    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.base = f"http://{proc.host}:{proc.ports['metrics']}"
        self.emails: List[str] = []
        self.reports: List[str] = []

    def url(self, path: str) -> str:
        return self.base + path

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url(path), timeout=10) as answer:
            return json.loads(answer.read())

    def row(self, name: str) -> Dict[str, Any]:
        return next(r for r in self.api("/api/queues")["queues"] if r["name"] == name)

    def add_workq(self, queue: str, count: int) -> List[str]:
        ids = [str(uuid.uuid4()) for _ in range(count)]
        with Client(self.proc.host, self.proc.port("workq")) as client:
            pipe = client.pipeline()
            for i, id in enumerate(ids):
                pipe.add(id, queue, json.dumps({"to": f"user{i}@example.com", "template": "welcome"}),
                         60_000, 3_600_000)
            assert pipe.execute() == [None] * count
        return ids

    def add_takeanumber(self, queue: str, count: int) -> List[str]:
        ids = []
        with socket.create_connection((self.proc.host, self.proc.port("takeanumber")), timeout=10) as sock:
            reader = sock.makefile("rb")
            for i in range(count):
                sock.sendall(b"ADD %s 3 monthly report %d\r\n" % (queue.encode(), i))
                line = reader.readline()
                assert line.startswith(b"+"), line
                ids.append(line[1:].strip().decode())
        return ids


def traffic(proc: ServerProcess, stop: threading.Event) -> None:
    """A busy queue for the charts: jobs added at a rate that rises and falls,
    most leased and completed, one in eight failed, a few left leased."""
    with Client(proc.host, proc.port("workq")) as client:
        tick = 0
        while not stop.wait(0.1):
            tick += 1
            pipe = client.pipeline()
            for _ in range(2 + int(3 * (1 + math.sin(tick / 15)))):
                pipe.add(str(uuid.uuid4()), "webhooks", b'{"event": "order.paid"}', 60_000, 3_600_000)
            pipe.execute()
            for i in range(2 + tick % 3):
                try:
                    job = client.lease("webhooks", wait_timeout=10)
                except Exception:
                    break
                if (tick + i) % 8 == 0:
                    client.fail(job.id, b"HTTP 502 from the receiver")
                elif (tick + i) % 13 != 0:   # some stay leased
                    client.complete(job.id, b"HTTP 200")


@pytest.fixture(scope="module")
def console(tmp_path_factory) -> Iterator[Console]:
    home = tmp_path_factory.mktemp("console")
    (home / "tokens").write_text(f"# name token\nalice {TOKEN}\n")
    (home / "report.html").write_text("<!doctype html><title>history report</title><h1>History report</h1>")
    config = home / "queueserver.toml"
    config.write_text(f'[console]\ntoken_file = "{home / "tokens"}"\nhistory_report = "{home / "report.html"}"\n')
    proc = ServerProcess(shards=SHARDS, protocols=["workq", "takeanumber"], extra=["--config", str(config), "--data-dir", str(home / "data")])
    with proc:
        c = Console(proc)
        c.emails = c.add_workq("emails", 12)
        c.add_workq("thumbnails", 4)
        c.add_workq("bulk", 130)
        c.reports = c.add_takeanumber("reports", 3)
        stop = threading.Event()
        busy = threading.Thread(target=traffic, args=(proc, stop), daemon=True)
        busy.start()
        wait_for(lambda: {"emails", "thumbnails", "bulk", "reports", "webhooks"}
                 <= {r["name"] for r in c.api("/api/queues")["queues"]}, 20, "the queues on /api/queues")
        try:
            yield c
        finally:
            stop.set()
            busy.join(10)


def rendered_count(page, queue: str, column: int) -> str:   # type: ignore[no-untyped-def]
    return str(page.locator(f'tr[data-queue="{queue}"] td').nth(column).inner_text()).strip()


READY = 2   # the overview's columns: queue, depth, ready, ...


# ----------------------------------------------------------------- overview
def test_overview_lists_every_queue_with_its_counts(console, page):
    page.goto(console.url("/"))
    assert rendered_count(page, "bulk", READY) == "130"
    for queue in ("emails", "thumbnails", "reports"):   # other tests may have changed them (any order)
        assert rendered_count(page, queue, READY) == str(console.row(queue)["ready"])
    assert "takeanumber" in page.locator('tr[data-queue="reports"]').inner_text()
    assert "workq" in page.locator('tr[data-queue="emails"]').inner_text()


def test_overview_refreshes_itself_and_sorts(console, page):
    page.goto(console.url("/"))
    page.evaluate("window.sameDocument = true")
    page.locator("th", has_text="Ready").first.click()   # numbers sort largest first

    def ready_column() -> List[float]:
        return [float(v) for v in page.locator(f"tbody tr td:nth-child({READY + 1})").evaluate_all(
            "cells => cells.map(c => c.dataset.v)")]

    assert ready_column() == sorted(ready_column(), reverse=True)
    before = console.row("thumbnails")["ready"]
    console.add_workq("thumbnails", 2)
    expect(page.locator('tr[data-queue="thumbnails"] td').nth(READY)).to_have_text(str(before + 2),
                                                                                  timeout=15_000)
    assert page.evaluate("window.sameDocument") is True   # no reload: the rows were swapped in
    assert ready_column() == sorted(ready_column(), reverse=True)   # the sort was kept
    assert page.locator("th.sorted-desc").inner_text().strip().lower() == "ready"
    page.locator("th", has_text="Queue").first.click()
    names = [r.get_attribute("data-queue") for r in page.locator("tbody tr").all()]
    assert names == sorted(names)


@pytest.mark.parametrize("width", [1920, 1280])
def test_the_overview_table_fits_the_window_with_no_sideways_scroll(console, browser, width):
    """Every column, the shard last, is in sight at a desktop's width: the
    table's card does not scroll sideways (a long queue name is cut with an
    ellipsis; the protocols wrap)."""
    name = "notifications-for-customers-in-europe-west-" + "x" * 40
    console.add_workq(name, 2)
    console.add_takeanumber(name, 1)
    context = browser.new_context(viewport={"width": width, "height": 1080})
    try:
        tab = context.new_page()
        tab.goto(console.url("/"))
        expect(tab.locator(f'tr[data-queue="{name}"]')).to_have_count(1)
        fit = tab.evaluate("""() => {
            const card = document.querySelector('#live .card.flush');
            const shard = [...card.querySelectorAll('thead th')].pop();
            return {scroll: card.scrollWidth, client: card.clientWidth, label: shard.textContent,
                    right: shard.getBoundingClientRect().right, edge: card.getBoundingClientRect().right,
                    window: window.innerWidth, page: document.documentElement.scrollWidth};
        }""")
        assert fit["label"].strip().lower() == "shard"
        assert fit["scroll"] <= fit["client"], fit                       # no scrollbar in the card
        assert fit["right"] <= fit["edge"] <= fit["window"], fit          # the last column in sight
        assert fit["page"] <= fit["window"], fit                          # nor in the page
        screenshot(tab, f"console-overview-{width}")
    finally:
        context.close()


def test_search_finds_a_job_by_id_and_by_number(console, page):
    id = console.emails[3]
    page.goto(console.url("/"))
    page.fill("form.search input[name=q]", id)
    page.press("form.search input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"/jobs/"))
    assert id in page.locator("h1").inner_text()
    number = console.api(f"/api/job?id={id}")["job"]["number"]
    assert isinstance(number, int)
    page.fill("form.search input[name=q]", str(number))
    page.press("form.search input[name=q]", "Enter")
    page.wait_for_url(re.compile(rf"/jobs/{id}"))
    assert "emails" in page.locator(".crumbs").inner_text()
    page.fill("form.search input[name=q]", "mail")
    page.press("form.search input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"/search\?q=mail"))
    assert page.locator("a", has_text="emails").count() >= 1
    screenshot(page, "console-search")


# ------------------------------------------------------------ queue and job
def test_queue_page_lists_its_jobs_with_a_chart(console, page):
    page.goto(console.url("/queues/emails"))
    assert page.locator("h1").inner_text() == "emails"
    ids = [t.strip() for t in page.locator("table tbody td.id").all_inner_texts()]
    assert set(console.emails) <= set(ids)
    assert page.locator("#chart").count() == 1
    screenshot(page, "console-queue-emails")
    page.goto(console.url("/queues/emails?state=leased"))
    assert "No jobs leased" in page.inner_text("main")
    screenshot(page, "console-queue-empty")


def test_a_long_queue_is_paginated_and_per_page_is_capped(console, page):
    page.goto(console.url("/queues/bulk"))
    assert page.locator("table tbody tr").count() == 50
    page.locator(".pager a", has_text="Next").click()
    page.wait_for_url(re.compile(r"page=2"))
    assert page.locator("table tbody tr").count() == 50
    response = page.goto(console.url("/queues/bulk?per_page=1000000"))
    assert response.status == 200
    assert page.locator("table tbody tr").count() == 100
    assert "At most 100 jobs a page" in page.inner_text("main")
    screenshot(page, "console-queue-paginated")


def test_job_page_shows_the_payload_as_text_and_hex(console, page):
    id = console.emails[0]
    page.goto(console.url(f"/jobs/{id}"))
    text = page.inner_text("main")
    assert id in text and "emails" in text and "READY" in text.upper()
    assert "user0@example.com" in page.locator(".p-text").inner_text()
    assert not page.locator(".p-hex").is_visible()
    screenshot(page, "console-job")
    page.click("label[for=pt-hex]")
    assert page.locator(".p-hex").is_visible()
    assert "7b 22 74 6f" in page.locator(".p-hex").inner_text()   # {"to
    screenshot(page, "console-job-hex")


def test_a_takeanumber_job_with_its_lease(console, page):
    with socket.create_connection((console.proc.host, console.proc.port("takeanumber")), timeout=10) as sock:
        sock.sendall(b"RESERVE reports\r\n")
        line = sock.makefile("rb").readline()
        id = line[1:].split(b" ")[0].decode()
        page.goto(console.url(f"/jobs/{id}"))
        assert "LEASED" in page.inner_text("main").upper()
        host, port = sock.getsockname()[:2]
        lease = page.locator("#lease").inner_text()   # the holder is known at once, history or not
        assert "takeanumber" in lease and f"{host}:{port}" in lease

        def history_names_the_lease() -> bool:   # the history line is written a moment later
            page.reload()
            return "leased" in page.locator("#history").inner_text()

        wait_for(history_names_the_lease, 15, "the lease's line in the job's history")
        screenshot(page, "console-job-leased")


# ------------------------------------------------------------------ actions
def test_delete_with_the_token_and_the_count_falls(console, page):
    before = console.row("emails")["ready"]
    id = console.emails.pop()
    page.goto(console.url(f"/jobs/{id}"))
    page.fill("form[action$='/delete'] input[name=token]", TOKEN)
    page.click("button:has-text('Delete job')")
    page.wait_for_url(re.compile(r"/queues/emails\?notice=deleted"))
    assert f"Deleted job {id}" in page.inner_text(".flash")
    assert page.locator("a.tile", has_text="Ready").locator(".v").inner_text() == str(before - 1)
    screenshot(page, "console-deleted")
    assert console.row("emails")["ready"] == before - 1
    page.goto(console.url("/"))
    assert rendered_count(page, "emails", READY) == str(before - 1)
    missing = page.goto(console.url(f"/jobs/{id}"))
    assert missing.status == 404


def test_actions_are_refused_without_the_token(console, page):
    id = console.emails[1]
    page.goto(console.url(f"/jobs/{id}"))
    page.fill("form[action$='/delete'] input[name=token]", "not-the-token")
    with page.expect_navigation():
        page.click("button:has-text('Delete job')")
    assert "403" in page.inner_text(".code")
    assert "not valid" in page.inner_text("main")
    screenshot(page, "console-forbidden")
    page.goto(console.url(f"/jobs/{id}"))
    page.evaluate("document.querySelectorAll('input[name=token]').forEach(i => i.required = false)")
    with page.expect_navigation():
        page.click("button:has-text('Delete job')")
    assert "403" in page.inner_text(".code") and "needs a token" in page.inner_text("main")
    assert console.api(f"/api/job?id={id}")["job"]["id"] == id   # still there
    response = page.goto(console.url(f"/jobs/{id}/delete"))     # an action by a link: never
    assert response.status == 405


def test_purge_goes_through_a_confirmation_step(console, page):
    assert console.row("thumbnails")["ready"] > 0
    page.goto(console.url("/queues/thumbnails"))
    page.fill("form[action$='/purge'] input[name=token]", TOKEN)
    page.click("form[action$='/purge'] button")
    page.wait_for_url(re.compile(r"/queues/thumbnails/purge"))
    assert "Purge thumbnails?" in page.inner_text("h1")
    assert console.row("thumbnails")["ready"] > 0   # nothing yet
    screenshot(page, "console-purge-confirm")
    page.fill("input[name=confirm]", "thumbnail")   # typed wrong: nothing happens
    page.fill("form[action$='/purge'] input[name=token]", TOKEN)
    page.click("form[action$='/purge'] button.danger")
    assert "does not match" in page.inner_text("main")
    assert console.row("thumbnails")["ready"] > 0
    page.fill("input[name=confirm]", "thumbnails")
    page.fill("form[action$='/purge'] input[name=token]", TOKEN)
    page.click("form[action$='/purge'] button.danger")
    page.wait_for_url(re.compile(r"notice=purged"))
    assert "Purged" in page.inner_text(".flash")
    assert "No jobs ready" in page.inner_text("main")
    screenshot(page, "console-purged")
    wait_for(lambda: all(r["ready"] == 0 for r in console.api("/api/queues")["queues"]
                         if r["name"] == "thumbnails"), 10, "thumbnails to be empty")


# ------------------------------------------------------- cluster, history
def test_cluster_page(console, page):
    page.goto(console.url("/"))
    page.click("nav.main a:has-text('Cluster')")
    page.wait_for_url(re.compile(r"/cluster$"))
    assert page.locator("h1").inner_text() == "Cluster"
    assert page.locator("table").first.locator("tbody tr").count() == SHARDS
    screenshot(page, "console-cluster")


def test_history_report_is_linked_and_served(console, page):
    page.goto(console.url("/queues/emails"))
    page.click("a:has-text('History report')")
    page.wait_for_url(re.compile(r"/history/report$"))
    assert page.locator("h1").inner_text() == "History report"


# ------------------------------------------------------------ bad input
def test_error_pages(console, page):
    response = page.goto(console.url("/queues/no-such-queue"))
    assert response.status == 404
    assert "404" in page.inner_text(".code")
    assert "Traceback" not in page.content()
    screenshot(page, "console-not-found")
    response = page.goto(console.url("/jobs/not-a-job-id"))
    assert response.status == 400
    assert "not a job id" in page.inner_text("main")
    screenshot(page, "console-bad-request")
    response = page.goto(console.url("/queues/emails?state=lost"))
    assert response.status == 400
    response = page.goto(console.url("/no/such/page"))
    assert response.status == 404


# ------------------------------------------------------------- last: rates
def test_a_busy_queue_charts_its_rates(console, page):
    """Last in the module, so the node has sampled the busy queue's rates a few times."""
    wait_for(lambda: len(console.api("/api/queues/webhooks/rates")["rates"]) >= 4, 30, "four rate samples")
    page.goto(console.url("/queues/webhooks"))
    assert page.locator("#chart svg path").count() >= 3   # added, completed, failed
    with page.expect_response(re.compile(r"/api/series\?queue=webhooks&range=1h&format=html")) as refreshed:
        pass   # the chart asks again on its own within 2 s
    assert refreshed.value.status == 200
    screenshot(page, "console-queue")
    page.goto(console.url("/queues/webhooks?state=leased"))
    screenshot(page, "console-queue-leased")
    page.goto(console.url("/"))
    page.wait_for_timeout(2500)   # one live refresh
    assert float(page.locator('tr[data-queue="webhooks"] td').nth(6).get_attribute("data-v")) > 0   # added/s
    screenshot(page, "console-overview")


def test_the_overview_charts_throughput_and_jobs_held_over_long_ranges(console, page):
    """The node's throughput and its jobs by state over time, on the overview,
    for ranges past the last 30 minutes; a queue's own jobs held on its page."""
    wait_for(lambda: len(console.api("/api/series?range=1h")["points"]) >= 4, 30, "four samples")
    series = console.api("/api/series?range=1h")
    assert series["step"] == 5 and series["range"] == "1h"
    last = series["points"][-1]
    assert last["added"] > 0 and last["depth"] > 0
    assert last["depth"] == last["ready"] + last["scheduled"] + last["leased"] + last["finished"]
    queue = console.api("/api/series?queue=webhooks&range=24h")["points"]
    assert queue and queue[-1]["depth"] > 0 and queue[-1]["ready"] is None
    assert urllib.request.urlopen(console.url("/api/series?range=7d"), timeout=10).status == 200
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(console.url("/api/series?range=2y"), timeout=10)
    assert bad.value.code == 400

    page.goto(console.url("/"))
    charts = page.locator("#charts")
    assert charts.locator("svg").count() == 2   # throughput, and jobs held
    assert charts.locator("svg").first.locator("path").count() >= 3
    for state in ("Ready", "Scheduled", "Leased", "Finished"):
        assert charts.locator("svg").nth(1).locator(f"path:has(title:text-is('{state}'))").count() >= 1
    charts.locator("nav.ranges a", has_text="24h").click()
    page.wait_for_url(re.compile(r"\?range=24h$"))
    assert page.locator("#charts nav.ranges b").inner_text() == "24h"
    assert page.locator("#charts svg").count() == 2
    with page.expect_response(re.compile(r"/api/series\?range=24h&format=html")) as refreshed:
        pass   # the charts ask again on their own within 2 s
    assert refreshed.value.status == 200
    screenshot(page, "console-overview-charts")
    page.goto(console.url("/queues/webhooks?range=6h"))
    assert page.locator("#charts nav.ranges b").inner_text() == "6h"
    assert page.locator("#charts svg").nth(1).locator("path:has(title:text-is('Jobs'))").count() >= 1
    screenshot(page, "console-queue-charts")


# ------------------------------------------------------------- a cluster
def test_a_cluster_of_two_nodes(tmp_path, page):
    """Node a's console shows both nodes (and a's shard's follower on b) and
    finds a job that lives on node b, whose page sends its actions to b."""
    from cluster_nodes import Nodes, free_ports

    with Nodes(tmp_path, shards=(1, 1), protocols=["workq"]) as nodes:
        # Each node's console on a port the cluster file names, so that the
        # nodes find each other's consoles.
        text = "replicas = 1\n" + nodes.file.read_text()
        metrics = {name: free_ports(nodes.host[name], 1) for name in nodes.names}
        for name, port in metrics.items():
            text = text.replace(f'name = "{name}"\n', f'name = "{name}"\nmetrics_port = {port}\n')
        nodes.file.write_text(text)
        for name in nodes.names:
            nodes.procs[name] = ServerProcess(
                shards=1, protocols=["workq"], host=nodes.host[name],
                extra=["--cluster", str(nodes.file), "--node", name, "--data-dir", str(tmp_path / f"data-{name}"),
                       "--metrics-port", str(metrics[name])])
        nodes.start()
        placed: Dict[str, str] = {}
        with Client(*nodes.address("b")) as client:
            for i in range(16):
                id, queue = str(uuid.uuid4()), f"tenant-{i}"
                client.add(id, queue, b'{"tenant": %d}' % i, 60_000, 3_600_000)
                placed[id] = queue
        a = f"http://{nodes.host['a']}:{metrics['a']}"
        on_b = [r["name"] for r in json.loads(urllib.request.urlopen(
            f"http://{nodes.host['b']}:{metrics['b']}/api/queues", timeout=10).read())["queues"]]
        assert on_b, "no queue on node b"
        id = next(id for id, queue in placed.items() if queue in on_b)

        def followers_in_sync() -> bool:
            page.goto(a + "/cluster")
            return page.locator("td", has_text="follower").count() >= 1
        wait_for(followers_in_sync, 30, "a follower on the cluster page")
        text = page.inner_text("main")
        assert "A cluster of 2 nodes" in text and "follower" in text
        screenshot(page, "console-cluster-nodes")

        page.fill("form.search input[name=q]", id)
        page.press("form.search input[name=q]", "Enter")
        page.wait_for_url(re.compile(r"/jobs/"))
        assert "This job is on node b" in page.inner_text("#actions")
        queue_link = page.locator("#details a").first.get_attribute("href")
        assert queue_link.startswith(f"http://{nodes.host['b']}:{metrics['b']}/queues/")
        screenshot(page, "console-job-on-another-node")

        # a lease taken through node a's router of a queue on node b: b's shard is told who over the TCP link
        from wire import Wire
        worker = Wire(socket.create_connection(nodes.address("a"), timeout=10))
        try:
            reply = worker.call(f"lease {placed[id]} 1000\r\n".encode())
            assert reply.startswith(f"+OK 1\r\n{id}".encode()), reply
            lease = json.loads(urllib.request.urlopen(
                f"http://{nodes.host['b']}:{metrics['b']}/api/job?id={id}", timeout=10).read())["lease"]
            host, port = worker.sock.getsockname()[:2]
            assert lease["connection"] == f"{host}:{port}" and lease["protocol"] == "workq", lease
            assert lease["client"].startswith("a/0-") and lease["via"] == "router", lease
        finally:
            worker.close()
