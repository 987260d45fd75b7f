"""End to end: a durable server keeps the history of a known workload over
workq and takeanumber (completed, failed, expired by TTL, requeued by TTR,
unfinished), and ``queueserver history`` on a real SparkSession counts it
exactly; and the wait and run times it reports (per job, and the p50/p95/p99
per queue and per minute) are those the test measured with its own clock.

One server run and one analysis serve both tests (the ``history`` fixture):
a Spark run of the history costs tens of seconds."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import pytest
from pyspark.sql import functions as F

from queueserver.client import Client, NotFound
from queueserver.history.app import run

from serverproc import ServerProcess, wait_for
from wire import line_exchange

ID = "00000000-0000-4000-8000-%012d"
DAY = 86_400_000


def drive_workload(proc: ServerProcess) -> None:
    with Client(port=proc.ports["workq"]) as client:
        for i in range(1, 7):
            client.add(ID % i, "e2e-a", b"p" * i, 60_000, DAY)
        for i in range(1, 5):
            client.complete(client.lease(["e2e-a"], 1000).id, b"ok")
        for i in range(5, 7):
            client.fail(client.lease(["e2e-a"], 1000).id, b"no")     # max-fails 0: final
        client.add(ID % 7, "e2e-a", b"slow", 300, DAY)              # a 300 ms lease
        assert client.lease(["e2e-a"], 1000).id == ID % 7
        wait_for(lambda: client.inspect_job(ID % 7).state != 4, 10, "the lease to run out")
        assert client.lease(["e2e-a"], 1000).id == ID % 7
        client.complete(ID % 7, b"second time")
        client.add(ID % 8, "e2e-x", b"mortal", 60_000, 300)          # lives 300 ms

        def expired() -> bool:
            try:
                client.inspect_job(ID % 8)
                return False
            except NotFound:
                return True

        wait_for(expired, 10, "the TTL to end")
        client.add(ID % 9, "e2e-a", b"left", 60_000, DAY)
        client.add(ID % 10, "e2e-a", b"left", 60_000, DAY)
    port = proc.ports["takeanumber"]
    ids = [line_exchange(port, f"ADD e2e-t 0 t{i}\r\n".encode())[0][1:].strip().decode() for i in range(3)]
    for id in ids[:2]:
        reserved, done = line_exchange(port, b"RESERVE e2e-t\r\n", f"DONE e2e-t {id}\r\n".encode())
        assert reserved.startswith(f"+{id}".encode()) and done == b"+OK\r\n"


# ------------------------------------------------------------ timed workload
TIMED = "e2e-timed"
TIMED_ID = "00000000-0000-4000-9000-%012d"
#: 23 jobs: p·23 is never a whole number for p = .5, .95, .99, so each
#: percentile is one plain order statistic (ranks 12, 22 and 23).
TIMED_JOBS = 23
#: These two are leased once and left until their 400 ms TTR runs out, then
#: leased again and completed: their first and last leases are ≥ 400 ms apart,
#: so wait (added → FIRST lease) and run (LAST lease → finish) are told apart.
LAPSING = {TIMED_ID % 10, TIMED_ID % 20}
LAPSE_TTR = 400
#: Beyond the bracket of the test's own round trips (see ``bracket``): the
#: server stamps whole µs of the wall clock, the test reads the monotonic
#: clock; both tick at the same (NTP-slewed) rate, so 2 ms is ample.
SLACK = 0.002
#: p50, p95, p99 per minute: what the README promises (not read from the code under test).
PERCENTILES = (0.5, 0.95, 0.99)
MINUTE_US = 60_000_000


def hold(i: int) -> float:
    """How long job i is held between its (last) lease and its completion:
    a permutation of 50, 65, ... 380 ms (5 s in all); the lapsing jobs 10
    and 20 get 65 and 80 ms, far inside their 400 ms TTR."""
    return 0.050 + 0.015 * (7 * i % TIMED_JOBS)


@dataclass(frozen=True)
class Span:
    """When one request was on its way, by the test's clocks: the server acted
    (and stamped the history) between sending and the answer."""
    m0: float   # time.monotonic() before sending
    m1: float   # time.monotonic() after the answer
    w0: int     # wall clock, µs, before sending (inside m0..m1)
    w1: int     # wall clock, µs, after the answer


T = TypeVar("T")


def timed(call: Callable[[], T]) -> Tuple[T, Span]:
    m0, w0 = time.monotonic(), time.time_ns() // 1000
    result = call()
    w1, m1 = time.time_ns() // 1000, time.monotonic()
    return result, Span(m0, m1, w0, w1)


def bracket(later: Span, earlier: Span) -> Tuple[float, float]:
    """The least and the most the server's (later − earlier) can be, seconds."""
    return later.m0 - earlier.m1, later.m1 - earlier.m0


