"""Unit tests for the pure job engine (queueserver.engine).

The engine has no clock: every call takes ``now`` in integer microseconds and
timers fire only through ``engine.advance(now)``. These tests drive time with
an explicit fake clock and never sleep. The expected behaviour follows
seeds/workq-protocol.md and spec/protocol-decisions.md (workq section, plus
the takeanumber RETRY rules for ``retry``).
"""
from __future__ import annotations

import inspect

from queueserver.engine import COMPLETED, FAILED, LEASED, NEW, PENDING, Engine
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, TIMEOUT

T0 = 1_700_000_000_000_000  # fake "now", µs since the epoch
MS = 1_000                  # µs per millisecond
SEC = 1_000_000             # µs per second

FIELDS = ("id", "name", "ttr", "ttl", "payload", "max_attempts", "attempts",
          "max_fails", "fails", "priority", "state", "created", "sched")


# --------------------------------------------------------------------- helpers
def _request_params(op):
    """The positional argument names of request ``op`` (after self, now, token)."""
    return list(inspect.signature(Engine._requests[op]).parameters)[3:]


def add(e, id, name="q", payload=b"payload", priority=0, ttr=60_000, ttl=0,
        max_attempts=0, max_fails=0, sched=None, number=0, now=T0):
    # Built by parameter name so optional engine parameters (e.g. a protocol
    # flag inserted before ``number``) keep their defaults.
    return call(e, "add", now, None, id=id, name=name, payload=payload, priority=priority,
                ttr=ttr, ttl=ttl, max_attempts=max_attempts, max_fails=max_fails,
                sched=sched, number=number)


def call(e, op, now, token, **given):
    """``execute(op, ...)`` with the positional args laid out by parameter name."""
    defaults = inspect.signature(Engine._requests[op]).parameters
    args = tuple(given[p] if p in given else defaults[p].default for p in _request_params(op))
    return e.execute(op, args, now, token)


def lease(e, names=("q",), timeout=0, now=T0, token=None):
    return e.execute("lease", (list(names), timeout), now, token)


def leased_id(reply):
    assert reply[0] == OK, reply
    return reply[1][0]


def complete(e, id, result=b"result", now=T0):
    return e.execute("complete", (id, result), now)


def fail(e, id, result=b"error", now=T0):
    return e.execute("fail", (id, result), now)


def result(e, id, timeout=0, now=T0, token=None):
    return e.execute("result", (id, timeout), now, token)


def run(e, id, name="q", payload=b"payload", priority=0, ttr=5_000, timeout=1_000,
        now=T0, token="run-caller"):
    return call(e, "run", now, token, id=id, name=name, payload=payload, priority=priority,
                ttr=ttr, timeout=timeout, number=0)


def job(e, id):
    reply = e.execute("inspect_job", (id,), T0)
    assert reply[0] == OK, reply
    return dict(zip(FIELDS, reply[1]))


def exists(e, id):
    reply = e.execute("inspect_job", (id,), T0)
    assert reply[0] in (OK, NOT_FOUND), reply
    return reply[0] == OK


def ready_ids(e, name="q"):
    reply = e.execute("inspect_jobs", (name, 0, 1000), T0)
    assert reply[0] == OK, reply
    return [view[0] for view in reply[1]]


def scheduled_ids(e, name="q"):
    reply = e.execute("inspect_scheduled", (name, 0, 1000), T0)
    assert reply[0] == OK, reply
    return [view[0] for view in reply[1]]


def size(e, name="q"):
    reply = e.execute("size", (name,), T0)
    assert reply[0] == OK
    return reply[1]


def server(e):
    reply = e.execute("inspect_server", (), T0)
    assert reply[0] == OK
    return reply[1]


def drain(e):
    out = list(e.outbox)
    e.outbox.clear()
    return out


def lease_all(e, names=("q",), now=T0):
    """Lease until empty; the ids in serving order."""
    ids = []
    while True:
        reply = lease(e, names, 0, now)
        if reply[0] == TIMEOUT:
            return ids
        ids.append(leased_id(reply))


# -------------------------------------------------------------------- ordering
def test_higher_priority_is_leased_first():
    e = Engine()
    add(e, "low", priority=-5)
    add(e, "mid", priority=0)
    add(e, "high", priority=10)
    assert lease_all(e) == ["high", "mid", "low"]


def test_fifo_within_equal_priority():
    e = Engine()
    for i in range(5):
        add(e, f"j{i}", now=T0)  # same microsecond: arrival decides
    assert lease_all(e) == ["j0", "j1", "j2", "j3", "j4"]


def test_earlier_creation_first_within_equal_priority():
    e = Engine()
    add(e, "first", now=T0)
    add(e, "second", now=T0 + 1)
    add(e, "third", now=T0 + 2)
    assert lease_all(e, now=T0 + 3) == ["first", "second", "third"]


def test_earlier_creation_beats_smaller_number():
    e = Engine()
    add(e, "older", number=10, now=T0)
    add(e, "newer", number=3, now=T0 + 1)
    assert lease_all(e, now=T0 + 2) == ["older", "newer"]


def test_earlier_scheduled_time_first_even_if_created_later():
    e = Engine()
    add(e, "late-sched", sched=T0 + 5 * SEC, now=T0)
    add(e, "early-sched", sched=T0 + 3 * SEC, now=T0 + 1 * SEC)
    e.advance(T0 + 5 * SEC)
    assert lease_all(e, now=T0 + 5 * SEC) == ["early-sched", "late-sched"]


