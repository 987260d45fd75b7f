"""The shard's link protocol, in process: a real :class:`Shard` serving on a
Unix socket in a temporary directory, driven frame by frame through
:class:`FrameChannel` s, as routers drive it.

Each channel plays one router. Frames on one channel are handled in order,
so "this request was answered" proves that every frame sent before it on
the same channel was handled too: that is how a test knows a lease is
parked or a control frame (which gets no answer) has taken effect.
"""
from __future__ import annotations

import struct

import pytest

from inprocess import WAIT, LinkClient, eventually, names_by_shard
from inprocess import leaks, link_factory, rundir, shard_factory  # noqa: F401 (fixtures)
from queueserver.engine.job import LEASED, PENDING
from queueserver.engine.requests import in_queue
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, TIMEOUT
from queueserver.engine.views import JobView, as_lease
from queueserver.net.connection import MUST_MOVE, SERVE
from queueserver.protocols import codec_class
from queueserver.placement import shard_for
from wire import add, new_id as fresh_id

pytestmark = pytest.mark.usefixtures("leaks")

@pytest.fixture
def shard(shard_factory):
    """Shard 1 of 2 (so job numbers show its residue class)."""
    return shard_factory(index=1, shards=2)


@pytest.fixture
def link(link_factory, shard):
    return link_factory(shard)


@pytest.fixture
def other(link_factory, shard):
    """A second router's channel to the same shard."""
    return link_factory(shard)


def new_id() -> str:
    """A fresh id at home on shard 1 of 2 (the shard under test: no claim
    goes to shard 0, which these tests do not serve)."""
    while True:
        id = fresh_id()
        if shard_for(id, 2) == 1:
            return id


def added(reply: list) -> str:
    assert reply[0] == OK, reply
    return reply[1][0]


def state(link: LinkClient, id: str) -> int:
    reply = link.call("inspect_job", id)
    assert reply[0] == OK, reply
    return JobView(*reply[1]).state


# ------------------------------------------------------------------ hello
def test_hello_names_the_shard_and_lists_no_jobs(shard, link_factory):
    """Routers learn where jobs are from answers and ids' homes, not from a list."""
    first = link_factory(shard)
    added(first.call("add", new_id(), "q", b"x"))
    assert link_factory(shard).hello == {"shard": 1}


# --------------------------------------------------------------- requests
def test_add_lease_complete_and_result_frames(link):
    first, second = new_id(), new_id()
    assert link.call("add", first, "q", b"ping") == [OK, [first, 1]]   # the first block of a fresh server
    assert link.call("add", second, "q", b"pong") == [OK, [second, 2]]
    reply = link.call("lease", ["q"], 0)
    assert reply[0] == OK
    view = as_lease(reply[1])
    assert (view.id, view.name, view.payload, view.number, view.attempts, view.shard) == \
        (first, "q", b"ping", 1, 1, 1)
    assert state(link, first) == LEASED
    assert link.call("complete", first, b"done") == [OK, None]
    assert link.call("complete", first, b"again") == [CLIENT_ERROR, "Duplicate result"]
    assert link.call("result", first, 0) == [OK, [first, 1, b"done"]]
    assert as_lease(link.call("lease", ["q"], 0)[1]).id == second
    assert link.call("lease", ["q"], 0) == [TIMEOUT, ""]


def test_a_job_named_for_one_queue_only_is_not_reached_in_another(link):
    """What a router sends for a client its access rules allow on some
    queues only, once it has asked the job's queue (``requests.in_queue``):
    if meanwhile the job was deleted and one with the same id made in
    another queue, that one is not found, not acted on."""
    id = added(link.call("add", new_id(), "elsewhere", b"x"))
    other, number = link.call("add", new_id(), "elsewhere", b"y")[1]
    assert link.call("delete", *in_queue([id], "allowed")) == [NOT_FOUND, ""]
    assert link.call("delete_number", *in_queue([number], "allowed")) == [NOT_FOUND, ""]
    assert link.call("inspect_job", id)[0] == OK == link.call("inspect_job", other)[0]   # untouched
    assert link.call("delete", *in_queue([id], "elsewhere"))[0] == OK              # its own queue: served
    assert link.call("delete_number", *in_queue([number], "elsewhere"))[0] == OK
    assert link.call("inspect_job", id) == [NOT_FOUND, ""] == link.call("inspect_job", other)
    assert link.call("delete", *in_queue([fresh_id()], "allowed")) == [NOT_FOUND, ""]


