"""Who holds which lease, on real servers that keep no job history
(``--in-memory``, as the README's quick start runs): workers lease over
workq and takeanumber, forwarded by the router and on the direct path, and
the console names each lease's holder (its address, protocol, connection
and since when) on the job's page, in ``/api/job`` and on the workers page
(``/workers``, per router and shard), in a real browser too. A lease that
waited for its job (handed over later), one spread over two shards' queues
and one whose client has left are named as well.
"""
from __future__ import annotations

import json
import re
import socket
import urllib.request
import uuid
from typing import Any, Iterator, Tuple

import pytest
from playwright.sync_api import expect

from browser import screenshot
from serverproc import ServerProcess, wait_for
from wire import Wire, add, names_on_distinct_shards


class Node:
    def __init__(self, proc: ServerProcess, direct: bool) -> None:
        self.proc = proc
        self.direct = direct
        self.base = f"http://{proc.host}:{proc.ports['metrics']}"

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=10) as answer:
            return json.loads(answer.read())

    def wire(self, protocol: str = "workq") -> Wire:
        return Wire(self.proc.connect(protocol))

    def add(self, queue: str, count: int = 1) -> list:
        ids = [str(uuid.uuid4()) for _ in range(count)]
        w = self.wire()
        for id in ids:
            assert w.call(add(id, queue, b"payload", 60_000, 3_600_000)) == b"+OK\r\n"
        w.close()
        return ids

    def lease(self, id: str) -> Any:
        return self.api(f"/api/job?id={id}")["lease"]


def address(wire: Wire) -> str:
    host, port = wire.sock.getsockname()[:2]
    return f"{host}:{port}"


def leased_id(reply: bytes) -> str:
    assert reply.startswith(b"+OK 1\r\n"), reply
    return reply.split(b"\r\n")[1].split(b" ")[0].decode()


@pytest.fixture(scope="module", params=["direct", "forwarded"])
def node(request) -> Iterator[Node]:
    direct = request.param == "direct"
    with ServerProcess(shards=2, protocols=["workq", "takeanumber"],
                       extra=["--in-memory", "--direct-path" if direct else "--no-direct-path"]) as proc:
        yield Node(proc, direct)


def assert_held_by(lease: Any, wire: Wire, protocol: str, node: Node) -> None:
    assert lease is not None
    assert lease["connection"] == address(wire), lease      # the worker's own address
    assert lease["protocol"] == protocol
    assert re.fullmatch(r"0-\d+", lease["client"]), lease   # router 0, its connection id
    assert lease["via"] == ("direct" if node.direct else "router"), lease
    assert lease["leased_s"] is not None and 0 <= lease["leased_s"] < 30
    assert lease["left_s"] is None


def test_a_lease_names_its_holder_without_a_history(node):
    assert node.api("/status")   # the server is up; it writes no history (in memory)
    queue = f"holders-{uuid.uuid4().hex[:6]}"
    ids = node.add(queue, 2)
    worker = node.wire()
    try:
        id = leased_id(worker.call(f"lease {queue} 1000\r\n".encode()))
        assert id in ids
        assert_held_by(node.lease(id), worker, "workq", node)
        other = ids[1] if id == ids[0] else ids[0]
        assert node.api(f"/api/job?id={other}")["lease"] is None   # not leased: nobody holds it
        page = urllib.request.urlopen(f"{node.base}/jobs/{id}", timeout=10).read().decode()
        assert address(worker) in page and "workq" in page and "unknown" not in page.split('id=lease')[1][:2000]
    finally:
        worker.close()


def test_a_takeanumber_reservation_names_its_holder(node):
    queue = f"tan-{uuid.uuid4().hex[:6]}"
    worker = Wire(node.proc.connect("takeanumber"))
    try:
        added = worker.call(f"ADD {queue} 3 monthly\r\n".encode())
        id = added[1:].strip().decode()
        assert worker.call(f"RESERVE {queue}\r\n".encode()).startswith(b"+" + id.encode())
        assert_held_by(node.lease(id), worker, "takeanumber", node)
    finally:
        worker.close()