def test_scheduled_time_orders_against_plain_jobs():
    e = Engine()
    add(e, "sched", sched=T0 + 2 * SEC, now=T0)          # ready from T0+2s
    add(e, "plain", now=T0 + 1 * SEC)                    # ready from T0+1s
    add(e, "plain-later", now=T0 + 3 * SEC)
    e.advance(T0 + 3 * SEC)
    assert lease_all(e, now=T0 + 3 * SEC) == ["plain", "sched", "plain-later"]


def test_priority_beats_schedule_and_creation():
    e = Engine()
    add(e, "old", priority=0, now=T0)
    add(e, "sched-high", priority=3, sched=T0 + SEC, now=T0)
    e.advance(T0 + SEC)
    add(e, "new-high", priority=3, now=T0 + 2 * SEC)
    assert lease_all(e, now=T0 + 2 * SEC) == ["sched-high", "new-high", "old"]


def test_lease_view_fields():
    e = Engine(shard=3)
    assert add(e, "a", name="q", payload=b"ping", priority=7, ttr=1500, number=99)[0] == OK
    reply = lease(e)
    assert reply[0] == OK
    id, name, payload, number, priority, ttr, attempts, _order, shard = reply[1]
    assert (id, name, payload, number, priority, ttr, attempts, shard) == \
        ("a", "q", b"ping", 99, 7, 1500, 1, 3)


# ------------------------------------------------------------------ scheduling
def test_scheduled_job_is_invisible_to_lease_until_its_time():
    e = Engine()
    add(e, "s", sched=T0 + 10 * SEC, now=T0)
    assert lease(e, now=T0) == [TIMEOUT, ""]
    e.advance(T0 + 10 * SEC - 1)
    assert lease(e, now=T0 + 10 * SEC - 1) == [TIMEOUT, ""]
    assert size(e) == 0


def test_scheduled_job_wakes_at_its_time_and_is_leasable():
    e = Engine()
    add(e, "s", sched=T0 + 10 * SEC, now=T0)
    e.advance(T0 + 10 * SEC)
    assert size(e) == 1
    assert job(e, "s")["state"] == NEW
    assert leased_id(lease(e, now=T0 + 10 * SEC)) == "s"


def test_parked_lease_receives_scheduled_job_when_it_wakes():
    e = Engine()
    add(e, "s", sched=T0 + 2 * SEC, now=T0)
    assert lease(e, timeout=5_000, now=T0, token="w") is None
    e.advance(T0 + 2 * SEC - 1)
    assert e.outbox == []
    e.advance(T0 + 2 * SEC)
    [(token, reply)] = drain(e)
    assert token == "w" and reply[0] == OK and reply[1][0] == "s"


def test_inspect_scheduled_lists_scheduled_jobs_in_time_order():
    e = Engine()
    add(e, "later", sched=T0 + 20 * SEC, now=T0)
    add(e, "sooner", sched=T0 + 10 * SEC, now=T0)
    add(e, "ready", now=T0)
    reply = e.execute("inspect_scheduled", ("q", 0, 10), T0)
    assert reply[0] == OK
    views = [dict(zip(FIELDS, v)) for v in reply[1]]
    assert [v["id"] for v in views] == ["sooner", "later"]
    assert [v["sched"] for v in views] == [T0 + 10 * SEC, T0 + 20 * SEC]
    # inspect_jobs shows only ready jobs, not the sleeping ones.
    assert ready_ids(e) == ["ready"]
    e.advance(T0 + 10 * SEC)
    assert scheduled_ids(e) == ["later"]
    assert set(ready_ids(e)) == {"ready", "sooner"}


def test_inspect_queue_counts_ready_and_scheduled():
    e = Engine()
    add(e, "r1", now=T0)
    add(e, "r2", now=T0)
    add(e, "s1", sched=T0 + SEC, now=T0)
    assert e.execute("inspect_queue", ("q",), T0) == [OK, ["q", 2, 1]]
    e.advance(T0 + SEC)
    assert e.execute("inspect_queue", ("q",), T0 + SEC) == [OK, ["q", 3, 0]]
    lease(e, now=T0 + SEC)
    assert e.execute("inspect_queue", ("q",), T0 + SEC) == [OK, ["q", 2, 0]]


def test_inspect_queue_unknown_is_not_found():
    e = Engine()
    assert e.execute("inspect_queue", ("nope",), T0)[0] == NOT_FOUND


def test_lease_creates_empty_queue_and_inspect_queues_is_alphabetical():
    e = Engine()
    assert lease(e, ["zeta"], 0) == [TIMEOUT, ""]
    add(e, "m", name="mid")
    add(e, "a", name="alpha", sched=T0 + SEC)
    assert e.execute("inspect_queues", (0, 10), T0) == [
        OK, [["alpha", 0, 1], ["mid", 1, 0], ["zeta", 0, 0]]]


def test_size_counts_only_ready_jobs():
    e = Engine()
    add(e, "a")
    add(e, "b")
    add(e, "s", sched=T0 + SEC)
    assert size(e) == 2
    lease(e)
    assert size(e) == 1
    assert size(e, "unknown") == 0


# ------------------------------------------------------------------------- TTR
def test_ttr_expiry_requeues_as_pending_and_counts_attempts():
    e = Engine()
    add(e, "a", ttr=1_000)
    assert lease(e, now=T0)[1][6] == 1
    assert job(e, "a")["state"] == LEASED
    e.advance(T0 + 1_000 * MS - 1)
    assert job(e, "a")["state"] == LEASED
    e.advance(T0 + 1_000 * MS)
    info = job(e, "a")
    assert info["state"] == PENDING and info["attempts"] == 1
    reply = lease(e, now=T0 + 2 * SEC)
    assert reply[0] == OK and reply[1][0] == "a" and reply[1][6] == 2
    assert job(e, "a")["attempts"] == 2


