"""The shard's counters for /metrics (queueserver.shard.stats), on a bare engine.

Random sequences of requests and timer runs are checked against a
reference built from the engine's own job history (``engine.history``:
each event with the job's state after it, or before it for a job that
left): every per-queue counter, the leased-now gauge, the histograms'
counts, and that the lease bookkeeping holds exactly the leased jobs.
"""
from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Dict, List

import pytest

from queueserver.engine import Engine
from queueserver.engine import job as J
from queueserver.shard.stats import (
    ADDED, COMPLETED, EXPIRED, FAILED, LEASED, LEASED_NOW, ShardStats, ready_at,
)

MS = 1000
T0 = 1_700_000_000_000_000
QUEUES = ["a", "b", "c"]


class Reference:
    """Per-queue counts from the history entries: (kind, id, name, number,
    attempts, priority, size, state, lessee)."""

    def __init__(self) -> None:
        self.rows: Dict[str, List[int]] = {}
        self.waits = 0
        self.leases_timed = 0

    def row(self, name: str) -> List[int]:
        return self.rows.setdefault(name, [0] * 5)

    def take(self, history) -> None:
        for kind, _id, name, *_rest, state, _lessee in history:
            row = self.row(name)
            if kind == "add":
                row[ADDED] += 1
            elif kind == "lease":
                row[LEASED] += 1
                self.waits += 1
            elif kind == "unlease":
                row[LEASED] -= 1
                self.waits -= 1
            elif kind == "take":
                row[LEASED] += 1
                row[COMPLETED] += 1
                self.waits += 1
            elif kind == "restore":
                row[LEASED] -= 1
                row[COMPLETED] -= 1
            elif kind == "complete":
                row[COMPLETED] += 1
            elif kind in ("fail", "ttr", "exhaust") and state == J.FAILED:
                row[FAILED] += 1
            elif kind == "ttl" and state not in (J.COMPLETED, J.FAILED):
                row[EXPIRED] += 1


def drive(seed: int, steps: int = 600):
    rng = random.Random(seed)
    engine = Engine(max_queues=None)
    engine.history = True
    stats = ShardStats()
    stats.attach(engine)
    ref = Reference()
    now = T0
    taken = []   # views of taken jobs, some put back
    timed_leases = 0

    def run(op, *args):
        nonlocal timed_leases
        leased_before = {id for id, job in engine.jobs.items() if job.state == J.LEASED}
        fx = engine.execute(op, args, now, ("t", rng.random()))
        ref.take(fx.history)
        ended = (op in ("complete", "fail") and fx.reply[0] == 0
                 or op == "retry" and fx.reply[1] == "No retries remaining.")   # a fail too
        if ended and args[0] in leased_before:
            timed_leases += 1
        return fx.reply

    for _ in range(steps):
        roll = rng.random()
        jobs = list(engine.jobs.values())
        if roll < 0.25 or not jobs:
            run("add", str(uuid.UUID(int=rng.getrandbits(128))), rng.choice(QUEUES), b"p",
                rng.choice([0, 0, 5]), rng.choice([0, 50, 200]), rng.choice([0, 0, 300]),
                rng.choice([0, 1, 2]), rng.choice([0, 1, 2]),
                rng.choice([None, None, now + 100 * MS, now - 100 * MS]))
        elif roll < 0.45:
            run("lease", rng.sample(QUEUES, rng.randint(1, 3)), 0)
        elif roll < 0.60:
            run("complete", rng.choice(jobs).id, b"r")
        elif roll < 0.70:
            run("fail", rng.choice(jobs).id, b"f")
        elif roll < 0.74:
            run("retry", rng.choice(jobs).id)
        elif roll < 0.78:
            run("delete", rng.choice(jobs).id)
        elif roll < 0.83:
            leased = [j for j in jobs if j.state == J.LEASED]
            if leased:
                job = rng.choice(leased)
                run("unlease", job.id, job.attempts)
        elif roll < 0.87:
            reply = run("take", rng.choice(QUEUES))
            if reply[0] == 0:
                taken.append(reply[1])
        elif roll < 0.89 and taken:
            run("restore", taken.pop(rng.randrange(len(taken))))
        else:
            now += rng.choice([1, 10, 60, 150, 400]) * MS
            fx = engine.advance(now)
            ref.take(fx.history)
    return engine, stats, ref, timed_leases


@pytest.mark.parametrize("seed", range(12))
def test_counters_follow_the_engines_history(seed):
    engine, stats, ref, timed_leases = drive(seed)
    for name in set(ref.rows) | set(stats.rows):
        assert stats.rows.get(name, [0] * 6)[:5] == ref.rows.get(name, [0] * 5), name
    # leased now: exactly the jobs leased now, per queue, and the bookkeeping holds only them
    leased = {id for id, job in engine.jobs.items() if job.state == J.LEASED}
    assert set(stats.leased) == leased
    per_queue = Counter(engine.jobs[id].name for id in leased)
    for name, row in stats.rows.items():
        assert row[LEASED_NOW] == per_queue.get(name, 0), name
    unfinished = {id for id, job in engine.jobs.items() if not job.finished}
    assert set(stats.ready_since) <= unfinished
    assert stats.wait.count == ref.waits
    assert stats.lease.count == timed_leases
    # the gauges add up to what the engine holds
    rows, other = stats.queue_rows()
    held = [sum(values[5 + i] for values in [*rows.values(), other]) for i in range(4)]
    assert sum(held) == len(engine.jobs)
    assert held[0] == sum(len(q.ready) for q in engine.queues.values())
    assert held[2] == len(leased)


