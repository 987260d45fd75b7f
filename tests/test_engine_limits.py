"""Engine rules that bound what one client can cost everyone: unused queues
go away, the number of queues is capped, jobs leased to an owner come back
when it goes, and errors are fresh objects. A fake clock in microseconds."""
from __future__ import annotations

from engine_helpers import Engine
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, TIMEOUT

T0 = 1_700_000_000_000_000
SEC = 1_000_000


def add(e, id, name="q", now=T0, **kw):
    args = dict(id=id, name=name, payload=b"p", priority=0, ttr=0, ttl=0, max_attempts=-1,
                max_fails=0, sched=None, unique=False)
    args.update(kw)
    return e.execute("add", tuple(args.values()), now)


def lease(e, names, timeout=0, now=T0, token=(1, 1), owner=None):
    args = (list(names), timeout) if owner is None else (list(names), timeout, owner)
    return e.execute("lease", args, now, token)


def queue_names(e):
    return sorted(e.queues)


# ------------------------------------------------------------- unused queues
def test_queue_unused_for_the_idle_time_is_removed():
    e = Engine(queue_idle=10 * SEC)
    add(e, "a", name="busy")
    assert lease(e, ["empty"])[0] == TIMEOUT          # a lease creates an empty queue
    assert queue_names(e) == ["busy", "empty"]
    assert e.next_deadline() == T0 + 10 * SEC
    e.advance(T0 + 10 * SEC - 1)
    assert queue_names(e) == ["busy", "empty"]
    e.advance(T0 + 10 * SEC)
    assert queue_names(e) == ["busy"]                 # a queue holding a job stays


def test_idle_time_starts_when_the_last_job_leaves():
    e = Engine(queue_idle=10 * SEC)
    add(e, "a")
    e.advance(T0 + 60 * SEC)
    assert queue_names(e) == ["q"]
    e.execute("delete", ("a",), T0 + 60 * SEC)
    e.advance(T0 + 69 * SEC)
    assert queue_names(e) == ["q"]
    e.advance(T0 + 70 * SEC)
    assert queue_names(e) == []


def test_a_queue_used_again_is_not_removed_on_its_old_deadline():
    e = Engine(queue_idle=10 * SEC)
    lease(e, ["q"])
    add(e, "a", now=T0 + 5 * SEC)
    e.execute("delete", ("a",), T0 + 8 * SEC)
    e.advance(T0 + 10 * SEC)
    assert queue_names(e) == ["q"]
    e.advance(T0 + 18 * SEC)
    assert queue_names(e) == []


def test_a_queue_with_a_waiter_or_a_leased_or_finished_job_stays():
    e = Engine(queue_idle=SEC)
    assert lease(e, ["waited"], timeout=None, token=(1, 9)) is None
    add(e, "l", name="leased")
    assert lease(e, ["leased"])[0] == OK
    add(e, "f", name="finished", ttl=3_600_000)   # (a job with no TTL keeps no result)
    lease(e, ["finished"])
    e.execute("complete", ("f", b"r"), T0)
    e.advance(T0 + 60 * SEC)
    assert queue_names(e) == ["finished", "leased", "waited"]
    e.execute("cancel", ((1, 9),), T0 + 60 * SEC)
    e.advance(T0 + 62 * SEC)
    assert queue_names(e) == ["finished", "leased"]


def test_without_idle_time_queues_stay():
    e = Engine()
    lease(e, ["q"])
    e.advance(T0 + 10 ** 6 * SEC)
    assert queue_names(e) == ["q"]
    assert e.next_deadline() is None


# ---------------------------------------------------------------- queue cap
def test_queue_cap_drops_the_longest_unused_queue_first():
    e = Engine(max_queues=2)
    lease(e, ["old"], now=T0)
    lease(e, ["newer"], now=T0 + 1)
    assert add(e, "a", name="third", now=T0 + 2)[0] == OK
    assert queue_names(e) == ["newer", "third"]


def test_queue_cap_refuses_a_new_queue_when_every_queue_is_in_use():
    e = Engine(max_queues=2)
    add(e, "a", name="one")
    add(e, "b", name="two")
    for op, args in (("add", None), ("lease", (["three"], 0)), ("create_queue", ("three",))):
        reply = add(e, "c", name="three") if args is None else e.execute(op, args, T0, (1, 1))
        assert reply == [SERVER_ERROR, "Too many queues"]
    assert queue_names(e) == ["one", "two"]
    assert add(e, "d", name="one")[0] == OK         # existing queues still take jobs
    e.execute("delete", ("b",), T0)
    assert add(e, "c", name="three")[0] == OK


# ------------------------------------------------------------------- owners
def test_jobs_leased_to_a_gone_owner_are_ready_again():
    e = Engine()
    add(e, "a")
    add(e, "b")
    add(e, "c")
    assert lease(e, ["q"], token=(7, 1), owner=42)[1][0] == "a"
    assert lease(e, ["q"], token=(7, 2), owner=42)[1][0] == "b"
    assert lease(e, ["q"], token=(8, 1), owner=42)[1][0] == "c"   # same id, other channel
    e.execute("complete", ("b", b""), T0)                          # its lease ended anyway
    assert e.execute("disown", ((7, 42),), T0 + 1) == [OK, None]
    ready = [j.id for j in e.queues["q"].ready]
    assert ready == ["a"]
    assert e.jobs["a"].attempts == 1                               # the lease counted
    assert e.jobs["c"].state == 4                                  # LEASED: other owner
    assert e.owned == {(8, 42): {"c"}}


def test_a_parked_owned_lease_records_its_owner_when_served():
    e = Engine()
    assert lease(e, ["q"], timeout=None, token=(3, 5), owner=1) is None
    add(e, "a")
    assert e.outbox[0][0] == (3, 5)
    e.execute("disown", ((3, 1),), T0)
    assert [j.id for j in e.queues["q"].ready] == ["a"]


def test_ownership_is_forgotten_when_a_lease_ends_any_other_way():
    e = Engine()
    for id in "abcd":
        add(e, id, ttr=1000)
    for i in range(4):
        lease(e, ["q"], token=(1, i), owner=9)
    e.execute("delete", ("a",), T0)
    e.execute("complete", ("b", b""), T0)
    e.execute("unlease", ("c", 1), T0)
    e.advance(T0 + 2 * SEC)                                        # d's TTR ran out
    assert e.owned == {} and e._owner_of == {}


def test_unowned_leases_survive_disown():
    e = Engine()
    add(e, "a")
    lease(e, ["q"], token=(1, 1))
    e.execute("disown", ((1, None),), T0)
    assert e.jobs["a"].state == 4


# ------------------------------------------------------------------- errors
def test_not_found_errors_are_fresh_objects_with_short_tracebacks():
    e = Engine()
    for _ in range(1000):
        assert e.execute("delete", ("nope",), T0) == [NOT_FOUND, ""]
        assert e.execute("delete_number", (5,), T0) == [NOT_FOUND, ""]
    try:
        e._job("nope")
    except Exception as err:  # noqa: BLE001 - looking at the exception itself
        depth = 0
        tb = err.__traceback__
        while tb is not None:
            depth += 1
            tb = tb.tb_next
        assert depth <= 2


def test_a_bad_argument_list_is_a_programming_error_not_a_client_error():
    e = Engine()
    try:
        e.execute("delete", ("a", "b", "c", "d"), T0)
    except TypeError:
        pass
    else:
        raise AssertionError("a wrong argument list was hidden as a client error")
    assert e.execute("nope", (), T0) == [CLIENT_ERROR, "Unknown command"]