def test_ttr_expiry_after_max_attempts_marks_failed_with_empty_result():
    e = Engine()
    add(e, "a", ttr=1_000, max_attempts=2)
    now = T0
    lease(e, now=now)
    now += SEC
    e.advance(now)
    assert job(e, "a")["state"] == PENDING
    assert leased_id(lease(e, now=now)) == "a"
    now += SEC
    e.advance(now)
    info = job(e, "a")
    assert info["state"] == FAILED and info["attempts"] == 2
    assert result(e, "a", now=now) == [OK, ["a", 0, b""]]
    assert lease(e, now=now) == [TIMEOUT, ""]


def test_ttr_expiry_hands_job_to_parked_lessee():
    e = Engine()
    add(e, "a", ttr=1_000)
    lease(e, now=T0)
    assert lease(e, timeout=10_000, now=T0, token="w") is None
    e.advance(T0 + SEC)
    [(token, reply)] = drain(e)
    assert token == "w" and reply[1][0] == "a" and reply[1][6] == 2


def test_ttr_failure_after_max_attempts_reaches_result_waiter():
    e = Engine()
    add(e, "a", ttr=1_000, max_attempts=1)
    assert result(e, "a", timeout=60_000, now=T0, token="r") is None
    lease(e, now=T0)
    e.advance(T0 + SEC)
    assert drain(e) == [("r", [OK, ["a", 0, b""]])]


def test_unlimited_attempts_hit_hard_cap_of_255_at_lease_time():
    e = Engine()
    add(e, "a", ttr=1, max_attempts=0)
    now = T0
    for attempt in range(1, 256):
        reply = lease(e, now=now)
        assert reply[0] == OK and reply[1][0] == "a" and reply[1][6] == attempt
        now += MS
        e.advance(now)
        assert job(e, "a")["state"] == PENDING
    # The 256th lease finds the job out of attempts: it fails, nothing is leased.
    assert lease(e, now=now) == [TIMEOUT, ""]
    info = job(e, "a")
    assert info["state"] == FAILED and info["attempts"] == 255
    assert result(e, "a", now=now)[1][:2] == ["a", 0]


def test_ttr_zero_lease_never_times_out():
    e = Engine()
    add(e, "a", ttr=0)
    lease(e)
    e.advance(T0 + 10 ** 6 * SEC)
    assert job(e, "a")["state"] == LEASED


# ------------------------------------------------------------------------- TTL
def test_ttl_evicts_new_job_and_counts_it():
    e = Engine()
    add(e, "a", ttl=5_000, number=7)
    e.advance(T0 + 5_000 * MS - 1)
    assert exists(e, "a")
    e.advance(T0 + 5_000 * MS)
    assert not exists(e, "a")
    assert size(e) == 0
    assert server(e)["evicted-jobs"] == 1
    assert ("a", 7) in e.forgotten


def test_ttl_evicts_leased_job_and_counts_it():
    e = Engine()
    add(e, "a", ttr=10_000, ttl=5_000)
    lease(e)
    e.advance(T0 + 5 * SEC)
    assert not exists(e, "a")
    assert server(e)["evicted-jobs"] == 1
    assert any(id == "a" for id, _ in e.forgotten)
    # The lease's TTR timer is gone with it: nothing comes back.
    e.advance(T0 + 20 * SEC)
    assert size(e) == 0 and not exists(e, "a")
    assert complete(e, "a", now=T0 + 20 * SEC)[0] == NOT_FOUND


def test_ttl_evicts_completed_job_without_counting_it():
    e = Engine()
    add(e, "a", ttl=5_000)
    lease(e)
    complete(e, "a", b"done")
    assert result(e, "a") == [OK, ["a", 1, b"done"]]
    e.advance(T0 + 5 * SEC)
    assert not exists(e, "a")
    assert result(e, "a", now=T0 + 5 * SEC)[0] == NOT_FOUND
    assert server(e)["evicted-jobs"] == 0
    assert any(id == "a" for id, _ in e.forgotten)


def test_ttl_evicts_failed_job_without_counting_it():
    e = Engine()
    add(e, "a", ttl=5_000)
    lease(e)
    fail(e, "a", b"bad")
    e.advance(T0 + 5 * SEC)
    assert not exists(e, "a")
    assert server(e)["evicted-jobs"] == 0


def test_ttl_of_scheduled_job_starts_at_its_scheduled_time():
    e = Engine()
    add(e, "s", ttl=5_000, sched=T0 + 10 * SEC, now=T0)
    e.advance(T0 + 10 * SEC)
    assert exists(e, "s")
    e.advance(T0 + 15 * SEC - 1)
    assert exists(e, "s")
    e.advance(T0 + 15 * SEC)
    assert not exists(e, "s")
    assert server(e)["evicted-jobs"] == 1


def test_add_with_expiration_already_past_is_invalid_time():
    e = Engine()
    reply = add(e, "a", ttl=5_000, sched=T0 - 10 * SEC, now=T0)
    assert reply == [CLIENT_ERROR, "Invalid Time"]
    assert not exists(e, "a")


def test_add_with_past_schedule_but_live_ttl_is_ready_now():
    e = Engine()
    assert add(e, "a", ttl=20_000, sched=T0 - 10 * SEC, now=T0)[0] == OK
    assert leased_id(lease(e)) == "a"
    e.advance(T0 + 10 * SEC)  # sched + ttl
    assert not exists(e, "a")


