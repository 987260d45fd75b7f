"""Slot moves on a cluster with etcd: a command writes its plan and each
step to etcd, drives it on a lease, and when it dies (kill -9, or the giver's
whole node with it) a node's supervisor finishes the plan by itself; the
slot map's record in etcd follows every move; a second command is refused
while a plan is left. Real nodes (127.0.0.1, .2, .3), a real etcd."""
from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import List

import pytest

from cluster_nodes import Nodes, ensure_loopback_aliases
from crash_history import History, Load, drain, drain_limit
from etcd_server import EtcdServer, etcd  # noqa: F401 (the fixture)
from queueserver.cluster import slotstore
from queueserver.cluster.clusterfile import EtcdSpec, load_cluster
from queueserver.cluster.coordination import Etcd
from queueserver.cluster.intents import Intents, read
from queueserver.placement import SLOTS, slot_of
from serverproc import one_line_error, wait_for

PREFIX = "/qs-moves"
#: shards (1, 1, 1), c joining: a/0 serves slots 0-8191, b/0 8192-16383; a
#: rebalance gives c/0 a's highest 2730 and b's highest 2731
GIVEN = (range(5462, 8192), range(8192 + 5461, SLOTS))


def _names() -> List[str]:
    """Queues whose slots move (from a, from b) and some whose slots stay."""
    names: List[str] = []
    wanted = [(GIVEN[0], 5), (GIVEN[1], 5), (range(0, 5462), 3), (range(8192, 8192 + 5461), 3)]
    i = 0
    for slots, count in wanted:
        found = 0
        while found < count:
            i += 1
            if slot_of(f"mv-{i}") in slots:
                names.append(f"mv-{i}")
                found += 1
    return names


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdServer):   # type: ignore[no-untyped-def]
    ensure_loopback_aliases()
    with Nodes(tmp_path, shards=(1, 1, 1), protocols=["workq", "takeanumber"], joiners=("c",)) as nodes:
        with open(nodes.file, "a") as f:
            f.write(f'[etcd]\nendpoints = ["{etcd.endpoint}"]\nprefix = "{PREFIX}"\nlease_ttl = 2\n')
        nodes.start()
        client = Etcd(EtcdSpec((etcd.endpoint,), PREFIX, 2))
        try:
            yield nodes, client
        finally:
            client.close()


def _kill(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGKILL)
    out, _ = process.communicate(timeout=30)
    return out


def _wait_intents(client: Etcd, condition, what: str, timeout: float = 60) -> Intents:   # type: ignore[no-untyped-def]
    found: List[Intents] = []

    def seen() -> bool:
        found[:] = [read(client)]
        return bool(condition(found[0]))

    wait_for(seen, timeout, what)
    return found[0]


def _balanced_and_agreed(nodes: Nodes, client: Etcd) -> None:
    """No plan or move left in etcd; the shards serve an even split, none
    moving; etcd's slot map says what they serve; status is clean."""
    _wait_intents(client, lambda i: i.plan is None and not i.under_way and i.driver is None,
                  "the plan to be finished and gone", timeout=120)
    rows = nodes.status()
    assert sorted(row["slots"] for row in rows) == [5461, 5461, 5462], rows
    assert all(row["up"] and not row["moving"] for row in rows), rows
    table, _ = slotstore.read(client)
    assert table is not None
    from queueserver.cluster.admin import Cluster   # (gevent's links: loaded only here, as test_cluster does)
    served = {}
    cluster = Cluster(load_cluster(str(nodes.file)))
    try:
        for shard in cluster.shards:
            for start, end, _ in cluster.call(shard.ordinal, "slots", [])["served"]:
                served.update(dict.fromkeys(range(start, end), shard.ordinal))
    finally:
        cluster.close()
    assert len(served) == SLOTS and all(table.owners[slot] == owner for slot, owner in served.items())
    result = nodes.cli("status")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "slot map in etcd: agrees" in result.stdout and "moves:" not in result.stdout, result.stdout


def _served_once(history: History, nodes: Nodes, names: List[str]) -> None:
    """Every acknowledged job comes out exactly once (nobody leased before:
    the drain is the only taker)."""
    host, port = nodes.address("c")
    drained = drain(port, names, host=host, limit=drain_limit(len(history.attempted)))
    verdict = history.check(drained)
    assert verdict.acknowledged > 50, verdict.summary()
    assert not verdict.lost and not verdict.unexpected, verdict.summary()
    assert max(Counter(drained).values()) == 1, verdict.summary()


