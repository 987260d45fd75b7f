"""The router in process: a real :class:`Router` in front of two real
:class:`Shard` s, all in this pytest process under gevent, with workq (and
goqueue) clients over loopback TCP.

``cluster.link(i)`` opens a channel to shard ``i`` as another router would:
the tests use it to look at a shard from outside (does it hold this job,
is a lease parked there) without going through the router under test.
"""
from __future__ import annotations

import struct

import gevent
import pytest
from gevent import socket

from inprocess import cluster_factory, leaks, rundir  # noqa: F401 (fixtures)
from inprocess import WAIT, eventually, names_by_shard
from queueserver.engine.status import NOT_FOUND, OK
from queueserver.net.connection import MAY_MOVE, SERVE, ClientConnection
from queueserver.protocols import codec_class
from queueserver.router.router import MAX_MOVES
from queueserver.placement import shard_for
from wire import add, inspect_field, new_id

pytestmark = pytest.mark.usefixtures("leaks")


@pytest.fixture
def cluster(cluster_factory):
    """Two shards behind one router, every request forwarded."""
    return cluster_factory(shards=2)


@pytest.fixture
def direct(cluster_factory):
    """Two shards behind one router, with the direct path."""
    return cluster_factory(shards=2, direct_path=True)


def leased(id: str, name: str, payload: bytes) -> bytes:
    return f"+OK 1\r\n{id} {name} {len(payload)}\r\n".encode() + payload + b"\r\n"


def queue(name: str, ready: int, scheduled: int = 0) -> bytes:
    return f"{name} 2\r\nready-len {ready}\r\nscheduled-len {scheduled}\r\n".encode()


def waiters(link) -> int:
    return link.call("inspect_server")[1]["waiters"]


# ---------------------------------------------------------------- routing
def test_requests_by_queue_name_go_to_the_queues_shard(cluster):
    w = cluster.wire()
    peek = [cluster.link(0), cluster.link(1)]
    for shard, name in enumerate(names_by_shard(2)):
        id = new_id()
        assert w.call(add(id, name, b"x")) == b"+OK\r\n"
        assert peek[shard].call("exists", id) == [OK, None]
        assert peek[1 - shard].call("exists", id)[0] == NOT_FOUND
        assert peek[1 - shard].call("inspect_queue", name)[0] == NOT_FOUND
        assert w.call(f"lease {name} 0\r\n".encode()) == leased(id, name, b"x")


def homed(shard: int, shards: int = 2) -> str:
    """A fresh job id whose home is ``shard``."""
    while True:
        id = new_id()
        if shard_for(id, shards) == shard:
            return id


def test_a_job_id_goes_to_the_shard_that_holds_it(cluster):
    """The router knows where the jobs it carried went; of any other it
    asks the id's home. With shard 0 gone, asking every shard would answer
    shard 0's error: an answer from shard 1 shows where the request went."""
    one = names_by_shard(2)[1]
    w = cluster.wire()
    id = new_id()
    assert w.call(add(id, one)) == b"+OK\r\n"
    assert cluster.router.jobs.shard_of(id) == 1
    made_elsewhere = homed(0)     # by another router: at home on shard 0, which knows it lives on 1
    assert cluster.link(1).call("add", made_elsewhere, one, b"x")[0] == OK
    assert cluster.router.jobs.shard_of(made_elsewhere) is None
    assert inspect_field(w, made_elsewhere, "name") == one.encode()
    assert cluster.router.jobs.shard_of(made_elsewhere) == 1       # learnt from its home
    at_home_on_one = homed(1)
    assert cluster.link(1).call("add", at_home_on_one, one, b"x")[0] == OK
    cluster.shards[0].stop()
    eventually(lambda: not cluster.router.links[0].up, "the router to lose shard 0")
    assert inspect_field(w, id, "name") == one.encode()
    assert inspect_field(w, made_elsewhere, "name") == one.encode()
    assert inspect_field(w, at_home_on_one, "name") == one.encode()
    assert w.call(f"complete {id} 2\r\nok\r\n".encode()) == b"+OK\r\n"
    # an id no job has: its home says so; with its home away, shard 0 might hold it
    assert w.call(f"inspect job {homed(1)}\r\n".encode()) == b"-NOT-FOUND\r\n"
    assert w.call(f"inspect job {homed(0)}\r\n".encode()) == b"-SERVER-ERROR Shard 0 unavailable\r\n"