# ----------------------------------------------------------------- max-fails
def test_fail_without_max_fails_is_final():
    e = Engine()
    add(e, "a")
    lease(e)
    assert fail(e, "a", b"boom") == [OK, None]
    info = job(e, "a")
    assert info["state"] == FAILED and info["fails"] == 1
    assert result(e, "a") == [OK, ["a", 0, b"boom"]]


def test_fail_requeues_while_fails_below_max_fails_then_fails():
    e = Engine()
    add(e, "a", max_fails=3)
    for n in (1, 2):
        assert leased_id(lease(e)) == "a"
        assert fail(e, "a") == [OK, None]
        info = job(e, "a")
        assert info["state"] == PENDING and info["fails"] == n
        assert size(e) == 1
    assert leased_id(lease(e)) == "a"
    fail(e, "a", b"third")
    info = job(e, "a")
    assert info["state"] == FAILED and info["fails"] == 3
    assert size(e) == 0
    assert result(e, "a") == [OK, ["a", 0, b"third"]]


def test_fail_with_max_fails_one_is_final_on_first_fail():
    e = Engine()
    add(e, "a", max_fails=1)
    lease(e)
    fail(e, "a")
    assert job(e, "a")["state"] == FAILED


def test_result_waiter_gets_only_the_final_fail():
    e = Engine()
    add(e, "a", max_fails=2)
    assert result(e, "a", timeout=60_000, token="r") is None
    lease(e)
    fail(e, "a", b"first")
    assert e.outbox == []
    lease(e)
    fail(e, "a", b"second")
    assert drain(e) == [("r", [OK, ["a", 0, b"second"]])]


# ------------------------------------------------------------ complete / fail
def test_complete_leased_job():
    e = Engine()
    add(e, "a")
    lease(e)
    assert complete(e, "a", b"pong") == [OK, None]
    assert job(e, "a")["state"] == COMPLETED
    assert result(e, "a") == [OK, ["a", 1, b"pong"]]


def test_complete_on_non_leased_job_is_accepted():
    e = Engine()
    add(e, "a")
    assert complete(e, "a", b"early") == [OK, None]
    assert job(e, "a")["state"] == COMPLETED
    assert size(e) == 0
    assert lease(e) == [TIMEOUT, ""]


def test_fail_on_non_leased_job_is_accepted():
    e = Engine()
    add(e, "a")
    assert fail(e, "a", b"early") == [OK, None]
    assert job(e, "a")["state"] == FAILED
    assert lease(e) == [TIMEOUT, ""]


def test_complete_after_ttr_expiry_is_accepted():
    e = Engine()
    add(e, "a", ttr=1_000)
    lease(e)
    e.advance(T0 + SEC)
    assert job(e, "a")["state"] == PENDING
    assert complete(e, "a", b"late", now=T0 + 2 * SEC) == [OK, None]
    assert job(e, "a")["state"] == COMPLETED
    assert lease(e, now=T0 + 2 * SEC) == [TIMEOUT, ""]


def test_second_result_is_duplicate_result():
    e = Engine()
    add(e, "a")
    add(e, "b")
    lease(e)
    complete(e, "a")
    assert complete(e, "a") == [CLIENT_ERROR, "Duplicate result"]
    assert fail(e, "a") == [CLIENT_ERROR, "Duplicate result"]
    fail(e, "b")
    assert complete(e, "b") == [CLIENT_ERROR, "Duplicate result"]
    assert fail(e, "b") == [CLIENT_ERROR, "Duplicate result"]


def test_unknown_id_is_not_found():
    e = Engine()
    for op, args in [("complete", ("x", b"r")), ("fail", ("x", b"r")), ("delete", ("x",)),
                     ("result", ("x", 0)), ("inspect_job", ("x",)), ("retry", ("x", None)),
                     ("delete_number", (12345,))]:
        assert e.execute(op, args, T0)[0] == NOT_FOUND, op


def test_duplicate_add_is_duplicate_job():
    e = Engine()
    assert add(e, "a")[0] == OK
    assert add(e, "a", name="other") == [CLIENT_ERROR, "Duplicate job"]
    assert run(e, "a", token="t") == [CLIENT_ERROR, "Duplicate job"]
    assert size(e) == 1


# ------------------------------------------------------------- blocking lease
def test_blocking_lease_parks_and_gets_added_job():
    e = Engine()
    assert lease(e, timeout=10_000, now=T0, token="w") is None
    assert e.outbox == []
    add(e, "a", now=T0 + SEC)
    [(token, reply)] = drain(e)
    assert token == "w" and reply[0] == OK and reply[1][0] == "a"
    assert job(e, "a")["state"] == LEASED
    # The waiter is gone: its deadline fires nothing.
    e.advance(T0 + 20 * SEC)
    assert e.outbox == []


def test_blocking_lease_times_out_at_its_deadline():
    e = Engine()
    assert lease(e, timeout=2_000, now=T0, token="w") is None
    e.advance(T0 + 2_000 * MS - 1)
    assert e.outbox == []
    e.advance(T0 + 2_000 * MS)
    assert drain(e) == [("w", [TIMEOUT, ""])]
    # Timed-out waiter no longer takes jobs.
    add(e, "a", now=T0 + 3 * SEC)
    assert e.outbox == []
    assert size(e) == 1


def test_lease_timeout_zero_returns_timeout_at_once():
    e = Engine()
    assert lease(e, timeout=0, token="w") == [TIMEOUT, ""]
    assert server(e)["waiters"] == 0
    add(e, "a")
    assert e.outbox == []