def test_a_frame_that_cannot_be_served_costs_only_that_frame(link):
    assert link.call("no_such_op") == [CLIENT_ERROR, "Unknown command"]
    assert link.call("add", new_id()) == [SERVER_ERROR, "TypeError"]   # too few arguments
    link.channel.send([99, "size"])                                    # not [id, op, args]
    assert link.call("size", "q") == [OK, 0]
    assert link.stray == [] and link.order == [1, 2, 3]                # 99 never answered


def test_undecodable_bytes_drop_that_channel_only(link, other):
    other.channel.sock.sendall(b"\xc1")   # a byte msgpack never uses
    assert other.eof.wait(timeout=WAIT)
    id = new_id()
    assert added(link.call("add", id, "q", b"x")) == id


# ------------------------------------------------------------ parked leases
def test_a_parked_lease_is_answered_by_an_add_on_another_channel(link, other):
    waiting = link.send("lease", ["q"], None)
    assert link.call("size", "q") == [OK, 0]      # answered after it: the lease is parked
    assert not link.answered(waiting)
    id = added(other.call("add", new_id(), "q", b"x"))
    view = as_lease(link.reply(waiting)[1])
    assert (view.id, view.attempts) == (id, 1)
    assert other.call("size", "q") == [OK, 0]


def test_cancel_answers_the_withdrawn_lease_with_timeout(link, other):
    waiting = link.send("lease", ["q"], None)
    link.call("size", "q")
    other.notify("cancel", waiting)               # the same id, but another router's: no effect
    link.notify("cancel", waiting)
    assert link.reply(waiting) == [TIMEOUT, ""]
    added(other.call("add", new_id(), "q", b"x"))
    assert other.call("size", "q") == [OK, 1]     # nobody took it


def test_cancel_from_another_channel_leaves_the_lease_parked(link, other):
    waiting = link.send("lease", ["q"], None)
    link.call("size", "q")
    other.notify("cancel", waiting)
    id = added(other.call("add", new_id(), "q", b"x"))
    assert as_lease(link.reply(waiting)[1]).id == id


def test_the_timer_answers_wait_timeouts_earliest_first(link):
    """A shorter wait parked after a longer one re-arms the shard's one timer."""
    long = link.send("lease", ["a"], 600000)
    link.call("size", "a")
    short = link.send("lease", ["b"], 1)
    assert link.reply(short) == [TIMEOUT, ""]
    assert not link.answered(long)


# ---------------------------------------------------------- owners leaving
def test_closed_readies_the_jobs_leased_to_that_owner_only(link, other):
    """goqueue's close semantics: ``closed`` names a client connection of
    that channel's router; what it held is ready again, charged an attempt."""
    first = added(link.call("add", new_id(), "q", b"1"))
    second = added(link.call("add", new_id(), "q", b"2"))
    third = added(link.call("add", new_id(), "q", b"3"))
    assert as_lease(link.call("lease", ["q"], 0, 7)[1]).id == first     # owner 7
    assert as_lease(link.call("lease", ["q"], 0, 8)[1]).id == second    # owner 8
    assert as_lease(link.call("lease", ["q"], 0)[1]).id == third        # no owner
    waiting = other.send("lease", ["q"], None)
    other.notify("closed", 8)                     # another router's connection 8: not ours
    assert other.call("size", "q") == [OK, 0]
    link.notify("closed", 7)
    view = as_lease(other.reply(waiting)[1])
    assert (view.id, view.attempts) == (first, 2)
    link.notify("closed", 7)                      # twice: nothing more to give back
    assert link.call("size", "q") == [OK, 0]
    assert state(link, second) == LEASED
    assert state(link, third) == LEASED