def test_a_lease_that_waited_for_its_job_names_its_holder(node):
    """The worker waits on an empty queue; the job arrives later, from
    another client: the lease is handed over by the shard's later answer."""
    queue = f"waiting-{uuid.uuid4().hex[:6]}"
    worker = node.wire()
    try:
        worker.send(f"lease {queue} 10000\r\n".encode())
        wait_for(lambda: any(r["name"] == queue for r in node.api("/api/queues")["queues"]), 10,
                 "the waiting lease's queue")
        id = node.add(queue)[0]
        assert leased_id(worker.reply()) == id
        assert_held_by(node.lease(id), worker, "workq", node)
    finally:
        worker.close()


def test_a_lease_over_two_shards_queues_names_its_holder(node):
    """A lease of queues on two shards is forwarded to both by the router
    (never moved): whichever shard hands the job over names the worker."""
    first, second = names_on_distinct_shards(2, 2)
    node.add(second)
    worker = node.wire()
    try:
        id = leased_id(worker.call(f"lease {first} {second} 1000\r\n".encode()))
        lease = node.lease(id)
        assert lease["connection"] == address(worker) and lease["protocol"] == "workq"
        assert lease["via"] == "router"   # spread over shards: the router serves it
    finally:
        worker.close()


def test_a_holder_that_left_is_named_with_since_when(node):
    """A workq lease outlives its client (until its TTR): the console says who it was, and that it left."""
    queue = f"leaving-{uuid.uuid4().hex[:6]}"
    node.add(queue)
    worker = node.wire()
    id = leased_id(worker.call(f"lease {queue} 1000\r\n".encode()))
    was = address(worker)
    worker.close()
    wait_for(lambda: node.lease(id)["left_s"] is not None, 10, "the holder to be known gone")
    lease = node.lease(id)
    assert lease["connection"] == was and lease["protocol"] == "workq"
    page = urllib.request.urlopen(f"{node.base}/jobs/{id}", timeout=10).read().decode()
    assert "disconnected" in page


def test_the_workers_page_lists_connections_and_leases_per_router_and_shard(node, page):
    queue = f"busy-{uuid.uuid4().hex[:6]}"
    ids = set(node.add(queue, 3))
    idle, worker = node.wire(), node.wire()
    try:
        assert idle.call(f"lease nothing-{uuid.uuid4().hex[:6]} 0\r\n".encode()) == b"-TIMEOUT\r\n"
        held = {leased_id(worker.call(f"lease {queue} 1000\r\n".encode())) for _ in range(2)}
        assert held <= ids
        view = node.api("/api/workers")
        mine = next(c for c in view["connections"] if c["address"] == address(worker))
        assert mine["protocol"] == "workq" and mine["leases"] == 2 and mine["connected_s"] is not None
        assert re.fullmatch(r"shard \d" if node.direct else "router", mine["served_by"]), mine
        assert next(c for c in view["connections"] if c["address"] == address(idle))["leases"] == 0
        names = {p["name"] for p in view["processes"]}
        assert names == {"router 0", "shard 0", "shard 1"}
        assert sum(p["leases"] for p in view["processes"] if p["name"].startswith("shard")) == view["leases_total"]
        rows = {lease["job"]["id"]: lease for lease in view["leases"]}
        for id in held:
            assert rows[id]["holder"]["address"] == address(worker)

        page.goto(node.base + "/")
        page.click("nav.main a:has-text('Workers')")
        page.wait_for_url(re.compile(r"/workers$"))
        row = page.locator(f'#connections tr:has-text("{address(worker)}")')
        expect(row).to_have_count(1)
        assert row.locator("td").nth(6).inner_text().strip() == "2"   # its leases
        for id in held:
            lease_row = page.locator(f'#leases tr[data-job="{id}"]')
            assert address(worker) in lease_row.inner_text() and "workq" in lease_row.inner_text()
        screenshot(page, f"console-workers-{'direct' if node.direct else 'forwarded'}")
        page.goto(f"{node.base}/jobs/{sorted(held)[0]}")
        lease_card = page.locator("#lease").inner_text()
        assert address(worker) in lease_card and "workq" in lease_card and "ago" in lease_card
        screenshot(page, f"console-job-holder-{'direct' if node.direct else 'forwarded'}")
    finally:
        idle.close()
        worker.close()