def test_lease_timeout_none_waits_forever():
    e = Engine()
    assert lease(e, timeout=None, now=T0, token="w") is None
    e.advance(T0 + 10 ** 6 * SEC)
    assert e.outbox == []
    add(e, "a", now=T0 + 10 ** 6 * SEC + 1)
    [(token, reply)] = drain(e)
    assert token == "w" and reply[1][0] == "a"


def test_multi_name_lease_takes_best_job_among_its_queues():
    e = Engine()
    add(e, "q1-low", name="q1", priority=1, now=T0)
    add(e, "q2-high", name="q2", priority=5, now=T0 + 1)
    add(e, "q3-top", name="q3", priority=9, now=T0 + 2)  # not asked for
    assert leased_id(lease(e, ["q1", "q2"], now=T0 + 3)) == "q2-high"
    assert leased_id(lease(e, ["q1", "q2"], now=T0 + 3)) == "q1-low"


def test_multi_name_lease_equal_priority_takes_oldest():
    e = Engine()
    add(e, "q2-old", name="q2", now=T0)
    add(e, "q1-new", name="q1", now=T0 + 1)
    assert leased_id(lease(e, ["q1", "q2"], now=T0 + 2)) == "q2-old"


def test_multi_name_parked_lease_is_served_from_any_of_its_queues():
    e = Engine()
    assert lease(e, ["q1", "q2"], timeout=10_000, token="w") is None
    add(e, "b", name="q2", now=T0 + 1)
    [(token, reply)] = drain(e)
    assert token == "w" and reply[1][0] == "b"
    add(e, "a", name="q1", now=T0 + 2)
    assert e.outbox == []


def test_parked_lease_waiters_are_served_fifo():
    e = Engine()
    assert lease(e, timeout=10_000, now=T0, token="w1") is None
    assert lease(e, timeout=10_000, now=T0 + 1, token="w2") is None
    assert lease(e, timeout=10_000, now=T0 + 2, token="w3") is None
    add(e, "a", now=T0 + 3)
    add(e, "b", now=T0 + 4)
    add(e, "c", now=T0 + 5)
    got = [(token, reply[1][0]) for token, reply in drain(e)]
    assert got == [("w1", "a"), ("w2", "b"), ("w3", "c")]


def test_cancel_withdraws_a_parked_lease():
    e = Engine()
    assert lease(e, timeout=10_000, token="w1") is None
    assert lease(e, timeout=10_000, token="w2") is None
    assert e.execute("cancel", ("w1",), T0, "admin") == [OK, None]
    # The withdrawn request is answered at once, so its caller can forget it.
    assert drain(e) == [("w1", [TIMEOUT, ""])]
    add(e, "a", now=T0 + 1)
    assert [(t, r[1][0]) for t, r in drain(e)] == [("w2", "a")]
    assert lease(e, timeout=10_000, token="w3") is None
    e.execute("cancel", ("w3",), T0)
    assert drain(e) == [("w3", [TIMEOUT, ""])]
    e.execute("cancel", ("w3",), T0)  # twice: nothing more
    add(e, "b", now=T0 + 2)
    assert e.outbox == []
    assert size(e) == 1
    e.advance(T0 + 20 * SEC)  # cancelled deadlines fire nothing
    assert e.outbox == []
    assert server(e)["waiters"] == 0


# --------------------------------------------------------------------- result
def test_result_of_finished_job_is_immediate():
    e = Engine()
    add(e, "a")
    complete(e, "a", b"done")
    assert result(e, "a", timeout=10_000, token="r") == [OK, ["a", 1, b"done"]]
    assert server(e)["waiters"] == 0


def test_result_parks_then_is_delivered_on_complete():
    e = Engine()
    add(e, "a")
    assert result(e, "a", timeout=10_000, token="r1") is None
    assert result(e, "a", timeout=10_000, token="r2") is None
    lease(e)
    complete(e, "a", b"pong", now=T0 + SEC)
    assert sorted(drain(e)) == [("r1", [OK, ["a", 1, b"pong"]]), ("r2", [OK, ["a", 1, b"pong"]])]
    e.advance(T0 + 20 * SEC)
    assert e.outbox == []


def test_result_times_out_at_its_deadline():
    e = Engine()
    add(e, "a")
    assert result(e, "a", timeout=3_000, now=T0, token="r") is None
    e.advance(T0 + 3_000 * MS - 1)
    assert e.outbox == []
    e.advance(T0 + 3_000 * MS)
    assert drain(e) == [("r", [TIMEOUT, ""])]
    complete(e, "a", now=T0 + 4 * SEC)
    assert e.outbox == []


def test_result_timeout_zero_on_unfinished_job_is_timeout():
    e = Engine()
    add(e, "a")
    assert result(e, "a", timeout=0) == [TIMEOUT, ""]


def test_result_unknown_id_is_not_found():
    e = Engine()
    assert result(e, "nope", timeout=1_000, token="r")[0] == NOT_FOUND
    assert server(e)["waiters"] == 0


# ------------------------------------------------------------------------- run
def test_run_parks_then_delivers_result_and_removes_job():
    e = Engine()
    assert run(e, "r", ttr=5_000, timeout=1_000, now=T0, token="caller") is None
    assert job(e, "r")["state"] == NEW
    reply = lease(e, now=T0 + 100 * MS)
    assert reply[0] == OK and reply[1][0] == "r"
    assert complete(e, "r", b"pong", now=T0 + 200 * MS) == [OK, None]
    assert drain(e) == [("caller", [OK, ["r", 1, b"pong"]])]
    assert not exists(e, "r")
    assert any(id == "r" for id, _ in e.forgotten)
    e.advance(T0 + 60 * SEC)
    assert e.outbox == []


