"""Scheduled jobs: invisible until their time, woken by ``advance``; queue
inspection and size count only ready jobs.

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from queueserver.engine import NEW
from engine_helpers import Engine
from queueserver.engine.status import NOT_FOUND, OK, TIMEOUT

from engine_helpers import (FIELDS, SEC, T0, add, drain, job, lease, leased_id, ready_ids,
                            scheduled_ids, size)


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
