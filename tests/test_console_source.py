"""The console's data source against real servers: jobs added over workq and
takeanumber (raw sockets, as clients send them) are seen, paged, found by id
and by number, deleted, requeued and purged through
:class:`queueserver.console.source.ConsoleSource`, built on the server's
runtime directory as the supervisor builds it; bad input is a ConsoleError
with its HTTP status; a delete on a durable server survives a restart."""
from __future__ import annotations

import logging
import os
from typing import Dict, List

import pytest

from queueserver.config import Config
from queueserver.console.errors import BadRequest, NotFound
from queueserver.console.model import MAX_PER_PAGE
from queueserver.console.source import ConsoleSource
from queueserver.placement import SLOTS, slot_of

from serverproc import ServerProcess, wait_for
from test_text_protocols_server import TextWire, added_id
from wire import Wire, add, inspect_field, new_id, qname

SHARDS = 2


def source_for(proc: ServerProcess, **settings) -> ConsoleSource:
    config = Config(shards=proc.shards)
    for key, value in settings.items():
        setattr(config, key, value)
    return ConsoleSource(config, lambda name: os.path.join(str(proc.runtime_dir), name))


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(shards=SHARDS, protocols=["workq", "takeanumber"]).start()
    yield proc
    proc.stop()


@pytest.fixture
def source(server):
    src = source_for(server)
    yield src
    src.close()


@pytest.fixture
def wq(server):
    w = Wire(server.connect("workq"))
    yield w
    w.close()


@pytest.fixture
def tan(server):
    w = TextWire(server.connect("takeanumber"), b"\r\n")
    yield w
    w.close()


def by_name(rows):
    return {row["name"]: row for row in rows}


def test_queues_show_depth_by_state(source, wq, tan):
    q, t = qname("wq"), qname("tan")
    ids = [new_id() for _ in range(3)]
    for id in ids:
        assert wq.call(add(id, q)) == b"+OK\r\n"
    assert wq.call(f"lease {q} 1000\r\n".encode()).startswith(b"+OK 1\r\n")
    tan_id = added_id(tan.call(f"ADD {t} 0 hello\r\n".encode()))
    rows = by_name(source.queues())
    assert rows[q]["ready"] == 2 and rows[q]["leased"] == 1 and rows[q]["scheduled"] == 0
    assert rows[q]["finished"] == 0
    assert rows[q]["oldest_ready_age_s"] is not None and rows[q]["oldest_ready_age_s"] >= 0
    assert rows[t]["ready"] == 1
    assert rows[t]["shard"] in range(SHARDS)
    assert rows[q]["protocols"] == ["workq"] and rows[t]["protocols"] == ["takeanumber"]
    tan.call(f"LEN {q}\r\n".encode())   # a takeanumber client uses the workq queue too
    assert by_name(source.queues())[q]["protocols"] == ["takeanumber", "workq"]
    assert source.job(tan_id)["job"]["queue"] == t


def test_jobs_pages_and_states(source, wq):
    q = qname()
    ids = [new_id() for _ in range(7)]
    for id in ids:
        wq.call(add(id, q))
    page = source.jobs(q, "ready", page=1, per_page=3)
    assert page["total"] == 7 and page["pages"] == 3 and page["per_page"] == 3
    assert [job["id"] for job in page["jobs"]] == ids[:3]
    last = source.jobs(q, "ready", page=3, per_page=3)
    assert [job["id"] for job in last["jobs"]] == ids[6:]
    # leased and finished jobs are found by scanning
    assert wq.call(f"lease {q} 1000\r\n".encode()).startswith(f"+OK 1\r\n{ids[0]}".encode())
    leased = source.jobs(q, "leased")
    assert [job["id"] for job in leased["jobs"]] == [ids[0]] and leased["total"] == 1
    assert leased["jobs"][0]["ttr_left_s"] is not None and 0 < leased["jobs"][0]["ttr_left_s"] <= 10
    assert wq.call(f"complete {ids[0]} 2\r\nok\r\n".encode()) == b"+OK\r\n"
    finished = source.jobs(q, "finished")
    assert [job["id"] for job in finished["jobs"]] == [ids[0]]
    assert source.jobs(q, "scheduled")["total"] == 0