def test_run_failed_by_worker_delivers_failure_and_removes_job():
    e = Engine()
    run(e, "r", now=T0, token="caller")
    lease(e)
    fail(e, "r", b"bad")
    assert drain(e) == [("caller", [OK, ["r", 0, b"bad"]])]
    assert not exists(e, "r")


def test_run_served_by_parked_worker_immediately():
    e = Engine()
    assert lease(e, timeout=10_000, token="worker") is None
    assert run(e, "r", token="caller") is None
    [(token, reply)] = drain(e)
    assert token == "worker" and reply[1][0] == "r"
    complete(e, "r", b"ok")
    assert drain(e) == [("caller", [OK, ["r", 1, b"ok"]])]
    assert not exists(e, "r")


def test_run_not_leased_within_wait_timeout_times_out_and_removes_job():
    e = Engine()
    assert run(e, "r", ttr=5_000, timeout=1_000, now=T0, token="caller") is None
    e.advance(T0 + 1_000 * MS - 1)
    assert e.outbox == []
    e.advance(T0 + 1_000 * MS)
    assert drain(e) == [("caller", [TIMEOUT, ""])]
    assert not exists(e, "r")
    assert any(id == "r" for id, _ in e.forgotten)
    assert size(e) == 0


def test_run_leased_at_wait_timeout_waits_until_ttr_then_times_out():
    e = Engine()
    run(e, "r", ttr=5_000, timeout=1_000, now=T0, token="caller")
    lease(e, now=T0 + 100 * MS)                  # TTR ends at T0 + 5.1 s
    e.advance(T0 + 1_000 * MS)                   # wait-timeout passes: still leased
    assert e.outbox == []
    assert job(e, "r")["state"] == LEASED
    e.advance(T0 + 5_100 * MS - 1)
    assert e.outbox == []
    e.advance(T0 + 5_100 * MS)
    assert drain(e) == [("caller", [TIMEOUT, ""])]
    assert not exists(e, "r")
    assert any(id == "r" for id, _ in e.forgotten)
    assert size(e) == 0
    assert complete(e, "r", now=T0 + 6 * SEC)[0] == NOT_FOUND


def test_run_completed_after_wait_timeout_but_within_ttr_delivers_and_removes_job():
    e = Engine()
    run(e, "r", ttr=5_000, timeout=1_000, now=T0, token="caller")
    lease(e, now=T0)
    e.advance(T0 + 1 * SEC)                      # wait-timeout passes while leased
    assert e.outbox == []
    complete(e, "r", b"pong", now=T0 + 2 * SEC)
    assert drain(e) == [("caller", [OK, ["r", 1, b"pong"]])]
    # "run removes the job once it returns its result" (decisions, workq).
    assert not exists(e, "r")
    assert any(id == "r" for id, _ in e.forgotten)


def test_run_ttr_expiring_before_wait_timeout_requeues_and_run_keeps_waiting():
    e = Engine()
    run(e, "r", ttr=1_000, timeout=10_000, now=T0, token="caller")
    lease(e, now=T0)
    e.advance(T0 + 1 * SEC)                      # TTR ends, caller still within its wait
    assert e.outbox == []
    info = job(e, "r")
    assert info["state"] == PENDING and info["attempts"] == 1
    reply = lease(e, now=T0 + 2 * SEC)
    assert reply[0] == OK and reply[1][0] == "r" and reply[1][6] == 2
    complete(e, "r", b"second try", now=T0 + 2500 * MS)
    assert drain(e) == [("caller", [OK, ["r", 1, b"second try"]])]
    assert not exists(e, "r")


def test_cancel_run_caller_removes_unfinished_job():
    e = Engine()
    run(e, "r", token="caller")
    e.execute("cancel", ("caller",), T0 + 1)
    assert drain(e) == [("caller", [TIMEOUT, ""])]
    assert not exists(e, "r")
    assert size(e) == 0
    e.advance(T0 + 60 * SEC)
    assert e.outbox == []


# --------------------------------------------------------------------- unlease
def test_unlease_restores_new_state_and_attempts():
    e = Engine()
    add(e, "a", ttr=1_000)
    add(e, "b")
    add(e, "c")
    reply = lease(e)
    assert reply[1][0] == "a" and reply[1][6] == 1
    assert e.execute("unlease", ("a", 1), T0) == [OK, None]
    info = job(e, "a")
    assert info["state"] == NEW and info["attempts"] == 0
    assert ready_ids(e) == ["a", "b", "c"]
    # The lease's TTR timer is cancelled.
    e.advance(T0 + 5 * SEC)
    assert job(e, "a")["state"] == NEW and job(e, "a")["attempts"] == 0
    assert leased_id(lease(e, now=T0 + 5 * SEC)) == "a"


def test_unlease_restores_pending_state_and_attempts():
    e = Engine()
    add(e, "a", ttr=1_000)
    add(e, "b", now=T0 + 1)
    lease(e)
    e.advance(T0 + SEC)                           # TTR: PENDING, attempts 1
    reply = lease(e, now=T0 + 2 * SEC)
    assert reply[1][0] == "a" and reply[1][6] == 2
    e.execute("unlease", ("a", 2), T0 + 2 * SEC)
    info = job(e, "a")
    assert info["state"] == PENDING and info["attempts"] == 1
    assert ready_ids(e) == ["a", "b"]


