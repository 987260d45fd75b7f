"""Leasing: blocking leases and their deadlines, multi-queue leases, waiters
in order, cancel; unlease.

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from queueserver.engine import LEASED, NEW, PENDING
from engine_helpers import Engine
from queueserver.engine.status import OK, TIMEOUT

from engine_helpers import (MS, SEC, T0, add, drain, job, lease, leased_id, ready_ids, server,
                            size)


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
