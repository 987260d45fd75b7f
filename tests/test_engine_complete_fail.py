"""Finishing jobs: complete and fail, the max-fails budget, duplicate
results, unknown ids and duplicate adds.

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from queueserver.engine import COMPLETED, FAILED, PENDING
from engine_helpers import Engine
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, TIMEOUT

from engine_helpers import (SEC, T0, add, complete, drain, fail, job, lease, leased_id, result,
                            run, size)


# ----------------------------------------------------------------- max-fails
def test_fail_without_max_fails_is_final():
    e = Engine()
    add(e, "a")
    lease(e)
    assert fail(e, "a", b"boom") == [OK, None]
    info = job(e, "a")
    assert info["state"] == FAILED and info["fails"] == 1
    assert result(e, "a") == [OK, ("a", 0, b"boom")]


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
    assert result(e, "a") == [OK, ("a", 0, b"third")]


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
    assert drain(e) == [("r", [OK, ("a", 0, b"second")])]



# ------------------------------------------------------------ complete / fail
def test_complete_leased_job():
    e = Engine()
    add(e, "a")
    lease(e)
    assert complete(e, "a", b"pong") == [OK, None]
    assert job(e, "a")["state"] == COMPLETED
    assert result(e, "a") == [OK, ("a", 1, b"pong")]


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


# ------------------------------------------------------ jobs that have no TTL
HOUR = 3600 * SEC


def test_a_job_with_no_ttl_keeps_its_result_an_hour_then_goes():
    """Added over a protocol without TTLs (none of them reads results) and
    finished over workq: its result is there to read, for an hour, then
    the job goes, rather than stay for ever."""
    e = Engine()
    add(e, "a", ttl=0)
    lease(e)
    assert complete(e, "a", b"done", now=T0 + SEC) == [OK, None]
    assert result(e, "a") == [OK, ("a", 1, b"done")]
    assert e.next_deadline() == T0 + SEC + HOUR
    e.advance(T0 + SEC + HOUR - 1)
    assert result(e, "a") == [OK, ("a", 1, b"done")]
    e.advance(T0 + SEC + HOUR)
    assert "a" not in e.inner.jobs
    assert result(e, "a") == [NOT_FOUND, ""]
    assert e.next_deadline() is None


def test_a_job_with_a_ttl_is_kept_by_its_ttl_only():
    e = Engine()
    add(e, "a", ttl=10 * 3600 * 1000)
    lease(e)
    complete(e, "a", b"done")
    e.advance(T0 + 2 * HOUR)
    assert result(e, "a") == [OK, ("a", 1, b"done")]


def test_an_untimed_job_deleted_meanwhile_or_requeued_by_a_fail_is_not_kept():
    e = Engine()
    add(e, "a", ttl=0)
    add(e, "b", ttl=0, max_fails=2)
    lease(e)
    complete(e, "a", b"done")
    assert e.execute("delete", ("a",), T0)[0] == OK
    assert e.inner.kept == {}
    assert leased_id(lease(e)) == "b"
    fail(e, "b")                         # requeued: not finished, nothing kept
    assert e.inner.kept == {} and job(e, "b")["state"] == PENDING