def test_unlease_with_stale_attempts_is_a_no_op():
    e = Engine()
    add(e, "a")
    lease(e)
    assert e.execute("unlease", ("a", 5), T0) == [OK, None]
    info = job(e, "a")
    assert info["state"] == LEASED and info["attempts"] == 1


def test_unlease_hands_job_to_parked_lessee():
    e = Engine()
    add(e, "a")
    lease(e)
    assert lease(e, timeout=10_000, token="w") is None
    e.execute("unlease", ("a", 1), T0 + 1)
    [(token, reply)] = drain(e)
    assert token == "w" and reply[1][0] == "a" and reply[1][6] == 1


# ----------------------------------------------------------------------- retry
def test_retry_of_ready_job_keeps_its_place_in_add_order():
    e = Engine()
    add(e, "a", max_fails=5)
    add(e, "b", max_fails=5)
    add(e, "c", max_fails=5)
    assert e.execute("retry", ("c", "q"), T0) == [OK, None]
    assert ready_ids(e) == ["a", "b", "c"]
    assert job(e, "c")["fails"] == 1


def test_retry_puts_leased_jobs_back_at_their_original_place():
    """As the original takeanumber did: one list in add order, RESERVE takes
    the first unreserved item, so a retried job is ahead of later adds."""
    e = Engine()
    for id in ("a", "b", "c"):
        add(e, id, max_fails=5)
    lease(e)  # a
    lease(e)  # b
    e.execute("retry", ("b", "q"), T0 + 1)
    e.execute("retry", ("a", "q"), T0 + 2)
    assert ready_ids(e) == ["a", "b", "c"]
    info = job(e, "b")
    assert info["state"] == PENDING and info["fails"] == 1
    assert leased_id(lease(e)) == "a"


def test_retry_charges_budget_and_removes_job_when_none_left():
    e = Engine()
    add(e, "a", max_fails=1, number=5)
    lease(e)
    assert e.execute("retry", ("a", "q"), T0) == [OK, None]
    assert job(e, "a")["fails"] == 1
    lease(e)
    assert e.execute("retry", ("a", "q"), T0) == [CLIENT_ERROR, "No retries remaining."]
    assert not exists(e, "a")
    assert ("a", 5) in e.forgotten
    assert size(e) == 0


def test_retry_without_budget_removes_job_at_once():
    e = Engine()
    add(e, "a")
    assert e.execute("retry", ("a", None), T0) == [CLIENT_ERROR, "No retries remaining."]
    assert not exists(e, "a")


def test_retry_with_wrong_queue_name_is_not_found():
    e = Engine()
    add(e, "a", max_fails=3)
    assert e.execute("retry", ("a", "other"), T0)[0] == NOT_FOUND
    assert job(e, "a")["fails"] == 0


# ---------------------------------------------------------------------- delete
def test_delete_number_removes_job_by_number():
    e = Engine()
    add(e, "a", number=42)
    add(e, "b", number=43)
    assert e.execute("delete_number", (42,), T0) == [OK, "a"]
    assert not exists(e, "a")
    assert exists(e, "b")
    assert ("a", 42) in e.forgotten
    assert ready_ids(e) == ["b"]
    assert e.execute("delete_number", (42,), T0)[0] == NOT_FOUND


def test_delete_ready_job():
    e = Engine()
    add(e, "a")
    assert e.execute("delete", ("a", None), T0) == [OK, None]
    assert not exists(e, "a")
    assert lease(e) == [TIMEOUT, ""]


def test_delete_leased_job_then_complete_is_not_found():
    e = Engine()
    add(e, "a", ttr=1_000)
    lease(e)
    assert e.execute("delete", ("a", None), T0) == [OK, None]
    assert not exists(e, "a")
    assert complete(e, "a", now=T0 + 1)[0] == NOT_FOUND
    e.advance(T0 + 5 * SEC)  # no TTR requeue of a deleted job
    assert size(e) == 0 and not exists(e, "a")


def test_delete_scheduled_job_cancels_its_wake():
    e = Engine()
    add(e, "s", sched=T0 + SEC)
    e.execute("delete", ("s", None), T0)
    assert scheduled_ids(e) == []
    e.advance(T0 + 2 * SEC)
    assert size(e) == 0 and not exists(e, "s")


def test_delete_wakes_result_waiter_with_not_found():
    e = Engine()
    add(e, "a")
    result(e, "a", timeout=10_000, token="r")
    e.execute("delete", ("a", None), T0)
    assert [(t, r[0]) for t, r in drain(e)] == [("r", NOT_FOUND)]


# ------------------------------------------------------------- journal/replay
def snapshot(e):
    """Everything observable through the engine's requests."""
    jobs = {}
    for id in sorted(e.jobs):
        jobs[id] = (job(e, id), result(e, id, timeout=0))
    reply = e.execute("inspect_queues", (0, 1000), T0)
    assert reply[0] == OK
    queues = {}
    for name, ready_len, sched_len in reply[1]:
        queues[name] = (ready_len, sched_len, ready_ids(e, name), scheduled_ids(e, name))
    info = server(e)
    return {"jobs": jobs, "queues": queues, "evicted": info["evicted-jobs"],
            "count": info["jobs"], "last-number": info["last-number"]}


