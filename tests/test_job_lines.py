"""The keyless sorted line of jobs (ready queues, TTL lines) and the shard's
timers built on it, checked against plain reference models."""
from __future__ import annotations

import random
from bisect import insort_right

import pytest

from queueserver.engine import timers as T
from queueserver.engine.job import Job, schedule_key
from queueserver.engine.jobqueue import ScheduleLine
from queueserver.engine.timers import JobLine, Timer, Timers


class Item:
    """Anything with a ``key``; found by identity, like jobs."""

    __slots__ = ("key", "name")

    def __init__(self, key: int, name: int) -> None:
        self.key = key
        self.name = name

    def __repr__(self) -> str:  # pragma: no cover - failure messages
        return f"Item({self.key}, {self.name})"


class SmallLine(JobLine):
    LOAD = 3   # split and empty sublists all the time


@pytest.mark.parametrize("line_class", [SmallLine, JobLine])
@pytest.mark.parametrize("seed", range(6))
def test_a_line_behaves_as_a_sorted_list(line_class, seed):
    rnd = random.Random(seed)
    line, model, present = line_class(), [], []
    for step in range(3000):
        action = rnd.random()
        if action < 0.5 or not present:
            item = Item(rnd.randrange(40) if seed % 2 else rnd.randrange(10**6), step)
            line.add(item)
            insort_right(model, item, key=lambda i: i.key)   # equal keys: in insertion order
            present.append(item)
        elif action < 0.7:
            item = present.pop(rnd.randrange(len(present)))
            line.remove(item)
            model.remove(item)
        elif action < 0.8:
            item = line.pop(0)
            assert item is model.pop(0)
            present.remove(item)
        elif action < 0.9:
            gone = Item(rnd.randrange(40), -1)
            assert gone not in line and line.discard(gone) is False
            with pytest.raises(ValueError):
                line.remove(gone)
        else:
            start = rnd.randrange(len(model) + 2)
            assert list(line.islice(start, start + 5)) == model[start:start + 5]
        assert len(line) == len(model) and bool(line) == bool(model)
        if model:
            assert line[0] is model[0] and line[-1] is model[-1]
            i = rnd.randrange(len(model))
            assert line[i] is model[i] and model[i] in line
    assert list(line) == model


def test_an_empty_line():
    line = JobLine()
    assert not line and len(line) == 0 and list(line) == []
    with pytest.raises(IndexError):
        line[0]
    with pytest.raises(IndexError):
        line.pop(0)


def test_a_line_filled_in_order_has_spare_room_only_at_its_end():
    """Sublists split off are exact-size copies: a queue's line costs a pointer per job."""
    import sys
    line = SmallLine()
    for n in range(1000):
        line.add(Item(n, n))
    *full, last = line._lists
    assert len(full) > 100
    assert all(sys.getsizeof(sub) == sys.getsizeof([None] * len(sub)) for sub in full)


def test_a_schedule_line_sorts_sleeping_jobs_by_time_then_number():
    rnd = random.Random(4)
    jobs = [Job(str(n), n, "q", b"", priority=rnd.randrange(-3, 4), created=0,
                sched=rnd.randrange(10**6, 10**6 + 50)) for n in range(1, 400)]
    line = ScheduleLine()
    for job in rnd.sample(jobs, len(jobs)):
        line.add(job)
    expected = sorted(jobs, key=schedule_key)
    assert list(line) == expected
    for job in rnd.sample(jobs, 100):
        line.remove(job)
        expected.remove(job)
    while expected:                      # wake-ups take the first
        first = line[0]
        assert first is expected.pop(0)
        line.remove(first)
    assert not line


def _job(n: int, ttl: int, sched: int, priority: int = 0) -> Job:
    return Job(f"j{n}", n, "q", b"", ttl=ttl, priority=priority, created=0, sched=sched)


def test_timers_fire_every_kind_in_deadline_order():
    rnd = random.Random(3)
    timers, model = Timers(), []
    for n in range(1, 400):
        kind = rnd.random()
        if kind < 0.6:    # TTL jobs: a few TTLs and priorities, so a few lines
            entry = _job(n, ttl=rnd.choice([1, 7, 1000]), sched=rnd.randrange(0, 10**7, 3),
                         priority=rnd.choice([0, 0, 4, -1]))
        else:             # timers and waiter-like entries, kept by due
            entry = Timer(rnd.randrange(0, 2 * 10**7, 3) + 1, "ttr", None)
        timers.add(entry)
        model.append(entry)
    for entry in rnd.sample(model, 100):
        timers.cancel(entry)
        model.remove(entry)
    timers.cancel(None)
    assert len(timers) == len(model)
    fired, now = [], 0
    while len(timers):
        assert timers.next_deadline() == min(e.due for e in model if e not in fired)
        now += 2_000_000
        batch = list(timers.due(now))
        assert all(e.due <= now for e in batch)
        assert [e.due for e in batch] == sorted(e.due for e in batch)
        fired += batch
    assert sorted(map(id, fired)) == sorted(map(id, model))
    assert timers.next_deadline() is None


def test_distinct_ttls_beyond_the_line_cap_still_fire_and_cancel(monkeypatch):
    monkeypatch.setattr(T, "MAX_LINES", 4)
    timers = Timers()
    jobs = [_job(n, ttl=n, sched=1000) for n in range(1, 11)]   # 10 TTLs, 4 lines
    for job in jobs:
        timers.add(job)
    assert len(timers._lines) == 4
    for job in jobs[::3]:
        timers.cancel(job)
    expected = [job for i, job in enumerate(jobs) if i % 3]
    assert list(timers.due(10**9)) == sorted(expected, key=lambda j: j.due)
    assert len(timers) == 0 and not timers._lines


def test_an_entry_added_while_firing_is_seen_when_due():
    timers = Timers()
    first = _job(1, ttl=1, sched=0)
    timers.add(first)
    seen = []
    for entry in timers.due(5000):
        seen.append(entry)
        if entry is first:
            timers.add(Timer(3000, "wake", None))
            timers.add(_job(2, ttl=2, sched=0))
    assert [e.due for e in seen] == [1000, 2000, 3000]


def test_equal_deadlines_fire_the_general_list_first():
    timers = Timers()
    job = _job(1, ttl=1, sched=0)
    timer = Timer(1000, "ttr", job)
    timers.add(job)
    timers.add(timer)
    assert list(timers.due(1000)) == [timer, job]
