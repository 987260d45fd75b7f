"""The compact job record: its packed order key and flags give back exactly
what was put in, and keys sort as the (-priority, sched, created, number)
tuples they stand for."""
from __future__ import annotations

import gc
import random
import sys

import pytest

import queueserver

from queueserver.engine.job import (COMPLETED, FAILED, LEASED, NEW, PENDING, UNLIMITED_ATTEMPTS, Job,
                                    pack_order, schedule_key, unpack_order)
from queueserver.engine.timers import Timer

YEAR_0 = -62_167_219_200_000_000          # 0000-01-01T00:00:00Z in µs, workq's earliest time
YEAR_9999 = 253_402_300_799_000_000       # 9999-12-31T23:59:59Z


def test_order_round_trips_at_the_edges():
    for order in [(0, 0, 0, 0), (-2**31, YEAR_0, 0, 1), (2**31, YEAR_9999, 2**56, 2**58 - 1),
                  (-(2**63), 1_767_225_600_000_000, 1_767_225_600_000_000, 12345),
                  (2**64 - 1, -1, -(2**57), 7), (-5, 2**62 - 1, 2**57 - 1, 0)]:
        minus_priority, sched, created, number = order
        assert unpack_order(pack_order(-minus_priority, sched, created, number)) == order


def test_keys_sort_as_order_tuples():
    rnd = random.Random(9)
    orders = []
    for _ in range(3000):
        orders.append((rnd.choice([0, 0, 0, 1, -1, 5, -(2**63), 2**32 - 1, rnd.randrange(-2**40, 2**40)]),
                       rnd.choice([YEAR_0, YEAR_9999, 1_767_225_600_000_000 + rnd.randrange(5)]),
                       rnd.choice([1_767_225_600_000_000 + rnd.randrange(5), 0]),
                       rnd.randrange(1, 50)))
    keyed = sorted(orders, key=lambda o: pack_order(-o[0], o[1], o[2], o[3]))
    assert keyed == sorted(orders)


def test_a_priority_0_key_is_a_48_byte_int():
    import sys
    key = pack_order(0, YEAR_9999, 2**57 - 1, 2**58 - 1)
    assert sys.getsizeof(key) <= 48


@pytest.mark.parametrize("field", ["sched", "created", "number"])
def test_an_order_out_of_range_is_refused_not_misplaced(field):
    args = {"sched": 0, "created": 0, "number": 1}
    args[field] = {"sched": 2**62, "created": 2**57, "number": 2**58}[field]
    with pytest.raises(ValueError):
        pack_order(0, **args)
    with pytest.raises(ValueError):
        pack_order(0, **{**args, field: -(2**63)})


def test_job_fields_round_trip():
    job = Job("id-1", 42, "q", b"data", priority=-7, ttr=2**64 - 1, ttl=2**64 - 1,
              max_attempts=2**32 - 2, max_fails=2**32 - 1, created=1000, sched=5000,
              foreground=True, scheduled=True)
    assert (job.id, job.number, job.name, job.payload, job.priority, job.ttr, job.ttl) == \
        ("id-1", 42, "q", b"data", -7, 2**64 - 1, 2**64 - 1)
    assert (job.max_attempts, job.max_fails, job.fails, job.created, job.sched) == \
        (2**32 - 2, 2**32 - 1, 0, 1000, 5000)
    assert job.foreground and job.scheduled and job.order == (7, 5000, 1000, 42)
    assert job.due == 5000 + (2**64 - 1) * 1000
    plain = Job("id-2", 1, "q", b"", max_attempts=UNLIMITED_ATTEMPTS, created=77)
    assert (plain.priority, plain.ttr, plain.ttl, plain.due, plain.max_attempts, plain.sched) == \
        (0, 0, 0, None, UNLIMITED_ATTEMPTS, 77)
    assert not plain.foreground and not plain.scheduled and plain.attempts_left


def test_fails_count_up_and_leave_the_rest_alone():
    job = Job("a", 1, "q", b"", ttr=30, ttl=60, max_attempts=3, max_fails=2**32 - 1)
    for n in range(1, 4):
        job.fails += 1
        assert (job.fails, job.ttr, job.ttl, job.max_attempts, job.max_fails) == (n, 30, 60, 3, 2**32 - 1)
    job.fails = 2**32
    assert job.fails == 2**32 and job.ttl == 60
    with pytest.raises(ValueError):
        job.fails = 2**33


def test_jobs_added_alike_share_one_flags_object():
    a = Job("a", 1, "q", b"", ttr=5000, ttl=3_600_000, created=1)
    b = Job("b", 2, "q", b"", ttr=5000, ttl=3_600_000, created=2)
    assert a.flags is b.flags


def test_a_job_is_an_80_byte_object():
    import sys
    job = Job("a", 1, "q", b"", priority=3, ttr=5000, ttl=3_600_000, created=1)
    # six slots and the GC header (3.11); eight took 96. A compiled Job (mypyc)
    # also points to its class's method table: 8 bytes more.
    assert sys.getsizeof(job) <= (88 if queueserver.COMPILED else 80)


