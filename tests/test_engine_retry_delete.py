"""Taking jobs back: retry (takeanumber RETRY rules) and delete, by id or
by number.

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from queueserver.engine import PENDING
from engine_helpers import Engine
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, TIMEOUT

from engine_helpers import (SEC, T0, add, complete, drain, exists, job, lease, leased_id,
                            ready_ids, result, scheduled_ids, size)


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
    assert "a" in e.forgotten
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
    assert "a" in e.forgotten
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