def busy_scenario():
    events = []
    e = Engine(journal=events.append)
    now = T0
    add(e, "a", name="q1", ttr=1_000, ttl=60_000, now=now)
    add(e, "b", name="q1", priority=5, ttr=1_000, now=now)
    add(e, "c", name="q1", ttr=2_000, max_attempts=1, now=now)
    add(e, "f", name="q1", max_attempts=1, max_fails=1, now=now)
    add(e, "d", name="q2", max_fails=2, now=now)
    add(e, "s", name="q2", ttl=20_000, sched=T0 + 5 * SEC, now=now)
    add(e, "x", name="q2", ttl=3_000, now=now)
    add(e, "later", name="q2", ttl=30_000, sched=T0 + 50 * SEC, now=now)
    # A parked lessee served by an add.
    assert lease(e, ["q3"], timeout=None, now=now, token="w") is None
    add(e, "g", name="q3", ttr=0, now=now)
    assert [t for t, _ in drain(e)] == ["w"]
    # A run served and completed (removes its job).
    assert run(e, "r", name="q4", ttr=1_000, timeout=10_000, now=now, token="caller") is None
    assert leased_id(lease(e, ["q4"], now=now)) == "r"
    complete(e, "r", b"run-done", now=now)
    assert drain(e) == [("caller", [OK, ["r", 1, b"run-done"]])]

    assert leased_id(lease(e, ["q1"], now=now)) == "b"
    complete(e, "b", b"done-b", now=now)
    assert leased_id(lease(e, ["q1"], now=now)) == "a"
    assert leased_id(lease(e, ["q1"], now=now)) == "c"
    assert leased_id(lease(e, ["q1"], now=now)) == "f"
    e.execute("retry", ("f", "q1"), now)            # back at its place, attempts stay 1
    assert leased_id(lease(e, ["q2"], now=now)) == "d"
    fail(e, "d", b"err-1", now=now)                 # requeued: 1 < 2

    now = T0 + 1 * SEC
    e.advance(now)                                  # a: TTR -> PENDING
    now = T0 + 2 * SEC
    e.advance(now)                                  # c: TTR after its only attempt -> FAILED
    assert leased_id(lease(e, ["q1"], now=now)) == "a"
    # f is out of attempts: exhausted on the way, so nothing is leased.
    assert lease(e, ["q1"], now=now)[0] == TIMEOUT
    e.execute("unlease", ("a", 2), now)             # a: back to PENDING, attempts 1
    now = T0 + 3 * SEC
    e.advance(now)                                  # x: evicted while NEW
    now = T0 + 5 * SEC
    e.advance(now)                                  # s: wakes
    assert leased_id(lease(e, ["q2"], now=now)) == "d"
    fail(e, "d", b"err-2", now=now)                 # final
    add(e, "h", name="q1", number=77, now=now)
    e.execute("delete_number", (77,), now)
    e.execute("delete", ("g", None), now)           # leased, deleted
    add(e, "k", name="q1", ttl=10_000, now=T0 + 6 * SEC)
    complete(e, "k", b"done-k", now=T0 + 6 * SEC)
    now = T0 + 16 * SEC
    e.advance(now)                                  # k: evicted while COMPLETED (not counted)
    add(e, "m", name="q2", ttr=30_000, now=now)
    assert leased_id(lease(e, ["q2"], now=now)) == "s"  # woken s before newer m
    assert e.waiters == {}
    return e, events, now


def test_busy_scenario_reaches_expected_state():
    e, _events, _now = busy_scenario()
    assert job(e, "a")["state"] == PENDING and job(e, "a")["attempts"] == 1
    assert job(e, "b")["state"] == COMPLETED
    assert job(e, "c")["state"] == FAILED and job(e, "c")["attempts"] == 1
    assert job(e, "d")["state"] == FAILED and job(e, "d")["fails"] == 2
    assert job(e, "f")["state"] == FAILED
    assert job(e, "s")["state"] == LEASED
    for gone in ("x", "g", "h", "k", "r"):
        assert not exists(e, gone)
    assert server(e)["evicted-jobs"] == 1


def test_journal_replay_rebuilds_the_same_observable_state():
    e, events, _now = busy_scenario()
    assert events, "the journal received no events"
    fresh = Engine()
    fresh.replay(events)
    assert snapshot(fresh) == snapshot(e)
    assert sorted(fresh.forgotten) == sorted(e.forgotten)


def test_journal_replay_rebuilds_timers_so_time_continues_identically():
    e, events, now = busy_scenario()
    fresh = Engine()
    fresh.replay(events)
    assert fresh.next_deadline() == e.next_deadline()
    for step in (20 * SEC, 40 * SEC, 50 * SEC, 100 * SEC):
        e.advance(now + step)
        fresh.advance(now + step)
        assert snapshot(fresh) == snapshot(e)
    assert server(fresh)["evicted-jobs"] == server(e)["evicted-jobs"]


def test_replay_does_not_write_to_the_journal():
    _e, events, _now = busy_scenario()
    again = []
    fresh = Engine(journal=again.append)
    fresh.replay(events)
    assert again == []


def test_a_taken_job_restored_gets_its_old_place_back_and_replays():
    journal = []
    e = Engine(journal=journal.append)
    for id in ("a", "b", "c"):
        add(e, id)
    taken = e.execute("take", ("q",), T0)
    assert taken[0] == OK and taken[1][0] == "a" and "a" not in e.jobs
    assert e.execute("restore", (taken[1],), T0 + 5) == [OK, None]
    assert e.execute("restore", (taken[1],), T0 + 6) == [OK, None]  # already back: nothing
    assert [lease_all_id for lease_all_id in (leased_id(lease(e)) for _ in range(3))] == ["a", "b", "c"]
    replayed = Engine()
    replayed.replay(journal)
    assert sorted(replayed.jobs) == ["a", "b", "c"]
    assert all(j.state == LEASED for j in replayed.jobs.values())
