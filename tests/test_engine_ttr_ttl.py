"""Time limits: a lease's TTR requeues or fails the job; a job's TTL evicts it.

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from queueserver.engine import FAILED, LEASED, PENDING
from engine_helpers import Engine
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, TIMEOUT

from engine_helpers import (MS, SEC, T0, add, complete, drain, exists, fail, job, lease, leased_id,
                            result, server, size)


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
    assert result(e, "a", now=now) == [OK, ("a", 0, b"")]
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
    assert drain(e) == [("r", [OK, ("a", 0, b"")])]


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
    assert result(e, "a", now=now)[1][:2] == ("a", 0)


def test_ttr_zero_lease_never_times_out():
    e = Engine()
    add(e, "a", ttr=0, ttl=0)
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
    assert "a" in e.forgotten


def test_ttl_evicts_leased_job_and_counts_it():
    e = Engine()
    add(e, "a", ttr=10_000, ttl=5_000)
    lease(e)
    e.advance(T0 + 5 * SEC)
    assert not exists(e, "a")
    assert server(e)["evicted-jobs"] == 1
    assert "a" in e.forgotten
    # The lease's TTR timer is gone with it: nothing comes back.
    e.advance(T0 + 20 * SEC)
    assert size(e) == 0 and not exists(e, "a")
    assert complete(e, "a", now=T0 + 20 * SEC)[0] == NOT_FOUND


def test_ttl_evicts_completed_job_without_counting_it():
    e = Engine()
    add(e, "a", ttl=5_000)
    lease(e)
    complete(e, "a", b"done")
    assert result(e, "a") == [OK, ("a", 1, b"done")]
    e.advance(T0 + 5 * SEC)
    assert not exists(e, "a")
    assert result(e, "a", now=T0 + 5 * SEC)[0] == NOT_FOUND
    assert server(e)["evicted-jobs"] == 0
    assert "a" in e.forgotten


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