def test_a_huge_page_is_cut_and_deep_pages_are_refused(source, wq):
    q = qname()
    for _ in range(MAX_PER_PAGE + 5):
        wq.send(add(new_id(), q))
    for _ in range(MAX_PER_PAGE + 5):
        assert wq.reply() == b"+OK\r\n"
    page = source.jobs(q, "ready", page=1, per_page=1_000_000)
    assert page["per_page"] == MAX_PER_PAGE and len(page["jobs"]) == MAX_PER_PAGE
    assert page["total"] == MAX_PER_PAGE + 5 and page["pages"] == 2
    with pytest.raises(BadRequest):
        source.jobs(q, "ready", page=1_000_000, per_page=100)
    with pytest.raises(BadRequest):
        source.jobs(q, "ready", page=3, per_page=100)   # past the last page
    with pytest.raises(BadRequest):
        source.jobs(q, "ready", page=0)
    with pytest.raises(BadRequest):
        source.jobs(q, "sleeping")


def test_unknown_queue_and_malformed_or_missing_ids(source):
    with pytest.raises(NotFound) as err:
        source.jobs(qname("nothing"), "ready")
    assert err.value.status == 404
    for bad in ("", "not-an-id", "12ab", "7f3c1e0a-5b2d-4c8e-9f10", "-3", "0"):
        with pytest.raises(BadRequest) as bad_err:
            source.job(bad)
        assert bad_err.value.status == 400
    with pytest.raises(NotFound):
        source.job(new_id())
    with pytest.raises(NotFound):
        source.job("987654321")
    with pytest.raises(NotFound):
        source.purge_queue(qname("nothing"), "tester")
    with pytest.raises(NotFound):
        source.delete_job(new_id(), "tester")


def test_job_detail_by_id_and_by_number(source, wq, tan):
    q = qname()
    id = new_id()
    wq.call(add(id, q, payload=b"\x00\xffbinary"))
    detail = source.job(id.upper())
    assert detail["job"]["id"] == id and detail["job"]["state"] == "ready"
    assert detail["payload_text"] is None and detail["payload_hex"] == b"\x00\xffbinary".hex()
    assert detail["payload_size"] == 8 and detail["shard"] in range(SHARDS)
    number = detail["job"]["number"]
    assert number and source.job(str(number))["job"]["id"] == id
    t = qname()
    tan_id = added_id(tan.call(f"ADD {t} 0 some text\r\n".encode()))
    tan_detail = source.job(tan_id)
    assert tan_detail["payload_text"] == "some text"
    assert source.job(str(tan_detail["job"]["number"]))["job"]["id"] == tan_id
    found = source.search(tan_id)
    assert found["job"] is not None and found["job"]["job"]["id"] == tan_id
    assert t in source.search(t[-6:])["queues"]
    assert source.search("no such queue at all")["job"] is None