def test_a_lease_spread_over_shards_that_is_given_back_is_not_counted():
    engine = Engine()
    stats = ShardStats()
    stats.attach(engine)
    engine.execute("add", ("j1", "q", b"x", 0, 60000), T0)
    engine.execute("lease", (["q"], 0), T0 + 5 * MS)
    assert stats.rows["q"][LEASED] == 1 and stats.wait.count == 1
    engine.execute("unlease", ("j1", 1), T0 + 6 * MS)
    assert stats.rows["q"][LEASED] == 0 and stats.rows["q"][LEASED_NOW] == 0
    assert stats.wait.count == 0 and stats.wait.sum == 0
    engine.execute("lease", (["q"], 0), T0 + 9 * MS)   # waited since it was added, not since the unlease
    assert stats.wait.sum == 9 * MS


def test_wait_and_lease_times():
    engine = Engine()
    stats = ShardStats()
    stats.attach(engine)
    engine.execute("add", ("j1", "q", b"x", 0, 100), T0)
    engine.execute("lease", (["q"], 0), T0 + 3 * MS)          # waited 3 ms
    engine.execute("complete", ("j1", b""), T0 + 10 * MS)     # leased 7 ms
    assert (stats.wait.count, stats.wait.sum) == (1, 3 * MS)
    assert (stats.lease.count, stats.lease.sum) == (1, 7 * MS)
    engine.execute("add", ("j2", "q", b"x", 0, 100, 0, 5), T0 + 20 * MS)
    engine.execute("lease", (["q"], 0), T0 + 20 * MS)
    engine.advance(T0 + 200 * MS)                             # its TTR ran out: back in line at 120 ms
    assert stats.rows["q"][LEASED_NOW] == 0 and stats.lease.count == 1
    engine.execute("lease", (["q"], 0), T0 + 250 * MS)        # waited since then: 130 ms
    assert stats.wait.sum == 3 * MS + 0 + 130 * MS


def test_a_scheduled_job_waits_from_its_time():
    engine = Engine()
    stats = ShardStats()
    stats.attach(engine)
    engine.execute("add", ("j1", "q", b"x", 0, 100, 0, 0, 0, T0 + 50 * MS), T0)
    engine.advance(T0 + 60 * MS)
    engine.execute("lease", (["q"], 0), T0 + 70 * MS)
    assert stats.wait.sum == 20 * MS
    job = engine.jobs["j1"]
    assert ready_at(job.key) == max(job.sched, job.created)


def test_attempts_used_up_at_a_ttr_count_one_failure():
    """A TTR that puts a job back in line with no attempt left makes the lease
    that follows exhaust it: one failure, not two."""
    engine = Engine()
    stats = ShardStats()
    stats.attach(engine)
    engine.execute("add", ("j1", "q", b"x", 0, 10), T0)
    now = T0
    for _ in range(J.ATTEMPTS_CAP):
        now += 1 * MS
        engine.execute("lease", (["q"], 0), now)
        now += 20 * MS
        if engine.jobs["j1"].attempts == J.ATTEMPTS_CAP:
            engine.execute("lease", (["q"], 60000), now, ("w", 1))   # parked: the TTR offers it the job
        fx = engine.advance(now)
    assert [e[0] for e in fx.events] == ["ttr", "exhaust"]
    assert engine.jobs["j1"].state == J.FAILED
    assert stats.rows["q"][FAILED] == 1


def test_counters_outlive_a_removed_queue_and_rows_stay_bounded():
    engine = Engine(queue_idle=1000)
    stats = ShardStats(max_removed_rows=10)
    stats.attach(engine)
    now = T0
    for i in range(60):
        name = f"q{i}"
        engine.execute("add", (str(uuid.uuid4()), name, b"x", 0, 100), now)
        engine.execute("take", (name,), now)
        now += 10 * MS
        engine.advance(now)   # the empty queue goes
    assert len(engine.queues) <= 1
    assert len(stats.rows) <= 1 + 1 + 10
    assert stats.folded_queues > 0
    assert stats.totals() == [60, 60, 60, 0, 0]   # nothing lost by folding


def test_snapshot_caps_its_rows_and_keeps_the_sums():
    engine = Engine()
    stats = ShardStats()
    stats.attach(engine)
    for i in range(250):
        for _ in range(1 + i % 7):
            engine.execute("add", (str(uuid.uuid4()), f"q{i}", b"x", 0, 100), T0)
    rows, other = stats.queue_rows(limit=50)
    assert len(rows) == 50
    assert sum(r[0] for r in rows.values()) + other[0] == stats.totals()[0] == len(engine.jobs)
    assert min(r[0] for r in rows.values()) >= 6   # the busiest
    snap = stats.snapshot()
    assert snap["jobs"] == len(engine.jobs) and snap["queues"] == 250
    assert snap["slots_owned"] == 0 and snap["slot_moves"] == {"in": 0, "out": 0}


def test_slot_counters():
    stats = ShardStats()
    stats.slots_moved("in", 5)
    stats.slots_moved("out", 2)
    stats.slots_owned = 3
    snap = stats.snapshot()
    assert snap["slot_moves"] == {"in": 5, "out": 2} and snap["slots_owned"] == 3
    with pytest.raises(ValueError):
        stats.slots_moved("sideways", 1)


def test_replaying_before_attaching_counts_nothing():
    engine = Engine()
    engine.execute("add", ("j1", "q", b"x", 0, 100), T0)
    engine.execute("lease", (["q"], 0), T0)
    events = [("add", "j2", 7, "q", b"x", 0, 100, 0, 0, 0, T0, None, False)]
    stats = ShardStats()
    engine.replay(events)
    stats.attach(engine)
    assert stats.totals() == [0, 0, 0, 0, 0]
    engine.execute("complete", ("j1", b""), T0)   # leased before: counted, not timed
    assert stats.totals()[COMPLETED] == 1 and stats.lease.count == 0