@dataclass
class Timing:
    """One timed job, as the test saw it."""
    added: Span
    leases: List[Span] = field(default_factory=list)
    finished: Optional[Span] = None

    @property
    def wait(self) -> Tuple[float, float]:
        return bracket(self.leases[0], self.added)

    @property
    def run(self) -> Tuple[float, float]:
        return bracket(self.finished, self.leases[-1])


def drive_timed_workload(proc: ServerProcess) -> Dict[str, Timing]:
    """Add TIMED_JOBS jobs, then one worker leases them one at a time and holds
    each for a measured while before completing it: job k waits about the holds
    of the jobs before it, and runs its own hold. The lapsing jobs are not
    completed on their first lease; they come back when their TTR runs out."""
    timings: Dict[str, Timing] = {}
    with Client(port=proc.ports["workq"]) as client:
        for i in range(TIMED_JOBS):
            id = TIMED_ID % i
            ttr = LAPSE_TTR if id in LAPSING else 60_000
            _, span = timed(lambda: client.add(id, TIMED, b"timed %d" % i, ttr, DAY))
            timings[id] = Timing(span)
        done = 0
        while done < TIMED_JOBS:
            job, span = timed(lambda: client.lease([TIMED], 10_000))   # waits for a lapsed job
            timing = timings[job.id]
            timing.leases.append(span)
            if job.id in LAPSING and len(timing.leases) == 1:
                continue
            time.sleep(hold(int(job.id[-12:])))   # the job's run: the workload itself, measured
            _, timing.finished = timed(lambda: client.complete(job.id, b"done"))
            done += 1
    return timings


# --------------------------------------------------------------- one analysis
@pytest.fixture(scope="module")
def history(spark, tmp_path_factory):
    """Both workloads on one durable 2-shard server, stopped (every shard wrote
    its last lines), then one ``queueserver history`` run over its files."""
    base = tmp_path_factory.mktemp("history")
    data, out = base / "data", base / "out"
    with ServerProcess(shards=2, protocols=["workq", "takeanumber"],
                       extra=["--data-dir", str(data)]) as proc:
        drive_workload(proc)
        started = time.monotonic()
        timings = drive_timed_workload(proc)
        timed_seconds = time.monotonic() - started
    summary = run([str(data / "history")], str(out), spark=spark, stale_after=3600)
    return SimpleNamespace(summary=summary, out=out, timings=timings, timed_seconds=timed_seconds)


def test_the_history_of_a_known_workload_is_counted_exactly(spark, history):
    summary, out = history.summary, history.out
    assert summary.jobs == 13 + TIMED_JOBS
    assert summary.outcomes["completed"] == 7 + TIMED_JOBS
    assert summary.outcomes["failed"] == 2
    assert summary.outcomes["expired"] == 1
    assert summary.outcomes["unfinished"] == 3
    assert summary.malformed == 0 and not summary.unknown_versions
    jobs = {r["id"]: r.asDict() for r in spark.read.parquet(str(out / "jobs")).collect()}
    slow = jobs[ID % 7]
    assert slow["requeues"] == 1 and slow["attempts"] == 2 and slow["outcome"] == "completed"
    assert slow["protocol"] == "workq" and slow["queue"] == "e2e-a"
    taken = [r for r in jobs.values() if r["queue"] == "e2e-t"]
    assert sorted(r["protocol"] for r in taken) == ["takeanumber"] * 3
    assert sorted(str(r["outcome"]) for r in taken) == ["None", "completed", "completed"]
    assert jobs[ID % 8]["outcome"] == "expired"
    assert (out / "report.html").read_text().count("e2e-") >= 3


def order_statistic(values: Sequence[float], p: float) -> float:
    """What ``percentile_approx(x, p)`` returns while the values are fewer than
    its accuracy (10,000): the nearest-rank percentile, the value of rank ⌈p·n⌉."""
    return sorted(values)[max(0, math.ceil(p * len(values)) - 1)]


def check_percentiles(got: Sequence[Optional[float]], brackets: Sequence[Tuple[float, float]],
                      what: str) -> List[float]:
    """``got`` (p50, p95, p99) against the same percentiles of the brackets.

    Each job's server value lies in its bracket [lo, hi]; a rank statistic
    is monotone in every value, so the k-th smallest server value lies
    between the k-th smallest lo and the k-th smallest hi. The tolerance of a
    percentile is thus exactly that of one job, with nothing added for the
    percentile (percentile_approx is exact on so few values). Returns how far
    each is from the percentile of the brackets' midpoints."""
    deviations = []
    for p, value in zip(PERCENTILES, got):
        lo = order_statistic([b[0] for b in brackets], p)
        hi = order_statistic([b[1] for b in brackets], p)
        assert value is not None and lo - SLACK <= value <= hi + SLACK, \
            f"{what} p{round(p * 100)} = {value} s; the test measured {lo:.6f}..{hi:.6f} s"
        deviations.append(value - order_statistic([(a + b) / 2 for a, b in brackets], p))
    return deviations