def test_inspect_queues_merges_both_shards_in_name_order(cluster):
    names = sorted(names_by_shard(2, "m") + names_by_shard(2, "n"))
    w = cluster.wire()
    for i, name in enumerate(names):
        for _ in range(i + 1):
            assert w.call(add(new_id(), name)) == b"+OK\r\n"
    assert w.call(b"inspect queues 0 100\r\n") == \
        b"+OK 4\r\n" + b"".join(queue(name, i + 1) for i, name in enumerate(names))
    assert w.call(b"inspect queues 1 2\r\n") == b"+OK 2\r\n" + queue(names[1], 2) + queue(names[2], 3)


def test_inspect_server_counts_the_routers_clients(cluster):
    w = cluster.wire()
    cluster.wire()
    eventually(lambda: cluster.router.clients == 2, "the router to accept both")
    assert b"\r\nactive-clients 2\r\n" in w.call(b"inspect server\r\n")


# ---------------------------------------------------------- fan-out leases
def test_a_lease_over_two_shards_takes_the_best_job_and_gives_back_the_other(cluster):
    zero, one = names_by_shard(2)
    w = cluster.wire()
    low, high = new_id(), new_id()
    assert w.call(add(low, zero, b"low", flags="-priority=5")) == b"+OK\r\n"
    assert w.call(add(high, one, b"high", flags="-priority=10")) == b"+OK\r\n"
    assert w.call(f"lease {zero} {one} 0\r\n".encode()) == leased(high, one, b"high")
    assert inspect_field(w, low, "state") == b"0"          # ready again, as new
    assert inspect_field(w, low, "attempts") == b"0"       # and never charged
    assert w.call(f"lease {zero} {one} 0\r\n".encode()) == leased(low, zero, b"low")
    assert w.call(f"lease {zero} {one} 0\r\n".encode()) == b"-TIMEOUT\r\n"


def test_a_parked_lease_over_two_shards_keeps_the_first_job_only(cluster):
    zero, one = names_by_shard(2)
    w, other = cluster.wire(), cluster.wire()
    peek = [cluster.link(0), cluster.link(1)]
    w.send(f"lease {zero} {one} 60000\r\n".encode())
    eventually(lambda: [waiters(p) for p in peek] == [1, 1], "the lease to park on both shards")
    id = new_id()
    assert other.call(add(id, one, b"first")) == b"+OK\r\n"
    assert w.reply() == leased(id, one, b"first")
    assert [waiters(p) for p in peek] == [0, 0]            # the other lease was withdrawn
    assert other.call(add(new_id(), zero)) == b"+OK\r\n"
    assert other.call(f"inspect queue {zero}\r\n".encode()) == b"+OK 1\r\n" + queue(zero, 1)


def test_jobs_arriving_on_both_shards_at_once_reach_the_client_once(cluster):
    """Both parked leases take a job before the router can cancel either:
    the client gets one, the other goes back to its queue uncharged."""
    zero, one = names_by_shard(2)
    w, other = cluster.wire(), cluster.wire()
    peek = [cluster.link(0), cluster.link(1)]
    w.send(f"lease {zero} {one} 60000\r\n".encode())
    eventually(lambda: [waiters(p) for p in peek] == [1, 1], "the lease to park on both shards")
    ids = [new_id(), new_id()]
    sent = [peek[0].send("add", ids[0], zero, b"0"), peek[1].send("add", ids[1], one, b"1")]
    assert [peek[i].reply(sent[i])[0] for i in (0, 1)] == [OK, OK]
    reply = w.reply()
    got = ids.index(reply.split(b"\r\n")[1].split(b" ")[0].decode())
    kept = ids[1 - got]
    eventually(lambda: inspect_field(other, kept, "state") == b"0", "the other job to be given back")
    assert inspect_field(other, kept, "attempts") == b"0"
    assert w.call(f"lease {zero} {one} 0\r\n".encode()).split(b"\r\n")[1].startswith(kept.encode())


# ------------------------------------------------------------ shards away
def test_a_shard_that_goes_away_answers_outcome_unknown_in_flight_and_unavailable_after(cluster):
    zero, one = names_by_shard(2)
    idle = names_by_shard(2)[1]
    w, parked = cluster.wire(), cluster.wire()
    kept, lost = new_id(), new_id()
    assert w.call(add(kept, zero, b"kept")) == b"+OK\r\n"
    assert w.call(add(lost, one, b"lost")) == b"+OK\r\n"
    parked.send(f"lease {idle} 60000\r\n".encode())
    eventually(lambda: cluster.router.links[1].pending, "the lease to be sent to shard 1")
    cluster.shards[1].stop()
    # sent, and no answer came: what it did is not known; not sent: certainly not done
    assert parked.reply() == b"-SERVER-ERROR Outcome unknown: shard 1 went down before answering\r\n"
    assert w.call(add(new_id(), one)) == b"-SERVER-ERROR Shard 1 unavailable\r\n"
    assert w.call(f"lease {zero} {one} 0\r\n".encode()) == leased(kept, zero, b"kept")
    assert w.call(f"inspect job {lost}\r\n".encode()) == b"-SERVER-ERROR Shard 1 unavailable\r\n"


