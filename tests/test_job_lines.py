"""The sorted lines of jobs (ready queues, TTL lines, sleeping jobs: sortedcontainers'
lists, timers.py and jobqueue.py) and the shard's timers built on them, checked
against plain reference models."""
from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from queueserver.engine import timers as T
from queueserver.engine.job import Job, schedule_key
from queueserver.engine.jobqueue import JobQueue, digest, schedule_line
from queueserver.engine.timers import Timer, Timers, discarded, job_line, remove_from


def _jobs(rnd: random.Random, count: int, first: int = 1) -> list:
    """Jobs of mixed priorities and times, in a random order (unique numbers, as a shard's are)."""
    return [Job(f"j{n}", n, "q", b"", priority=rnd.randrange(-3, 4), created=rnd.randrange(50),
                sched=rnd.randrange(40)) for n in range(first, first + count)]


@pytest.mark.parametrize("load", [None, 4])   # 4: sublists split and merge all the time
@pytest.mark.parametrize("seed", range(6))
def test_a_job_line_keeps_jobs_in_their_own_order(load, seed):
    rnd = random.Random(seed)
    line, model = job_line(), []
    if load:
        line._reset(load)
    numbers = iter(range(1, 10**6))
    for step in range(3000):
        action = rnd.random()
        if action < 0.5 or not model:
            job = _jobs(rnd, 1, next(numbers))[0]
            line.add(job)
            model.append(job)
            model.sort(key=lambda j: j.key)
        elif action < 0.65:
            job = model.pop(rnd.randrange(len(model)))
            remove_from(line, job)
        elif action < 0.75:
            job = model.pop(rnd.randrange(len(model)))
            assert discarded(line, job)
        elif action < 0.85:
            first = line[0]
            assert first is model[0]
            remove_from(line, first)          # a lease
            model.pop(0)
        elif action < 0.92:
            gone = _jobs(rnd, 1, next(numbers))[0]
            assert gone not in line and not discarded(line, gone)
            with pytest.raises(ValueError):
                remove_from(line, gone)
        else:
            start = rnd.randrange(len(model) + 2)
            assert list(line.islice(start, start + 5)) == model[start:start + 5]
        assert len(line) == len(model) and bool(line) == bool(model)
        if model:
            assert line[0] is model[0] and line[-1] is model[-1]
            i = rnd.randrange(len(model))
            assert line[i] is model[i] and model[i] in line
    assert list(line) == model


def test_jobs_compare_by_key_and_stay_equal_only_to_themselves():
    a = Job("a", 1, "q", b"", priority=2, created=5)
    b = Job("b", 2, "q", b"", priority=1, created=0)
    assert a < b and not b < a and sorted([b, a]) == [a, b]   # higher priority first
    twin = Job("a", 1, "q", b"", priority=2, created=5)
    assert a.key == twin.key and a != twin and len({a, twin}) == 2


def test_an_empty_line():
    line = job_line()
    assert not line and len(line) == 0 and list(line) == []
    with pytest.raises(IndexError):
        line[0]
    with pytest.raises(IndexError):
        line.pop(0)
    assert not discarded(line, Job("a", 1, "q", b""))


def _line_bytes_per_job(line, jobs) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for job in jobs:
            line.add(job)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / len(jobs)


def test_a_job_line_costs_about_a_pointer_per_job():
    """A queue's line (and a TTL line) is a SortedList of the jobs: no stored
    keys (a SortedKeyList's second list would cost ~18 B a job, see timers.py)."""
    jobs = [Job("j", n, "q", b"", created=n) for n in range(1, 50_001)]
    assert _line_bytes_per_job(job_line(), jobs) < 10


def test_a_schedule_line_sorts_sleeping_jobs_by_time_then_number():
    rnd = random.Random(4)
    jobs = [Job(str(n), n, "q", b"", priority=rnd.randrange(-3, 4), created=0,
                sched=rnd.randrange(10**6, 10**6 + 50)) for n in range(1, 400)]
    line = schedule_line()
    for job in rnd.sample(jobs, len(jobs)):
        line.add(job)
    expected = sorted(jobs, key=schedule_key)
    assert list(line) == expected
    for job in rnd.sample(jobs, 100):
        remove_from(line, job)
        expected.remove(job)
    while expected:                      # wake-ups take the first
        first = line[0]
        assert first is expected.pop(0)
        remove_from(line, first)
    assert not line


def test_a_queue_removes_and_discards_jobs_wherever_they_are():
    rnd = random.Random(9)
    queue = JobQueue("q")
    jobs = _jobs(rnd, 200)
    for job in jobs:
        queue.push(job)
    assert queue.holds(digest(b""))                     # the content index, built now
    expected = sorted(jobs, key=lambda j: j.key)
    queue.remove(expected.pop(0))                       # a lease: the first
    for job in rnd.sample(expected, 50):
        queue.discard(job)
        expected.remove(job)
        queue.discard(job)                              # gone already: nothing happens
    assert list(queue.ready) == expected
    for job in expected:
        queue.remove(job)
    assert not queue.ready and not queue.holds(digest(b""))


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
    timer = Timer(1000, "ttr", job.id)
    timers.add(job)
    timers.add(timer)
    assert list(timers.due(1000)) == [timer, job]
