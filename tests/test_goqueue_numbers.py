"""goqueue's job ids through real servers: server-made 64-bit numbers that
start at 1 on a fresh server whichever shard holds the job (the original
project's own test sequence, on 1, 2 and 3 shards), unique server-wide,
increasing within a queue, never made twice across restarts, and a
``DELETE <id>`` that goes to one shard only."""
from __future__ import annotations

import struct
from collections import defaultdict

import pytest

from inprocess import cluster_factory, leaks, rundir  # noqa: F401 (fixtures)
from inprocess import names_by_shard
from queueserver.jobnumbers import MIN_BLOCK, NumberFile
from queueserver.placement import shard_for
from serverproc import ServerProcess
from test_binary_protocols_server import GoWire, g_add, g_delete, g_reserve, reserved_fields
from wire import qname


def goqueue(proc) -> GoWire:
    return GoWire(proc.connect("goqueue"))


def original_sequence(g: GoWire, queue: str) -> None:
    """The original goqueue's TestAddReserveAndDelete, step by step."""
    reply = g.call(g_add(queue, 1, 60, b"123"))
    assert reply[:6] == b"ADDED\0", reply
    job_id = struct.unpack("<Q", reply[6:])[0]
    assert job_id == 1, f"Expected added job to have ID 1 got {job_id}"
    job = reserved_fields(g.call(g_reserve(queue, 0)))
    assert job[0] == 1, f"Expected reserved job to have ID 1 got {job[0]}"
    assert g.call(g_delete(job_id)) == b"OK\0"


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_the_original_test_sequence_on_a_fresh_server(shards):
    with ServerProcess(shards=shards, protocols=["goqueue"]) as proc:
        g = goqueue(proc)
        original_sequence(g, "queue1")
        g.close()


@pytest.mark.parametrize("shards, shard", [(2, 0), (2, 1), (3, 1), (3, 2)])
def test_the_first_job_is_1_whichever_shard_holds_it(shards, shard):
    queue = next(name for name in (f"queue{i}" for i in range(1000)) if shard_for(name, shards) == shard)
    with ServerProcess(shards=shards, protocols=["goqueue"]) as proc:
        g = goqueue(proc)
        original_sequence(g, queue)
        g.close()


def test_ids_are_unique_and_increase_within_each_queue_across_restarts(tmp_path):
    """Jobs added to six queues over three shards, the server stopped (and
    killed) in between: every id is new, each queue's ids go up, and each
    job is deleted by its id from another connection."""
    proc = ServerProcess(shards=3, protocols=["goqueue"], extra=["--data-dir", str(tmp_path / "data")])
    queues = [qname("g") for _ in range(6)]
    ids = defaultdict(list)
    try:
        proc.start()
        for round in range(3):
            g = goqueue(proc)
            for i in range(3 * MIN_BLOCK):    # several blocks per shard
                queue = queues[i % len(queues)]
                ids[queue].append(g.add(queue, data=b"%d" % i))
            g.close()
            proc.restart(graceful=round != 1)
        every = [id for queue in queues for id in ids[queue]]
        assert len(every) == len(set(every)) == 3 * 3 * MIN_BLOCK
        assert min(every) == 1
        for queue in queues:
            assert ids[queue] == sorted(ids[queue]), queue
        other = goqueue(proc)
        for id in every:
            assert other.call(g_delete(id)) == b"OK\0", id
        never = max(every) + 10 ** 9    # above every block: answered at once
        assert other.call(g_delete(never)) == f"ERROR\0Job {never} already deleted\0".encode()
        assert other.call(g_delete(every[0])) == f"ERROR\0Job {every[0]} already deleted\0".encode()
        other.close()
    finally:
        proc.stop()


def test_a_delete_by_number_goes_to_one_shard_only(cluster_factory):
    """In process: the router finds the shard that made a number in the
    block table, and asks no other."""
    cluster = cluster_factory(shards=3, protocols=("goqueue",))
    g = GoWire(cluster.connect("goqueue"))
    numbers = {}
    for shard, name in enumerate(names_by_shard(3)):
        numbers[shard] = g.add(name)
    links = cluster.router.links
    for shard, number in numbers.items():
        before = [link._next_id for link in links]
        assert g.call(g_delete(number)) == b"OK\0"
        asked = [i for i, link in enumerate(links) if link._next_id != before[i]]
        assert asked == [shard]
    g.close()


def test_the_block_file_survives_a_torn_record(tmp_path):
    """A record cut short by a crash is dropped; the next block starts after
    every whole one, so no number is handed out twice."""
    path = str(tmp_path / "numbers")
    numbers = NumberFile(path)
    assert numbers.allocate(1, 64) == (1, 65)
    assert numbers.allocate(0, 64) == (65, 129)
    with open(path, "ab") as f:
        f.write(b"QN\x01\x00garbage")          # a torn third record
    fresh = NumberFile(path)
    assert fresh.owner(70) == 0 and fresh.owner(3) == 1 and fresh.owner(129) is None
    assert fresh.allocate(2, 128) == (129, 257)
    assert NumberFile(path).owner(200) == 2


def test_a_data_directory_without_a_numbers_file_is_upgraded(tmp_path):
    """A data directory written before blocks (here: its numbers file taken
    away) still finds its jobs by number, asking every shard, and numbers
    new jobs above every old one."""
    data = tmp_path / "data"
    proc = ServerProcess(shards=3, protocols=["goqueue"], extra=["--data-dir", str(data)])
    try:
        proc.start()
        g = goqueue(proc)
        queues = names_by_shard(3)
        old = [g.add(queue) for queue in queues for _ in range(5)]
        g.close()
        proc.stop(); proc = ServerProcess(shards=3, protocols=["goqueue"], extra=["--data-dir", str(data)])
        (data / "numbers").unlink()
        proc.start()
        g = goqueue(proc)
        new = [g.add(queue) for queue in queues]
        assert min(new) > max(old) and len(set(new)) == 3
        for id in old + new:
            assert g.call(g_delete(id)) == b"OK\0", id
        g.close()
    finally:
        proc.stop()