def test_state_and_attempts_live_in_the_shared_flags_without_touching_the_rest():
    a = Job("a", 1, "q", b"", ttr=30, ttl=60, max_attempts=7, max_fails=2, created=1, foreground=True)
    b = Job("b", 2, "q", b"", ttr=30, ttl=60, max_attempts=7, max_fails=2, created=2, foreground=True)
    assert (a.state, a.attempts) == (NEW, 0)
    for job in (a, b):
        job.state = LEASED
        job.attempts += 1
    assert a.flags is b.flags and (a.state, a.attempts) == (LEASED, 1)
    a.attempts = 2**45 - 1
    a.state = FAILED
    a.fails = 2
    assert (a.state, a.attempts, a.fails, a.ttr, a.ttl, a.max_attempts, a.max_fails, a.foreground) == \
        (FAILED, 2**45 - 1, 2, 30, 60, 7, 2, True)
    assert a.finished and not a.success and not a.attempts_left
    a.due = None
    assert (a.state, a.attempts, a.ttl) == (FAILED, 2**45 - 1, 0)
    with pytest.raises(ValueError):
        a.attempts = 2**45
    with pytest.raises(ValueError):
        a.attempts = -1
    with pytest.raises(ValueError):
        a.state = 5
    assert (a.state, a.attempts) == (FAILED, 2**45 - 1)


def test_ttl_deadline_follows_the_schedule_and_ends_with_none():
    job = Job("a", 1, "q", b"", ttl=250, created=1_000_000, sched=3_000_000)
    assert job.due == 3_250_000 and job.line == (250, 0)
    job.due = 3_250_000          # what the engine sets when it starts the TTL: kept as is
    assert job.due == 3_250_000
    job.due = None               # the job left the shard
    assert job.due is None and job.ttl == 0


def test_attempts_left_follows_max_attempts():
    capped = Job("a", 1, "q", b"")                      # workq's 0: up to 255
    capped.attempts = 254
    assert capped.attempts_left
    capped.attempts = 255
    assert not capped.attempts_left
    one = Job("b", 2, "q", b"", max_attempts=1)
    one.attempts = 1
    assert not one.attempts_left
    unlimited = Job("c", 3, "q", b"", max_attempts=UNLIMITED_ATTEMPTS)
    unlimited.attempts = 10_000
    assert unlimited.attempts_left


def test_timer_and_result_share_a_slot_without_mixing():
    job = Job("a", 1, "q", b"")
    assert job.timer is None and job.result is None
    timer = Timer(10, "ttr", job.id)
    job.state = LEASED
    job.timer = timer
    assert job.timer is timer and job.result is None
    job.timer = None
    job.state = COMPLETED
    job.result = b"done"
    assert job.result == b"done" and job.timer is None and job.success and job.finished
    job.timer = None             # clearing a timer a finished job does not have keeps its result
    assert job.result == b"done"
    job.state = PENDING          # retried: a new lease's timer replaces the old result
    assert job.timer is None
    job.state = LEASED
    job.timer = timer
    assert job.timer is timer and job.result is None
    job.timer = None
    job.state = FAILED
    job.result = None
    assert job.result is None and job.finished and not job.success


def test_restored_order_is_kept_exactly():
    job = Job("a", 9, "q", b"", priority=3, created=100, sched=100)
    job.order = (-3, 50, 40, 9)   # (as the engine restores it: a tuple)
    assert job.order == (-3, 50, 40, 9) and (job.priority, job.sched, job.created, job.number) == (3, 50, 40, 9)


def test_schedule_key_sorts_as_sched_then_number():
    jobs = [Job(str(n), n, "q", b"", created=0, sched=s, priority=p)
            for n, s, p in [(5, 300, 0), (1, 300, 9), (7, 100, -2), (2, YEAR_0, 0), (3, YEAR_9999, 0)]]
    assert [j.number for j in sorted(jobs, key=schedule_key)] == [2, 7, 1, 5, 3]


def test_a_job_and_its_timer_make_no_cycle():
    """A timer names its job by id: compiled, a job is kept out of the cyclic
    GC (no GC header), so a cycle through it would never be freed."""
    job = Job("a", 1, "q", b"")
    job.state = LEASED
    job.timer = Timer(10, "ttr", job.id)
    assert job not in gc.get_referents(job.timer)
    if queueserver.COMPILED:
        assert not gc.is_tracked(job)


def test_a_queued_job_is_one_small_object_and_a_leased_one_keeps_its_payload():
    """A queued job has no slot for a timer or a result: those share the
    payload's slot (with the payload) only while the job has one."""
    job = Job("a", 1, "q", b"body")
    if queueserver.COMPILED:   # header, vtable pointer, five slots; no GC header
        assert sys.getsizeof(job) == 64
    job.state = LEASED
    job.timer = Timer(10, "ttr", job.id)
    assert job.payload == b"body" and job.timer is not None and job.result is None
    job.timer = None
    job.state = COMPLETED
    job.result = b"r"
    assert job.payload == b"body" and job.result == b"r" and job.timer is None
    job.result = None
    assert job.payload == b"body" and job.result is None
