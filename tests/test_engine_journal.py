"""The journal: replaying its events rebuilds the same observable state
and timers.

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from queueserver.engine import COMPLETED, FAILED, LEASED, PENDING
from engine_helpers import Engine
from queueserver.engine.status import OK, TIMEOUT

from engine_helpers import (SEC, T0, add, complete, drain, exists, fail, job, lease, leased_id,
                            ready_ids, result, run, scheduled_ids, server)


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
    e = Engine()
    events = e.events   # every step's events, in order
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
    assert drain(e) == [("caller", [OK, ("r", 1, b"run-done")])]

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


def test_replayed_events_are_not_the_next_steps_effects():
    _e, events, now = busy_scenario()
    fresh = Engine()
    fresh.replay(events)
    fresh.execute("add", ("z", "q3", b"p"), now)
    assert [event[:2] for event in fresh.events] == [("add", "z")]
    assert fresh.placed == ["z"] and fresh.forgotten == []


def test_a_taken_job_restored_gets_its_old_place_back_and_replays():
    e = Engine()
    journal = e.events
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


# ------------------------------------------------------- snapshot/recovery
def test_a_snapshot_rebuilds_the_same_observable_state_and_deadlines():
    e, _events, now = busy_scenario()
    fresh = Engine()
    fresh.now = now
    fresh.replay(list(e.snapshot()))
    assert snapshot(fresh) == snapshot(e)
    assert server(fresh)["last-number"] == server(e)["last-number"]
    # Timers run on alike: TTLs, schedules; a leased job's TTR restarts at `now`.
    for step in (20 * SEC, 40 * SEC, 50 * SEC, 100 * SEC):
        e.advance(now + step)
        fresh.advance(now + step)
        assert snapshot(fresh) == snapshot(e)


def test_a_snapshot_then_later_events_equal_the_whole_history():
    e, events, now = busy_scenario()
    base = list(e.snapshot())
    e.events.clear()
    add(e, "n", name="q1", now=now)
    complete(e, "s", b"late", now=now)
    e.execute("delete", ("a", None), now)
    from_base = Engine()
    from_base.now = now
    from_base.replay(base + e.events)
    assert snapshot(from_base) == snapshot(e)


def test_recovery_makes_leased_jobs_ready_keeping_their_attempt_and_drops_run_jobs():
    e = Engine()
    add(e, "a")
    add(e, "b")
    assert leased_id(lease(e)) == "a"
    assert run(e, "r", name="q4", now=T0, token="caller") is None
    fresh = Engine()
    fresh.replay(e.events)
    fx = fresh.recovered(T0 + SEC)
    assert job(fresh, "a")["state"] == PENDING and job(fresh, "a")["attempts"] == 1
    assert ready_ids(fresh) == ["a", "b"]
    assert not exists(fresh, "r")
    assert sorted(ev[0] for ev in fx.events) == ["delete", "release"]   # what the log must keep


def test_numbers_and_created_queues_outlive_a_snapshot():
    e = Engine()
    add(e, "a", number=41)
    e.execute("delete", ("a", None), T0)
    assert e.execute("create_queue", ("empty",), T0) == [OK, None]
    fresh = Engine()
    fresh.replay(list(e.snapshot()))
    assert add(fresh, "b")[1][1] > 41           # a number never comes back
    names = [q[0] for q in fresh.execute("inspect_queues", (0, 10), T0)[1]]
    assert "empty" in names