def test_wait_and_run_percentiles_are_those_the_test_measured(spark, history):
    """Per job: added, first and last leased and finished lie within the test's
    wall-clock spans of those requests, and the ``jobs`` table's wait and run
    within what its monotonic clock allows (see ``bracket``), ± SLACK. Per
    queue (the summary) and per queue and minute (``queue_minutes``): p50, p95
    and p99 of wait and run within the same percentiles of those bounds.

    The tolerance is the test's own uncertainty: a server timestamp is taken
    while its request is on the wire, so a difference of two of them is known
    to within the two requests' round trips (loopback plus an fsync each, as
    the server is durable: typically a few ms, more on a loaded machine), plus
    SLACK for µs truncation and the two clocks. It is printed."""
    timings: Dict[str, Timing] = history.timings
    assert len(timings) == TIMED_JOBS and all(t.finished is not None for t in timings.values())
    us = lambda c: F.unix_micros(c).alias(c)   # noqa: E731 (timestamps as µs, no time zone)
    rows = {r.id: r for r in spark.read.parquet(str(history.out / "jobs")).where(F.col("queue") == TIMED)
            .select("id", "outcome", "leases", "requeues", "attempts", "wait_seconds", "run_seconds",
                    *[us(c) for c in ("added", "first_leased", "last_leased", "finished")]).collect()}
    assert rows.keys() == timings.keys()

    def within(us_value: int, span: Span) -> bool:
        return span.w0 - SLACK * 1e6 <= us_value <= span.w1 + SLACK * 1e6

    errors, widths = [], []
    for id, t in sorted(timings.items()):
        row = rows[id]
        lapsed = id in LAPSING
        assert (row.outcome, row.leases, row.requeues, row.attempts) == \
            ("completed", 2 if lapsed else 1, 1 if lapsed else 0, 2 if lapsed else 1), id
        assert len(t.leases) == row.leases
        for name, span in [("added", t.added), ("first_leased", t.leases[0]),
                           ("last_leased", t.leases[-1]), ("finished", t.finished)]:
            assert within(row[name], span), f"{id} {name} at {row[name]} µs, sent/answered {span.w0}..{span.w1}"
        for name, (lo, hi) in [("wait_seconds", t.wait), ("run_seconds", t.run)]:
            assert lo - SLACK <= row[name] <= hi + SLACK, \
                f"{id} {name} = {row[name]} s; the test measured {lo:.6f}..{hi:.6f} s"
            errors.append(row[name] - (lo + hi) / 2)
            widths.append(hi - lo)
    # The workload is what it should be: each run is at least its hold, and a
    # lapsing job's run is more than its TTR shorter than "finish − first lease".
    for id, t in timings.items():
        assert t.run[0] >= hold(int(id[-12:])) - SLACK
        if id in LAPSING:
            assert t.run[1] < bracket(t.finished, t.leases[0])[0] - LAPSE_TTR / 1000

    waits, runs = [t.wait for t in timings.values()], [t.run for t in timings.values()]
    queue = {q.queue: q for q in history.summary.queues}[TIMED]
    assert queue.jobs == TIMED_JOBS and queue.outcomes["completed"] == TIMED_JOBS
    deviations = check_percentiles(queue.wait, waits, "summary wait")
    deviations += check_percentiles(queue.run, runs, "summary run")

    # queue_minutes: the percentiles of the jobs finished in each minute (the
    # workload may cross a minute boundary; the server's finish time, checked
    # above against the test's wall clock, says which minute a job is in).
    minutes = (spark.read.parquet(str(history.out / "queue_minutes")).where(F.col("queue") == TIMED)
               .select(us("minute"), "completed", "wait_p50", "wait_p95", "wait_p99",
                       "run_p50", "run_p95", "run_p99").collect())
    by_minute: Dict[int, List[str]] = {}
    for id, row in rows.items():
        by_minute.setdefault(row.finished - row.finished % MINUTE_US, []).append(id)
    for m in minutes:   # a minute with adds or leases but no finish: no percentiles
        if not m.completed:
            assert m.minute not in by_minute and set(m[2:]) == {None}, m
    minutes = [m for m in minutes if m.completed]
    assert sorted(m.minute for m in minutes) == sorted(by_minute)
    for m in minutes:
        ids = by_minute[m.minute]
        assert m.completed == len(ids)
        deviations += check_percentiles([m.wait_p50, m.wait_p95, m.wait_p99],
                                        [timings[id].wait for id in ids], f"minute {m.minute} wait")
        deviations += check_percentiles([m.run_p50, m.run_p95, m.run_p99],
                                        [timings[id].run for id in ids], f"minute {m.minute} run")
    print(f"\n{TIMED_JOBS} timed jobs ({history.timed_seconds:.1f} s) finished in {len(minutes)} "
          f"minute(s): server - measured midpoint "
          f"per job within {max(map(abs, errors)) * 1e3:.1f} ms (bracket width median "
          f"{sorted(widths)[len(widths) // 2] * 1e3:.1f} ms, max {max(widths) * 1e3:.1f} ms), "
          f"percentiles within {max(map(abs, deviations)) * 1e3:.1f} ms")