def test_a_channel_that_closes_releases_its_waiters_and_owned_leases(link, other):
    """Its router died: so did every connection it served."""
    held = added(link.call("add", new_id(), "owned", b"x"))
    assert as_lease(link.call("lease", ["owned"], 0, 3)[1]).id == held
    unowned = added(link.call("add", new_id(), "plain", b"x"))
    assert as_lease(link.call("lease", ["plain"], 0)[1]).id == unowned
    link.send("lease", ["parked"], None)
    link.call("size", "parked")
    assert other.call("inspect_server")[1]["waiters"] == 1
    link.close()
    eventually(lambda: other.call("inspect_server")[1]["waiters"] == 0, "the waiter to be withdrawn")
    assert state(other, held) == PENDING
    assert other.call("size", "owned") == [OK, 1]
    assert state(other, unowned) == LEASED   # a workq lease runs its TTR
    added(other.call("add", new_id(), "parked", b"x"))
    assert other.call("size", "parked") == [OK, 1]                  # not handed to the dead waiter


# --------------------------------------------------------- shard events
@pytest.mark.parametrize("direct_path", [False, True])
def test_nobody_hears_of_jobs_made_or_gone(shard_factory, link_factory, direct_path):
    """No note per job to any router, however many are linked, with the
    direct path or not."""
    served = shard_factory(index=0, shards=1, direct_path=direct_path)
    only, second = link_factory(served), link_factory(served)
    id = added(only.call("add", new_id(), "q", b"x"))
    assert only.call("delete", id) == [OK, None]
    added(only.call("add", new_id(), "q", b"x", 0, 0, 1))    # TTL 1 ms: the timer removes it
    eventually(lambda: only.call("size", "q") == [OK, 0], "the job to expire")
    assert only.events_so_far() == [] and second.events_so_far() == []


def test_routers_client_counts_are_merged_into_inspect_server(shard, link, other):
    link.notify("router", 0)
    link.notify("clients", [0, 5])
    link.call("size", "q")
    other.notify("router", 1)
    other.notify("clients", [1, 3])
    assert sorted(other.call("inspect_server")[1]["router-clients"]) == [[0, 5], [1, 3]]
    link.notify("clients", [0, 6])                # a newer count replaces the older
    assert sorted(link.call("inspect_server")[1]["router-clients"]) == [[0, 6], [1, 3]]
    other.close()
    eventually(lambda: link.call("inspect_server")[1]["router-clients"] == [[0, 6]],
               "the closed router's count to go")


# ---------------------------------------------------- direct path placement
def test_the_direct_server_serves_alone_only_what_lives_here(shard_factory, link_factory):
    """``DirectServer.placement``: its own queues, jobs it holds and numbers
    of its blocks are served here; anything else must move."""
    served = shard_factory(index=1, shards=2, direct_path=True)
    theirs, mine = names_by_shard(2)
    mine_too = names_by_shard(2)[1]
    held = added(link_factory(served).call("add", new_id(), mine, b"x"))
    direct = served.shard.direct

    def placement(protocol: str, data: bytes) -> int:
        (command,) = codec_class(protocol)().receive(data)
        return direct.placement(None, command)

    assert placement("workq", add(new_id(), mine)) == SERVE
    assert placement("workq", add(new_id(), theirs)) == MUST_MOVE
    assert placement("workq", f"lease {mine} {mine_too} 1000\r\n".encode()) == SERVE
    assert placement("workq", f"lease {mine} {theirs} 1000\r\n".encode()) == MUST_MOVE
    assert placement("workq", f"complete {held} 0\r\n\r\n".encode()) == SERVE
    assert placement("workq", f"inspect job {new_id()}\r\n".encode()) == MUST_MOVE
    assert placement("workq", b"inspect queues 0 10\r\n") == MUST_MOVE
    assert placement("workq", b"inspect server\r\n") == MUST_MOVE
    # its job took the server's first block of numbers, 1..64; nobody's block holds 65 yet
    for number, where in [(1, SERVE), (64, SERVE), (65, MUST_MOVE), (10 ** 6, MUST_MOVE)]:
        assert placement("goqueue", b"DELETE\0" + struct.pack("<Q", number)) == where, number