@pytest.mark.timeout(300)
def test_a_rebalance_killed_midway_is_finished_by_a_supervisor(cluster) -> None:   # type: ignore[no-untyped-def]
    nodes, client = cluster
    names = _names()
    history = History()
    load = Load(history, lambda: nodes.procs["a"].ports, names, host=nodes.host["a"]).start(workers=0)
    mover = None
    try:
        wait_for(lambda: len(history.acked) > 20, 20, "jobs added before the move")
        mover = nodes.cli_process("rebalance", "--batch", "64")
        first = _wait_intents(client, lambda i: i.plan is not None, "the plan in etcd")
        # The plan holds the moves *left*: 86 when written (2730/64 + 2731/64, rounded up),
        # one or two fewer if the mover finished some before this poll read it (a loaded CI box).
        planned = len(first.plan["moves"])
        assert 84 <= planned <= 86 and first.driver is not None, first
        assert all(sum(end - start for start, end in move["ranges"]) <= 64 for move in first.plan["moves"]), first
        _wait_intents(client, lambda i: i.plan is not None and len(i.plan["moves"]) <= planned - 3,
                      "three moves done")
        out = _kill(mover)
        load.stop()
        assert "moved 64 slots" in out, out
        left = read(client)
        assert left.plan is not None and 0 < len(left.plan["moves"]) < planned, left
        _balanced_and_agreed(nodes, client)
    finally:
        load.stop()
        if mover is not None and mover.poll() is None:
            _kill(mover)
    logs = "".join(nodes.log(n) for n in "abc")
    assert logs.count("resumes them") >= 1 and "resume done" in logs, logs[-3000:]
    assert "Traceback" not in logs
    _served_once(history, nodes, names)


@pytest.mark.timeout(300)
def test_the_givers_node_killed_with_the_command_midmove_is_finished_once_back(cluster) -> None:   # type: ignore[no-untyped-def]
    nodes, client = cluster
    names = _names()
    history = History()
    load = Load(history, lambda: nodes.procs["c"].ports, names, host=nodes.host["c"]).start(workers=0)
    mover = None
    try:
        wait_for(lambda: len(history.acked) > 20, 20, "jobs added before the move")
        mover = nodes.cli_process("rebalance", "--batch", "64")
        # b/0 (ordinal 1) gives its slots after a/0: once one of its moves is
        # under way, the command dies, then b's whole node, both by SIGKILL
        _wait_intents(client, lambda i: any(m["giver"] == 1 for m in i.under_way.values()),
                      "a move from b/0 under way", timeout=120)
        _kill(mover)
        frozen = read(client)
        nodes.kill("b")
        load.stop()
        assert frozen.plan is not None and any(m["giver"] == 1 for m in frozen.plan["moves"]), frozen
        nodes.start("b")
        _balanced_and_agreed(nodes, client)
    finally:
        load.stop()
        if mover is not None and mover.poll() is None:
            _kill(mover)
    logs = "".join(nodes.log(n) for n in "abc")
    assert "resumes them" in logs and "Traceback" not in logs
    for epoch in frozen.under_way:   # (none only if the command died between two moves)
        assert f"the move of epoch {epoch}" in logs, logs[-3000:]
    _served_once(history, nodes, names)


def test_a_command_is_refused_while_a_live_driver_moves_slots(cluster) -> None:   # type: ignore[no-untyped-def]
    nodes, client = cluster
    mover = nodes.cli_process("rebalance", "--batch", "16")
    try:
        _wait_intents(client, lambda i: i.plan is not None and i.driver is not None, "the plan in etcd")
        refused = one_line_error(nodes.cli("move", "--slots", "1", "--to", "c/0"))
        assert "refused: a rebalance" in refused and "driven by rebalance" in refused, refused
        out, _ = mover.communicate(timeout=300)
        assert mover.returncode == 0, out
    finally:
        if mover.poll() is None:
            _kill(mover)
    _balanced_and_agreed(nodes, client)
    again = nodes.cli("resume")
    assert again.returncode == 0 and "nothing to resume" in again.stdout, again.stdout + again.stderr
    assert "resumes them" not in "".join(nodes.log(n) for n in "abc")