def test_a_restarted_shard_is_served_again(cluster):
    one = names_by_shard(2)[1]
    w = cluster.wire()
    cluster.restart_shard(1)
    eventually(lambda: cluster.router.links[1].up, "the router to reconnect")
    id = new_id()
    assert w.call(add(id, one)) == b"+OK\r\n"
    assert cluster.router.jobs.shard_of(id) == 1


# --------------------------------------------------------- clients leaving
def test_a_client_that_leaves_withdraws_its_parked_lease(cluster):
    one = names_by_shard(2)[1]
    gone, w = cluster.wire(), cluster.wire()
    peek = cluster.link(1)
    gone.send(f"lease {one} 60000\r\n".encode())
    eventually(lambda: waiters(peek) == 1, "the lease to park")
    gone.close()
    eventually(lambda: waiters(peek) == 0, "the lease to be withdrawn")
    assert w.call(add(new_id(), one)) == b"+OK\r\n"
    assert w.call(f"inspect queue {one}\r\n".encode()) == b"+OK 1\r\n" + queue(one, 1)


def _exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


@pytest.mark.parametrize("direct_path", [False, True], ids=["forwarded", "direct"])
def test_a_goqueue_clients_reservations_are_ready_again_when_it_leaves(cluster_factory, direct_path):
    cluster = cluster_factory(shards=2, direct_path=direct_path, protocols=("workq", "goqueue"))
    name = names_by_shard(2)[1]
    g = cluster.connect("goqueue")
    g.sendall(b"ADD\0" + name.encode() + b"\0" + struct.pack("<III", 0, 0, 4) + b"held")   # TTP 0: never
    assert _exact(g, 6) == b"ADDED\0"
    _exact(g, 8)
    g.sendall(b"RESERVE\0" + name.encode() + b"\0" + struct.pack("<I", 1))
    assert _exact(g, 9) == b"RESERVED\0"
    w = cluster.wire()
    w.send(f"lease {name} 60000\r\n".encode())
    g.close()
    reply = w.reply()
    assert reply.startswith(b"+OK 1\r\n") and reply.endswith(f" {name} 4\r\nheld\r\n".encode())


# ------------------------------------------------------------ direct path
def where(cluster) -> list:
    """How many connections each shard serves directly."""
    return [served.shard.direct.clients for served in cluster.shards]


def test_a_connection_for_one_shard_is_handed_to_it(direct):
    one = names_by_shard(2)[1]
    w = direct.wire()
    id = new_id()
    assert w.call(add(id, one, b"here")) == b"+OK\r\n"
    assert where(direct) == [0, 1]
    assert direct.router.clients == 1                      # still counted by its router
    assert direct.router.jobs.shard_of(id) is None         # the router never saw it: its home knows
    asker = direct.wire()
    assert inspect_field(asker, id, "name") == one.encode()
    asker.close()
    assert w.call(f"lease {one} 1000\r\n".encode()) == leased(id, one, b"here")
    assert w.call(f"complete {id} 2\r\nok\r\n".encode()) == b"+OK\r\n"
    assert w.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 1 2\r\nok\r\n".encode()
    assert where(direct) == [0, 1]
    w.close()
    eventually(lambda: direct.router.clients == 0, "the router to count the client out")
    assert where(direct) == [0, 0]


def test_a_connection_goes_back_and_on_as_its_requests_change_shards(direct):
    zero, one = names_by_shard(2)
    w = direct.wire()
    id = new_id()
    assert w.call(add(id, one)) == b"+OK\r\n"
    assert where(direct) == [0, 1]
    assert w.call(f"inspect queue {zero}\r\n".encode()) == b"-NOT-FOUND\r\n"
    assert where(direct) == [1, 0]                         # back to the router, on to shard 0
    assert inspect_field(w, id, "name") == one.encode()    # a job shard 0 does not hold
    assert where(direct) == [0, 0]                         # forwarded by the router


def test_a_connection_moves_at_most_max_moves_times(direct):
    zero, one = names_by_shard(2)
    w = direct.wire()
    for i in range(MAX_MOVES + 2):
        assert w.call(add(new_id(), (zero, one)[i % 2])) == b"+OK\r\n"
    # router -> 0, 0 -> router -> 1, 1 -> router: four moves, then forwarded
    assert where(direct) == [0, 0]
    assert w.call(f"inspect queue {zero}\r\n".encode()) == b"+OK 1\r\n" + queue(zero, 3)
    assert where(direct) == [0, 0]