def test_delete_requeue_and_purge(source, wq, caplog):
    q = qname()
    ids = [new_id() for _ in range(5)]
    for id in ids[:4]:
        wq.call(add(id, q))
    wq.call(add(ids[4], q, flags="-max-attempts=1"))
    caplog.set_level(logging.INFO)
    result = source.delete_job(ids[0], "alice")
    assert result["ok"] and result["count"] == 1 and ids[0] in result["message"]
    with pytest.raises(NotFound):
        source.job(ids[0])
    # a leased job back to ready
    assert wq.call(f"lease {q} 1000\r\n".encode()).startswith(f"+OK 1\r\n{ids[1]}".encode())
    assert source.requeue_job(ids[1], "alice")["ok"]
    assert source.job(ids[1])["job"]["state"] == "ready"
    assert inspect_field(wq, ids[1], "state") == b"3"
    # a failed job back to ready, with its attempts anew
    wq.call(f"delete {ids[1]}\r\n".encode())
    wq.call(f"delete {ids[2]}\r\n".encode())
    wq.call(f"delete {ids[3]}\r\n".encode())
    assert wq.call(f"lease {q} 1000\r\n".encode()).startswith(f"+OK 1\r\n{ids[4]}".encode())
    assert wq.call(f"fail {ids[4]} 3\r\nbad\r\n".encode()) == b"+OK\r\n"
    assert source.job(ids[4])["job"]["state"] == "finished"
    assert source.requeue_job(ids[4], "bob")["ok"]
    assert source.job(ids[4])["job"]["state"] == "ready"
    assert source.job(ids[4])["job"]["attempts"] == 0
    assert wq.call(f"lease {q} 1000\r\n".encode()).startswith(f"+OK 1\r\n{ids[4]}".encode())
    assert source.requeue_job(ids[4], "bob")["ok"]   # leased: back to ready
    with pytest.raises(BadRequest):   # a ready job is not requeued
        source.requeue_job(ids[4], "bob")
    # purge: every job of the queue, whatever its state
    more = [new_id() for _ in range(1200)]
    for id in more:
        wq.send(add(id, q))
    for _ in more:
        assert wq.reply() == b"+OK\r\n"
    # one of them leased, one finished: a purge takes jobs of every state
    assert wq.call(f"lease {q} 1000\r\n".encode()).startswith(b"+OK 1\r\n")
    done = wq.call(f"lease {q} 1000\r\n".encode()).split(b"\r\n")[1].split()[0].decode()
    assert wq.call(f"complete {done} 2\r\nok\r\n".encode()) == b"+OK\r\n"
    row = by_name(source.queues())[q]
    # (the requeued job, out of attempts once released, failed at the first lease: finished too)
    assert (row["ready"], row["leased"], row["finished"]) == (1198, 1, 2)
    purged = source.purge_queue(q, "carol")
    assert purged["ok"] and purged["count"] == 1201, purged
    row = by_name(source.queues()).get(q)
    assert row is None or (row["ready"], row["leased"], row["finished"]) == (0, 0, 0)


def test_a_console_delete_survives_a_restart_and_the_history_shows_the_job(tmp_path):
    proc = ServerProcess(shards=1, protocols=["workq"], extra=["--data-dir", str(tmp_path / "data")]).start()
    src = source_for(proc)
    try:
        w = Wire(proc.connect("workq"))
        q, gone, kept = qname(), new_id(), new_id()
        w.call(add(gone, q))
        w.call(add(kept, q))
        assert src.delete_job(gone, "alice")["message"] == f"deleted job {gone} from {q}"
        assert w.call(f"lease {q} 1000\r\n".encode()).startswith(f"+OK 1\r\n{kept}".encode())

        def leased_line():
            return any(" leased " in line for line in src.job(kept)["history"])
        wait_for(leased_line, what="the history of the leased job")   # written about once a second
        detail = src.job(kept)
        assert detail["history"][0].split()[1] == "added"
        assert detail["lease"] is not None and detail["lease"]["protocol"] == "workq"
        assert detail["lease"]["ttr_left_s"] > 0
        w.close()
        proc.restart()
        with pytest.raises(NotFound):
            src.job(gone)
        assert src.job(kept)["job"]["state"] == "ready"   # a restart releases leases
        assert f"console: alice deleted job {gone} from {q}" in proc.log()
        wait_for(lambda: any(" deleted " in line and "by console (alice)" in line
                             for line in history_of(proc, gone)), what="the delete in the history")
    finally:
        src.close()
        proc.stop()


def history_of(proc: ServerProcess, id: str):
    from queueserver.console.source import history_lines
    return history_lines(history_dir_of(proc), id)


def history_dir_of(proc: ServerProcess) -> str:
    argv = proc.child_argv("shard-0")
    return argv[argv.index("--history-dir") + 1]


def test_rates_from_samples(source, wq):
    q = qname()
    source.sample()
    for _ in range(5):
        wq.call(add(new_id(), q))
    source.sample()
    points = source.rates(q)
    assert points and points[-1]["added"] > 0 and points[-1]["completed"] == 0
    node = source.rates()
    assert node[-1]["added"] >= points[-1]["added"]
    assert [p["t"] for p in node] == sorted(p["t"] for p in node)
    assert source.rates(qname("quiet"))[-1]["added"] == 0
    assert by_name(source.queues())[q]["added_per_s"] == points[-1]["added"]


def test_cluster_view_of_one_host(source, server, wq):
    wq.call(add(new_id(), qname()))
    view = source.cluster()
    assert view["clustered"] is False and len(view["nodes"]) == 1
    shards = view["nodes"][0]["shards"]
    assert [s["shard"] for s in shards] == list(range(SHARDS)) and all(s["up"] for s in shards)
    assert sum(s["jobs"] for s in shards) >= 1


