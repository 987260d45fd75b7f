"""What a queued job costs the engine, measured with tracemalloc (no timing).

The engine is given 100,000 jobs the way a shard gets them: 36-character
ids and 100-byte payloads decoded per request, a TTL (so every job is also a
deadline), a TTR, 256 queues, numbers from the router, a clock that moves.
tracemalloc counts the bytes Python asked for, which is deterministic for a
given Python version; what the allocator rounds up and the process keeps
on top shows only in ``make bench`` (loadtests/bench.py, section 4).

Where a job's bytes go (CPython 3.11, 64-bit; before issue 9 -> now): the
Job object (20 slots, 192 -> 5 slots, 80, or 64 compiled: its state and
attempts live in the shared flags int, its timer or result beside its
payload only while it has one), its order tuple and separate int fields (order 72,
creation and number ~64 -> one 48-byte key), its TTL deadline (36 -> 0,
derived from schedule and TTL), the ready and TTL lists (~34 -> ~17, no
stored keys: since issue 18 sortedcontainers' SortedList of the jobs
themselves, ordered by Job.__lt__, ~18); unchanged: the id string (85), the
payload's bytes header (33) and the jobs dict entry (~38 at 100,000 jobs).
In all ~560 -> 294 (286 compiled).
"""
from __future__ import annotations

import gc
import tracemalloc

from queueserver.engine import Engine
from queueserver.engine.status import OK

JOBS = 100_000
PAYLOAD = 100
#: Measured 294 bytes per job beyond the payload in plain Python (everything
#: the engine keeps for it, its id string included; 286 compiled) with
#: CPython 3.11; the bound leaves ~5%. Before issue 9 the same measure gave
#: 560; with 8-slot jobs, 318; with 6 slots, 302; with the hand-written
#: sorted line that issue 18 replaced by sortedcontainers, 301.
BOUND = 309


def _bytes_per_job(ttl: int) -> float:
    engine = Engine()
    names = [f"queue-{i}" for i in range(256)]
    now = 1_767_225_600_000_000
    for name in names:
        engine.execute("create_queue", [name], now)
    pad = b"." * (PAYLOAD - 36)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(JOBS):
            # Fresh objects per job, as decoding each request makes them.
            id = "%08x-0000-4000-8000-%012x" % (i * 7919 % 2**32, i)
            payload = id.encode() + pad
            reply = engine.execute("add", [id, names[i % 256], payload, 0, 30_000, ttl, 0, 0,
                                           None, False, i + 1], now + i * 3).reply
            assert reply[0] == OK
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(engine.jobs) == JOBS
    return (after - before) / JOBS - PAYLOAD


def test_a_queued_job_costs_the_engine_little_beyond_its_payload():
    per_job = _bytes_per_job(ttl=3_600_000)
    assert per_job <= BOUND, f"{per_job:.1f} bytes per queued job beyond the payload"


def test_a_job_without_ttl_costs_no_more():
    assert _bytes_per_job(ttl=0) <= BOUND
