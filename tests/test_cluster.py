"""A cluster of three real nodes on this machine (127.0.0.1, .2 and .3, each
a whole server with its own data and runtime directories): every protocol
across nodes, slots moved under load and across a kill -9, a node down,
authenticated links, TLS, ownership kept across restarts, one-line errors."""
from __future__ import annotations

import socket
import struct
import subprocess
import time
import uuid

import pytest

from cluster_nodes import Nodes, write_secret
from crash_history import History, Load, drain, drain_limit
from queueserver.client import Client
from queueserver.client.client import WorkqError
from queueserver.placement import SLOTS, initial_owners, slot_of
from serverproc import one_line_error, run_cli, wait_for
from test_binary_protocols_server import (FluxWire, GoWire, g_add, g_delete, g_reserve, reserved_fields,
                                          t_dequeue, t_enqueue, t_record)
from test_metrics import one, scrape
from test_text_protocols_server import TextWire, b64
from wire import read_to_eof

FOUNDERS = 4        # shards (2, 1, 1): a/0, a/1, b/0, c/0 hold ordinals 0..3


def name_on(ordinal: int, prefix: str = "q", founders: int = FOUNDERS) -> str:
    """A fresh queue name whose slot the new cluster gives to shard ``ordinal``."""
    owners = initial_owners(founders)
    while True:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if owners[slot_of(name)] == ordinal:
            return name


