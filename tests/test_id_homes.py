"""Job ids at home on a shard, through real processes: an id stays unique
server-wide even when two adds race on two shards, any router finds any
job by its id with no news of jobs sent to routers, and a shard that
restarts (losing what its home knew) still keeps ids unique."""
from __future__ import annotations


import pytest

from queueserver.placement import shard_for
from serverproc import ServerProcess, replies_across_shard_restart, wait_for
from inprocess import names_by_shard
from wire import Wire, add, inspect_field, new_id, racing_adds


def homed(shard: int, shards: int) -> str:
    while True:
        id = new_id()
        if shard_for(id, shards) == shard:
            return id


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(shards=3, protocols=["workq"], extra=["--routers", "2"]).start()
    yield proc
    proc.stop()


def test_two_adds_of_one_id_racing_on_two_shards_are_one_job(server):
    """Two clients add the same id at the same instant to queues of two
    shards (homes spread over all three): one add wins, the other is
    ``Duplicate job``, and one job has the id."""
    names = names_by_shard(3)
    first, second = Wire(server.connect()), Wire(server.connect())
    for round in range(150):
        id = new_id()
        replies = racing_adds(id, (first, names[round % 3]), (second, names[(round + 1) % 3]))
        assert sorted(replies.values()) == [b"+OK\r\n", b"-CLIENT-ERROR Duplicate job\r\n"], replies
        winner = next(name for name, reply in replies.items() if reply == b"+OK\r\n")
        assert inspect_field(first, id, "name") == winner.encode()
        assert first.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
    first.close()
    second.close()


def test_any_connection_finds_any_job_by_id(server):
    """Jobs added over connections that two routers share are completed,
    read and deleted by id over other connections, whichever router or
    shard serves them."""
    names = names_by_shard(3)
    producers = [Wire(server.connect()) for _ in range(4)]
    ids = []
    for i in range(60):
        id = new_id()
        assert producers[i % 4].call(add(id, names[i % 3], b"job")) == b"+OK\r\n"
        ids.append(id)
    workers = [Wire(server.connect()) for _ in range(4)]
    for i, id in enumerate(ids):
        worker = workers[(i + 1) % 4]
        assert worker.call(f"complete {id} 4\r\ndone\r\n".encode()) == b"+OK\r\n"
        assert workers[(i + 2) % 4].call(f"result {id} 0\r\n".encode()) == \
            f"+OK 1\r\n{id} 1 4\r\ndone\r\n".encode()
        assert workers[(i + 3) % 4].call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
        assert worker.call(f"delete {id}\r\n".encode()) == b"-NOT-FOUND\r\n"
    for wire in producers + workers:
        wire.close()


def test_an_id_is_free_again_once_its_job_is_gone(server):
    names = names_by_shard(3)
    w = Wire(server.connect())
    id = homed(0, 3)
    assert w.call(add(id, names[1])) == b"+OK\r\n"         # lives on shard 1, at home on shard 0
    assert w.call(add(id, names[2])) == b"-CLIENT-ERROR Duplicate job\r\n"
    assert w.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
    wait_for(lambda: w.call(add(id, names[2])) == b"+OK\r\n", 10, "the id to be free again")
    assert inspect_field(w, id, "name") == names[2].encode()
    w.close()


def test_a_home_that_restarts_still_knows_its_ids(tmp_path):
    """Shard 0 is the home of an id whose job lives on shard 1; killed and
    restarted, it learns it again from shard 1, so the id stays taken."""
    proc = ServerProcess(shards=2, protocols=["workq"], extra=["--data-dir", str(tmp_path / "d")]).start()
    try:
        zero, one = names_by_shard(2)
        w = Wire(proc.connect())
        id = homed(0, 2)
        assert w.call(add(id, one)) == b"+OK\r\n"

        def ask() -> bytes:   # a new connection each time: one served by the killed shard dies with it
            asking = Wire(proc.connect())
            try:
                return asking.call(add(id, zero))
            except ConnectionError:
                return b"-SERVER-ERROR connection lost\r\n"
            finally:
                asking.close()

        replies = replies_across_shard_restart(proc, 0, ask, lambda reply: not reply.startswith(b"-SERVER-ERROR"))
        assert replies[-1] == b"-CLIENT-ERROR Duplicate job\r\n"
        w.close()
        w = Wire(proc.connect())
        assert inspect_field(w, id, "name") == one.encode()
        w.close()
    finally:
        proc.stop()


def test_jobs_made_while_their_home_restarts_are_found_by_id_after(tmp_path):
    """Shard 0, the home of some ids, is killed: adds of such ids to shard
    1's queues go on unchecked (a home known to be down holds no add), and
    once shard 0 is back each of those jobs is found by id from any
    connection, and its id refused as a duplicate."""
    proc = ServerProcess(shards=2, protocols=["workq"], extra=["--data-dir", str(tmp_path / "d")]).start()
    try:
        zero, one = names_by_shard(2)
        w = Wire(proc.connect())
        assert w.call(add(homed(0, 2), one)) == b"+OK\r\n"   # shard 1's link to its home is up
        made = []

        def ask() -> bytes:   # adds of ids homed on the restarting shard, to shard 1's queue
            id = homed(0, 2)
            asking = Wire(proc.connect())   # a new one each time: one moved to the killed shard dies with it
            try:
                if asking.call(add(id, one)) == b"+OK\r\n":
                    made.append(id)
                return asking.call(f"inspect queue {zero}\r\n".encode())   # answered once shard 0 serves again
            except ConnectionError:
                return b"-SERVER-ERROR connection lost\r\n"
            finally:
                asking.close()

        replies_across_shard_restart(proc, 0, ask, lambda reply: not reply.startswith(b"-SERVER-ERROR"))
        for _ in range(5):
            ask()
        assert len(made) >= 5
        for id in made:
            other = Wire(proc.connect())   # a new connection: it knows nothing of the job
            wait_for(lambda: inspect_field(other, id, "name") == one.encode(), 10, f"job {id} to be found")
            assert other.call(add(id, zero)) == b"-CLIENT-ERROR Duplicate job\r\n"
            assert other.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
            other.close()
        w.close()
    finally:
        proc.stop()


@pytest.mark.parametrize("durable", [False, True])
def test_a_shard_that_restarts_leaves_its_ids_right(tmp_path, durable):
    """Shard 1 holds jobs when it is killed with SIGKILL. In memory, it comes
    back empty: its jobs' ids are free again on any shard (nothing it left
    behind stands in the way). Durable, it recovers them: their ids stay
    taken, from every shard."""
    extra = ["--data-dir", str(tmp_path / "d")] if durable else []
    proc = ServerProcess(shards=2, protocols=["workq"], extra=extra).start()
    try:
        zero, one = names_by_shard(2)
        w = Wire(proc.connect())
        ids = [new_id() for _ in range(20)]
        for id in ids:
            assert w.call(add(id, one)) == b"+OK\r\n"
        w.close()

        def ask() -> bytes:
            asking = Wire(proc.connect())
            try:
                return asking.call(f"inspect queue {one}\r\n".encode())
            except ConnectionError:
                return b"-SERVER-ERROR connection lost\r\n"
            finally:
                asking.close()

        replies_across_shard_restart(proc, 1, ask, lambda reply: not reply.startswith(b"-SERVER-ERROR"))
        w = Wire(proc.connect())
        expected = b"-CLIENT-ERROR Duplicate job\r\n" if durable else b"+OK\r\n"
        assert [w.call(add(id, zero)) for id in ids] == [expected] * len(ids)
        w.close()
    finally:
        proc.stop()
