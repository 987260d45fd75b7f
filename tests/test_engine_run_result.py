"""Waiting for outcomes: ``result`` (immediate, parked, timed out) and
``run`` (add and wait; the job is removed after).

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from queueserver.engine import LEASED, NEW, PENDING
from engine_helpers import Engine
from queueserver.engine.status import NOT_FOUND, OK, TIMEOUT

from engine_helpers import (MS, SEC, T0, add, complete, drain, exists, fail, job, lease, result,
                            run, server, size)


# --------------------------------------------------------------------- result
def test_result_of_finished_job_is_immediate():
    e = Engine()
    add(e, "a")
    complete(e, "a", b"done")
    assert result(e, "a", timeout=10_000, token="r") == [OK, ("a", 1, b"done")]
    assert server(e)["waiters"] == 0


def test_result_parks_then_is_delivered_on_complete():
    e = Engine()
    add(e, "a")
    assert result(e, "a", timeout=10_000, token="r1") is None
    assert result(e, "a", timeout=10_000, token="r2") is None
    lease(e)
    complete(e, "a", b"pong", now=T0 + SEC)
    assert sorted(drain(e)) == [("r1", [OK, ("a", 1, b"pong")]), ("r2", [OK, ("a", 1, b"pong")])]
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
    assert drain(e) == [("caller", [OK, ("r", 1, b"pong")])]
    assert not exists(e, "r")
    assert "r" in e.forgotten
    e.advance(T0 + 60 * SEC)
    assert e.outbox == []


def test_run_failed_by_worker_delivers_failure_and_removes_job():
    e = Engine()
    run(e, "r", now=T0, token="caller")
    lease(e)
    fail(e, "r", b"bad")
    assert drain(e) == [("caller", [OK, ("r", 0, b"bad")])]
    assert not exists(e, "r")


def test_run_served_by_parked_worker_immediately():
    e = Engine()
    assert lease(e, timeout=10_000, token="worker") is None
    assert run(e, "r", token="caller") is None
    [(token, reply)] = drain(e)
    assert token == "worker" and reply[1][0] == "r"
    complete(e, "r", b"ok")
    assert drain(e) == [("caller", [OK, ("r", 1, b"ok")])]
    assert not exists(e, "r")


def test_run_not_leased_within_wait_timeout_times_out_and_removes_job():
    e = Engine()
    assert run(e, "r", ttr=5_000, timeout=1_000, now=T0, token="caller") is None
    e.advance(T0 + 1_000 * MS - 1)
    assert e.outbox == []
    e.advance(T0 + 1_000 * MS)
    assert drain(e) == [("caller", [TIMEOUT, ""])]
    assert not exists(e, "r")
    assert "r" in e.forgotten
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
    assert "r" in e.forgotten
    assert size(e) == 0
    assert complete(e, "r", now=T0 + 6 * SEC)[0] == NOT_FOUND


def test_run_completed_after_wait_timeout_but_within_ttr_delivers_and_removes_job():
    e = Engine()
    run(e, "r", ttr=5_000, timeout=1_000, now=T0, token="caller")
    lease(e, now=T0)
    e.advance(T0 + 1 * SEC)                      # wait-timeout passes while leased
    assert e.outbox == []
    complete(e, "r", b"pong", now=T0 + 2 * SEC)
    assert drain(e) == [("caller", [OK, ("r", 1, b"pong")])]
    # "run removes the job once it returns its result" (decisions, workq).
    assert not exists(e, "r")
    assert "r" in e.forgotten


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
    assert drain(e) == [("caller", [OK, ("r", 1, b"second try")])]
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