def test_a_connection_with_a_request_in_flight_stays_where_it_is(direct):
    """The ``add`` comes in one write after a request the router serves:
    with that answer still to come, the router serves the ``add`` too."""
    one = names_by_shard(2)[1]
    w = direct.wire()
    w.send(b"inspect queues 0 10\r\n" + add(new_id(), one))
    assert w.reply() == b"+OK 0\r\n"
    assert w.reply() == b"+OK\r\n"
    assert where(direct) == [0, 0]
    assert w.call(add(new_id(), one)) == b"+OK\r\n"   # nothing in flight now: it moves
    assert where(direct) == [0, 1]


def test_pipelined_requests_across_shards_are_answered_once_in_order(direct):
    zero, one = names_by_shard(2)
    w = direct.wire()
    ids = [new_id() for _ in range(6)]
    stream = b"".join(add(id, (zero, one)[i % 2], f"p{i}".encode()) for i, id in enumerate(ids))
    stream += f"inspect queue {zero}\r\n".encode()
    stream += f"lease {zero} {one} 1000\r\n".encode() * 6
    stream += f"delete {ids[0]}\r\n".encode()
    w.send(stream)
    assert [w.reply() for _ in ids] == [b"+OK\r\n"] * 6
    assert w.reply() == b"+OK 1\r\n" + queue(zero, 3)
    leases = [w.reply() for _ in ids]
    assert sorted(reply.split(b"\r\n")[1].split(b" ")[0].decode() for reply in leases) == sorted(ids)
    assert w.reply() == b"+OK\r\n"


def test_a_direct_client_that_leaves_withdraws_its_parked_lease(direct):
    one, other_one = names_by_shard(2)[1], names_by_shard(2)[1]
    gone = direct.wire()
    assert gone.call(add(new_id(), one)) == b"+OK\r\n"
    peek = direct.link(1)
    gone.send(f"lease {other_one} 60000\r\n".encode())
    eventually(lambda: waiters(peek) == 1, "the lease to park")
    gone.close()
    eventually(lambda: direct.router.clients == 0, "the router to count the client out")
    assert waiters(peek) == 0
    w = direct.wire()
    assert w.call(add(new_id(), other_one)) == b"+OK\r\n"
    assert w.call(f"inspect queue {other_one}\r\n".encode()) == b"+OK 1\r\n" + queue(other_one, 1)


@pytest.mark.parametrize("direct_path", [False, True], ids=["forwarded", "direct"])
def test_a_request_sent_just_before_the_client_closes_is_executed(cluster_factory, direct_path):
    """A fire-and-forget producer: it writes an ``add`` and closes at once."""
    cluster = cluster_factory(shards=2, direct_path=direct_path)
    one = names_by_shard(2)[1]
    client = cluster.connect()
    id = new_id()
    client.sendall(add(id, one))
    client.shutdown(socket.SHUT_WR)
    with gevent.Timeout(WAIT):
        while client.recv(100):
            pass   # the server closes once it saw the client leave
    eventually(lambda: cluster.router.clients == 0, "the router to count the client out")
    assert cluster.link(1).call("exists", id) == [OK, None]


def test_the_router_hands_over_only_what_one_shard_can_serve(direct):
    """``Router.placement``: a request for one shard's queues may move its
    connection, unless it moved enough or the request needs the router
    (several shards, a job id, every shard, an id another shard holds)."""
    zero, one = names_by_shard(2)
    zero_too = names_by_shard(2)[0]
    router = direct.router
    ours, theirs = socket.socketpair()
    try:
        connection = ClientConnection(router, ours, codec_class("workq")(), "workq")

        def placement(data: bytes) -> int:
            (command,) = connection.codec.receive(data)
            return router.placement(connection, command)

        assert placement(add(new_id(), one)) == MAY_MOVE
        assert placement(f"lease {zero} {zero_too} 0\r\n".encode()) == MAY_MOVE
        assert placement(f"lease {zero} {one} 0\r\n".encode()) == SERVE
        assert placement(f"inspect job {new_id()}\r\n".encode()) == SERVE
        assert placement(b"inspect queues 0 10\r\n") == SERVE
        connection.moves = MAX_MOVES
        assert placement(add(new_id(), one)) == SERVE
    finally:
        ours.close()
        theirs.close()


def test_shards_without_a_handoff_socket_keep_connections_forwarded(cluster_factory):
    cluster = cluster_factory(shards=2, direct_path=True, shard_direct_path=False)
    one = names_by_shard(2)[1]
    w = cluster.wire()
    assert w.call(add(new_id(), one)) == b"+OK\r\n"
    assert where(cluster) == [0, 0]
    assert w.call(f"inspect queue {one}\r\n".encode()) == b"+OK 1\r\n" + queue(one, 1)