def wire(nodes: Nodes, node: str, protocol: str, kind=None, *args):
    sock = socket.create_connection(nodes.address(node, protocol), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return kind(sock, *args) if kind else sock


def slot_list(names) -> str:
    return ",".join(str(slot_of(name)) for name in names)


@pytest.fixture
def three(tmp_path):
    with Nodes(tmp_path) as nodes:
        nodes.start()
        yield nodes


# --------------------------------------------------------------- protocols
def test_a_job_added_on_one_node_is_taken_on_another_over_every_protocol(three):
    nodes = three
    # workq: added at a (to a queue of c's shard), leased at b, its result read at c
    name = name_on(3)
    id = str(uuid.uuid4())
    with Client(*nodes.address("a")) as a, Client(*nodes.address("b")) as b, \
            Client(*nodes.address("c")) as c:
        a.add(id, name, b"payload", 60_000, 600_000)
        job = b.lease([name], 5000)
        assert (job.id, job.payload) == (id, b"payload")
        b.complete(id, b"result")
        assert c.result(id, 0).result == b"result"
        # one lease over queues of three shards on three nodes, from a fourth node's router
        names = [name_on(0), name_on(2), name_on(3)]
        c.add(str(uuid.uuid4()), names[1], b"spread", 60_000, 600_000)
        assert a.lease(names, 5000).payload == b"spread"

    # takeanumber: ADD at a, RESERVE at c, DONE at b
    name = name_on(2, "tan")
    t_a, t_b, t_c = (wire(nodes, n, "takeanumber", TextWire, b"\r\n") for n in "abc")
    added = t_a.call(f"ADD {name} 3 hello\r\n".encode())
    tan_id = added[1:-2].decode()
    assert t_c.call(f"RESERVE {name}\r\n".encode()) == f"+{tan_id} hello\r\n".encode()
    assert t_b.call(f"DONE {name} {tan_id}\r\n".encode()) == b"+OK\r\n"
    assert t_a.call(f"LEN {name}\r\n".encode()) == b":0\r\n"

    # goqueue: ADD at b, RESERVE at a, DELETE by number at c
    name = name_on(0, "go")
    g_b, g_a, g_c = (wire(nodes, n, "goqueue", GoWire) for n in "bac")
    reply = g_b.call(g_add(name, 1, 60, b"gq"))
    number = struct.unpack("<Q", reply[6:])[0]
    got = reserved_fields(g_a.call(g_reserve(name, 1000)))
    assert (got[0], got[4]) == (number, b"gq")
    assert g_c.call(g_delete(number)) == b"OK\0"
    assert g_a.call(g_reserve(name, 1)) == b"TIMEOUT\0"

    # queued: ENQUE at c, DEQUE at a
    name = name_on(1, "qd")
    q_c, q_a = (wire(nodes, n, "queued", TextWire, b"\n") for n in "ca")
    for w in (q_c, q_a):
        assert w.call(f"USE {name}\n".encode()) == b"OK\n"
    assert q_c.call(b"ENQUE " + b64(b"item") + b"\n") == b"OK\n"
    assert q_a.call(b"DEQUE\n") == b"ITEM " + b64(b"item") + b"\n"

    # TaskFlux: ENQUEUE at a, DEQUEUE at b
    name = name_on(2, "tf")
    f_a, f_b = (wire(nodes, n, "taskflux", FluxWire) for n in "ab")
    assert f_a.call(t_enqueue(name, 7, b"flux")) == b"R\x00\x00\x00\x02e\x01"
    assert f_b.call(t_dequeue(name)) == t_record(7, b"flux")

    # across protocols and nodes: workq add at c, takeanumber reserve at a
    name = name_on(1, "x")
    with Client(*nodes.address("c")) as c:
        c.add(str(uuid.uuid4()), name, b"cross", 60_000, 600_000)
    assert t_a.call(f"RESERVE {name}\r\n".encode()).endswith(b" cross\r\n")
    for w in (t_a, t_b, t_c, g_a, g_b, g_c, q_a, q_c, f_a, f_b):
        w.close()


# ---------------------------------------------------------------- moving
def _moves(nodes: Nodes, names, rounds: int) -> None:
    """Move the queues' slots back and forth between the nodes."""
    for target in ["c/0", "a/1", "b/0", "a/0"][:rounds]:
        result = nodes.cli("move", "--slots", slot_list(names), "--to", target, "--batch", "2")
        assert result.returncode == 0, result.stdout + result.stderr


def _every_router_serves(history: History, nodes: Nodes, names) -> None:
    """Once nothing moves any more, every node's router serves every queue:
    adds, a lease of each queue, and a lease over all of them, with no
    "Queue is moving" answer (a router's map must not stay wrong after the
    moves; the probes are jobs of the history like any other)."""
    assert all(not row["moving"] for row in nodes.status())
    for node in nodes.names:
        with Client(*nodes.address(node)) as client:
            for i, name in enumerate(names):
                token = f"probe-{node}-{i}"
                history.note("attempted", token)
                client.add(str(uuid.uuid4()), name, token.encode(), 60_000, 3_600_000)
                history.note("acked", token)
            for name in names:
                history.note("leased", client.lease([name], 5000).payload.decode())
            history.note("leased", client.lease(names, 5000).payload.decode())


def _check(history: History, nodes: Nodes, names, via: str = "c") -> None:
    """After a kill -9 and restart of every node (leases end, as in the
    durability issue's check), drain the queues and judge the history."""
    for name in nodes.names:
        nodes.kill(name)
    nodes.start()
    host, port = nodes.address(via)
    verdict = history.check(drain(port, names, host=host, limit=drain_limit(len(history.attempted))))
    assert verdict.acknowledged > 100, verdict.summary()
    assert not verdict.lost, verdict.summary()
    assert not verdict.unexpected, verdict.summary()
    assert not verdict.resurrected, verdict.summary()
    rows = nodes.status()
    assert sum(row["slots"] for row in rows) == SLOTS
    assert all(not row["moving"] for row in rows)


def test_slots_move_back_and_forth_under_load_with_no_job_lost_or_unexpected(three):
    nodes = three
    names = [name_on(ordinal, "load") for ordinal in range(FOUNDERS)]
    history = History()
    load = Load(history, lambda: nodes.procs["a"].ports, names, host=nodes.host["a"],
                workers_at=lambda: (nodes.host["b"], nodes.procs["b"].ports)).start()
    try:
        time.sleep(0.5)
        _moves(nodes, names, 4)
        result = nodes.cli("rebalance")
        assert result.returncode == 0, result.stderr
    finally:
        load.stop()
    _every_router_serves(history, nodes, names)
    _check(history, nodes, names)
    assert "Traceback" not in "".join(nodes.log(n) for n in "abc")


@pytest.mark.parametrize("victim", ["a", "c"])
def test_a_node_killed_mid_move_comes_back_to_exactly_one_owner(tmp_path, victim):
    """The giver (a) or the receiver (c) dies by SIGKILL while slots move;
    it restarts; the move command, still running, finishes the move."""
    with Nodes(tmp_path) as nodes:
        nodes.start()
        names = [name_on(ordinal, "kill") for ordinal in (0, 1)]
        more = [name_on(ordinal, "kill") for ordinal in (0, 1) for _ in range(15)]
        history = History()
        load = Load(history, lambda: nodes.procs["b"].ports, names + more, host=nodes.host["b"]).start()
        mover = None
        try:
            time.sleep(0.5)
            mover = nodes.cli_process("move", "--slots", slot_list(names + more), "--to", "c/0",
                                      "--batch", "1")
            lines = []
            while len(lines) < 3:
                line = mover.stdout.readline()
                assert line, "".join(lines)
                lines.append(line)
            nodes.kill(victim)
            nodes.start(victim)
            out, _ = mover.communicate(timeout=180)
            assert mover.returncode == 0, "".join(lines) + out
            result = nodes.cli("rebalance")
            assert result.returncode == 0, result.stdout + result.stderr
        finally:
            load.stop()
            if mover is not None and mover.poll() is None:
                mover.kill()
                mover.wait()
        _every_router_serves(history, nodes, names + more)
        _check(history, nodes, names + more, via="b")


def test_ownership_is_kept_across_restarts_and_nodes_join_and_leave(tmp_path):
    """Node c is appended to the file of a running cluster and given its
    share; the running routers learn of it from the move itself."""
    with Nodes(tmp_path, shards=(1, 1, 1), joiners=("c",), later=("c",)) as nodes:
        nodes.start("a", "b")
        name = name_on(1, "keep", founders=2)
        with Client(*nodes.address("a")) as a:
            for i in range(20):
                a.add(str(uuid.uuid4()), name, b"%d" % i, 60_000, 600_000)
        nodes.add_to_file("c")
        nodes.start("c")
        assert {row["shard"]: row["slots"] for row in nodes.status()} == \
            {"a/0": SLOTS // 2, "b/0": SLOTS // 2, "c/0": 0}
        result = nodes.cli("add-node", "c")
        assert result.returncode == 0, result.stdout + result.stderr
        counts = {row["shard"]: row["slots"] for row in nodes.status()}
        assert sorted(counts.values()) == [5461, 5461, 5462]
        theirs = next(f"new-{i}" for i in range(100_000)
                      if slot_of(f"new-{i}") in _served(nodes, "c/0"))
        with Client(*nodes.address("a")) as a:      # a's router, started before c existed
            a.add(str(uuid.uuid4()), theirs, b"to c", 60_000, 600_000)
            assert a.lease([theirs], 2000).payload == b"to c"
        assert "is new in" in nodes.log("a")
        at_c = scrape(nodes.procs["c"])
        assert one(at_c, "queueserver_slot_moves_total", direction="in", node="c") == counts["c/0"]
        assert one(at_c, "queueserver_slots_owned", node="c", shard="0") == counts["c/0"]
        gave = one(scrape(nodes.procs["a"]), "queueserver_slot_moves_total", direction="out", node="a")
        assert gave == SLOTS // 2 - counts["a/0"]
        for node in "abc":
            nodes.procs[node].restart()
        assert {row["shard"]: row["slots"] for row in nodes.status()} == counts
        result = nodes.cli("remove-node", "b")
        assert result.returncode == 0 and "removed = true" in result.stdout
        counts = {row["shard"]: row["slots"] for row in nodes.status()}
        assert counts["b/0"] == 0 and counts["a/0"] + counts["c/0"] == SLOTS
        with Client(*nodes.address("c")) as c:
            got = sorted(c.lease([name], 2000).payload for _ in range(20))
        assert got == sorted(b"%d" % i for i in range(20))


def _served(nodes: Nodes, shard: str) -> set:
    from queueserver.cluster.admin import Cluster
    from queueserver.cluster.clusterfile import load_cluster
    cluster = Cluster(load_cluster(str(nodes.file)))
    try:
        ordinal = next(s.ordinal for s in cluster.shards if s.name == shard)
        served = cluster.call(ordinal, "slots", [])["served"]
    finally:
        cluster.close()
    return {slot for start, end, _ in served for slot in range(start, end)}


# ------------------------------------------------------------- node down
def test_a_node_down_gets_prompt_errors_for_its_slots_only_and_its_jobs_back_on_return(three):
    nodes = three
    theirs, ours = name_on(3, "down"), name_on(0, "up")
    with Client(*nodes.address("a")) as a:
        a.add(str(uuid.uuid4()), theirs, b"kept", 60_000, 600_000)
    nodes.kill("c")
    with Client(*nodes.address("a"), timeout=10) as a:
        # An add sent before a's router saw the link drop was in flight when
        # c died: its outcome is unknown; once the drop is seen, "unavailable".
        with pytest.raises(WorkqError, match="unavailable|Outcome unknown"):
            a.add(str(uuid.uuid4()), theirs, b"x", 60_000, 600_000)
        with pytest.raises(WorkqError, match="unavailable"):
            a.add(str(uuid.uuid4()), theirs, b"x", 60_000, 600_000)
        a.add(str(uuid.uuid4()), ours, b"fine", 60_000, 600_000)
        assert a.lease([ours], 1000).payload == b"fine"
    t = wire(nodes, "b", "takeanumber", TextWire, b"\r\n")
    assert t.call(f"LEN {theirs}\r\n".encode()).startswith(b"-ERR Shard 3 unavailable")
    t.close()
    nodes.start("c")
    with Client(*nodes.address("b")) as b:
        def back():
            try:
                return b.lease([theirs], 1000).payload
            except WorkqError:
                return None
        wait_for(back, 20, "node c's jobs to be served again")


# ------------------------------------------------------------ link security
def _link_port(nodes: Nodes, node: str) -> int:
    import tomllib
    spec = tomllib.loads(nodes.file.read_text())
    return next(n["link_port"] for n in spec["node"] if n["name"] == node)


def test_links_refuse_plain_clients_silent_clients_and_a_wrong_secret(tmp_path):
    with Nodes(tmp_path, shards=(1, 1)) as nodes:
        nodes.start("a")
        port = _link_port(nodes, "a")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            plain.sendall(b"add q 0 0 1\r\nx\r\n")
            got = read_to_eof(plain)
        assert got.endswith(b"-ERR link authentication failed\r\n")
        with socket.create_connection(("127.0.0.1", port), timeout=20) as silent:
            assert silent.recv(100).startswith(b"QSLINK1 ")
            assert silent.recv(100) in (b"", b"-ERR link authentication failed\r\n")  # closed
        # node b, given another secret, is refused by a's shard; a's slots fail at b's router
        other = write_secret(tmp_path / "other.secret")
        wrong = tmp_path / "wrong.toml"
        wrong.write_text(nodes.file.read_text().replace('"cluster.secret"', f'"{other.name}"'))
        nodes.file, real = wrong, nodes.file
        nodes.start("b", linked=False)   # it never will be
        nodes.file = real
        wait_for(lambda: "wrong secret" in nodes.log("a"), 20, "a's shard to log the wrong secret")
        assert "not a shard link" in nodes.log("a") and "no answer within" in nodes.log("a")
        with Client(*nodes.address("b"), timeout=10) as b:
            with pytest.raises(WorkqError, match="unavailable"):
                b.add(str(uuid.uuid4()), name_on(0, founders=2), b"x", 60_000, 600_000)


def _certificates(root) -> dict:
    def run(*args):
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=queueserver test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "node.crt", "-days", "2")
    return {"cert": "node.crt", "key": "node.key", "ca": "ca.crt"}


def test_a_cluster_with_tls_links(tmp_path):
    with Nodes(tmp_path, shards=(1, 1), tls=_certificates(tmp_path), protocols=["workq"]) as nodes:
        nodes.start()
        name = name_on(1, "tls", founders=2)
        with Client(*nodes.address("a")) as a, Client(*nodes.address("b")) as b:
            a.add(str(uuid.uuid4()), name, b"secret stuff", 60_000, 600_000)
            assert b.lease([name], 2000).payload == b"secret stuff"
        assert "with TLS" in nodes.log("b")
        with socket.create_connection(("127.0.0.2", _link_port(nodes, "b")), timeout=10) as plain:
            plain.sendall(b"QSLINK1 hello\n")
            try:
                assert plain.recv(100) == b""   # not TLS: dropped
            except ConnectionResetError:
                pass


# ------------------------------------------------------------ start-up errors
def test_cluster_mistakes_are_one_line_each(tmp_path):
    nodes = Nodes(tmp_path, shards=(1, 1))
    base = ["serve", "--cluster", str(nodes.file), "--workq-port", "0", "--no-takeanumber", "--no-goqueue",
            "--no-queued", "--no-taskflux", "--no-metrics", "--runtime-dir", str(tmp_path / "rt")]
    data = ["--data-dir", str(tmp_path / "d")]
    assert "needs --node" in one_line_error(run_cli(*base, *data))
    assert "node 'z' is not in cluster file" in one_line_error(run_cli(*base, *data, "--node", "z"))
    assert "needs a data directory" in one_line_error(run_cli(*base, "--node", "a"))
    assert "has 1 shards" in one_line_error(run_cli(*base, *data, "--node", "a", "--shards", "3"))
    nodes.secret.chmod(0o644)
    assert "chmod 600" in one_line_error(run_cli(*base, *data, "--node", "a"))
    missing = ["serve", "--cluster", str(tmp_path / "nope.toml"), "--node", "a", *data]
    assert "does not exist" in one_line_error(run_cli(*missing))
    assert "is not in" in one_line_error(run_cli("cluster", "add-node", "zz", "--cluster", str(nodes.file)))


# ------------------------------------------------------------- old maps
def test_a_router_with_an_old_map_follows_moved_to_the_owner(three):
    """A router (here in this process, linked over TCP to the three real
    nodes' shards like a fourth node's) whose map is out of date: the shard
    it asks answers MOVED, and the client's answer is still the owner's."""
    import gevent
    from queueserver.engine.status import OK as OK_
    from queueserver.protocols import codec_class
    from queueserver.router.clusterrouter import ClusterRouter
    nodes = three
    router = ClusterRouter.from_config({"file": str(nodes.file), "node": "elsewhere"}, [], {}, 0, 1,
                                       None, False, False)
    codec = codec_class("workq")()

    def ask(line: bytes):
        replies = []
        router.route(codec.receive(line)[0], replies.append)
        with gevent.Timeout(20):
            while not replies:
                gevent.sleep(0.01)
        return replies[0]

    try:
        with gevent.Timeout(20):
            while not all(link.up for link in router.links):
                gevent.sleep(0.05)
        name = name_on(3, "stale")
        slot = slot_of(name)
        id = str(uuid.uuid4())
        with Client(*nodes.address("a")) as a:
            a.add(id, name, b"p", 60_000, 600_000)
        # 1. a shard that never had the slot (no hint): the router asks every shard for its slots
        router.map.owners[slot], router.map.epochs[slot] = 0, 0
        reply = ask(f"inspect queue {name}\r\n".encode())
        assert reply[0] == OK_ and router.map.owners[slot] == 3
        # 2. a former owner's hint: moved to b/0, then the router forgets it
        result = nodes.cli("move", "--slots", f"{slot},{slot}", "--to", "b/0")   # named twice: moved once
        assert result.returncode == 0, result.stderr
        with gevent.Timeout(20):
            while router.map.owners[slot] != 2:   # the giver's news reached it
                gevent.sleep(0.01)
        router.map.owners[slot], router.map.epochs[slot] = 3, 0
        assert ask(f"inspect queue {name}\r\n".encode())[0] == OK_
        assert router.map.owners[slot] == 2
        # 3. a job id the router last saw on its former shard
        router.jobs.place(id, 3)
        reply = ask(f"inspect job {id}\r\n".encode())
        assert reply[0] == OK_
    finally:
        router.stop()