def test_tokens_and_history_report(tmp_path, server):
    tokens = tmp_path / "tokens"
    src = source_for(server, console_token_file=str(tokens), console_history_report=str(tmp_path / "out"))
    try:
        assert src.token_names() == {}   # no file yet: no actions
        tokens.write_text("# who token\nalice s3cret-a\n\nbob s3cret-b\nbroken line here\n")
        assert src.token_names() == {"s3cret-a": "alice", "s3cret-b": "bob"}
        tokens.write_text("carol s3cret-c\n")
        assert src.token_names() == {"s3cret-c": "carol"}
        assert src.history_report() is None
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "report.html").write_text("<html></html>")
        assert src.history_report() == str(tmp_path / "out" / "report.html")
    finally:
        src.close()
    assert source_for(server).token_names() == {} and source_for(server).history_report() is None


def test_a_job_is_found_on_another_node_of_a_cluster(tmp_path):
    """Two nodes: node a's console finds node b's jobs through b's console
    (``/api/job?id=...&scope=node``), and its cluster page shows both nodes
    and (replicas = 1) the follower of a's shard on b."""
    import re
    from pathlib import Path

    from cluster_nodes import Nodes

    with Nodes(Path(tmp_path), shards=(1, 1), protocols=["workq"]) as nodes:
        nodes.file.write_text("replicas = 1\n" + nodes.file.read_text())   # each shard a follower on the other node
        nodes.start()
        # Where each node's console listens (the kernel picked the ports), as a
        # cluster file with metrics_port says it.
        text = nodes.file.read_text()
        for name, proc in nodes.procs.items():
            text = re.sub(rf'(name = "{name}"\n)', rf'\1metrics_port = {proc.ports["metrics"]}\n', text)
        (Path(tmp_path) / "console-cluster.toml").write_text(text)
        config = Config(shards=1, cluster=str(Path(tmp_path) / "console-cluster.toml"), node="a")
        src = ConsoleSource(config, lambda name: os.path.join(str(nodes.procs["a"].runtime_dir), name))
        try:
            w = Wire(socket_to(nodes.address("b")))
            # Six queues in each node's half of the slots (a founded the first
            # half, b the second), so both nodes' consoles are asked by chance-free names.
            names = (f"spread-{i}" for i in range(10**6))
            halves: Dict[str, List[str]] = {"a": [], "b": []}
            while min(len(h) for h in halves.values()) < 6:
                q = next(names)
                half = halves["a" if slot_of(q) < SLOTS // 2 else "b"]
                if len(half) < 6:
                    half.append(q)
            placed = {}
            for node, queues in halves.items():
                for q in queues:
                    id = new_id()
                    assert w.call(add(id, q)) == b"+OK\r\n"
                    placed[id] = (q, node)
            w.close()
            seen = {}
            for id, (q, node) in placed.items():
                detail = src.job(id)
                assert detail["job"]["queue"] == q
                seen[id] = (detail["node"], node)
            assert all(found == home for found, home in seen.values()), seen
            on_b = next(id for id, (node, _) in seen.items() if node == "b")
            number = src.job(on_b)["job"]["number"]
            assert src.job(str(number))["node"] == "b"
            with pytest.raises(NotFound) as err:
                src.delete_job(on_b, "alice")   # actions are each node's own
            assert "node b" in err.value.message
            with pytest.raises(NotFound):
                src.job(new_id())
            view = src.cluster()
            assert view["clustered"] and [n["name"] for n in view["nodes"]] == ["a", "b"]
            assert all(n["up"] for n in view["nodes"]) and all(n["shards"] for n in view["nodes"])
            assert view["nodes"][0]["shards"][0]["slots"]   # a's slot ranges
            assert any(link["state"] == "up" for link in view["links"])

            def follower_on_b():
                copies = [s for s in src.cluster()["nodes"][1]["shards"] if s["role"] == "follower"]
                return copies and copies[0]["up"] and copies[0]["lag"] is not None
            wait_for(follower_on_b, what="a's shard's follower on b, in sync")
        finally:
            src.close()


def socket_to(address):
    import socket
    return socket.create_connection(address, timeout=15)
