"""Each job's outcome as its client saw it, in the history and in ``/metrics`` alike.

One durable 2-shard server, driven over real sockets with workq, takeanumber
and goqueue:

- jobs leased when the server restarts: the restart gives them back
  (``released``), and they are leased again and completed afterwards;
- jobs whose TTL runs out after they finished: still completed or failed,
  their run time that of the client's lease, not the TTL; and one job whose
  TTL runs out unfinished: expired;
- takeanumber ``RETRY``\\ s running out of retries: failed (after the retries
  the client made); a ``DONE`` and a goqueue ``DELETE`` of a reserved job:
  completed.

The metrics' completed, failed and expired counters per queue must equal
the history's outcomes per queue (one definition for both), and both what
the clients were told. ``queueserver history`` runs once, on the shared
real SparkSession, over the files the stopped server left.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Dict, Tuple

import pytest
from pyspark.sql import functions as F

from queueserver.client import Client, NotFound
from queueserver.history.app import run

from serverproc import ServerProcess, wait_for
from test_binary_protocols_server import GoWire, g_add, g_delete, g_reserve, reserved_fields
from test_history_end_to_end import SLACK, Span, timed
from test_metrics import by, settle
from wire import line_exchange

DAY = 86_400_000
TTL = 2_000                               # ms: long enough to finish first, short enough to wait for
RESTART, KEPT, TAN, GO = "oc-restart", "oc-kept", "oc-tan", "oc-go"
R = "00000000-0000-4000-a000-%012d"       # jobs leased across the restart
K = "00000000-0000-4000-b000-%012d"       # jobs of a short TTL
#: What each queue's jobs ended as, by the clients' own account.
EXPECTED = {RESTART: {"completed": 2},
            KEPT: {"completed": 1, "failed": 1, "expired": 1},
            TAN: {"completed": 1, "failed": 2},
            GO: {"completed": 1}}
COUNTERS = ("completed", "failed", "expired")
#: Jobs added and leases made after the restart (the metrics start again from zero then).
ADDED, LEASED = 3 + 3 + 1, 2 + 2 + 4 + 1


def outcome_counts(expected: Dict[str, int]) -> Dict[str, int]:
    return {c: expected.get(c, 0) for c in COUNTERS}


def gone(client: Client, id: str) -> bool:
    try:
        client.inspect_job(id)
        return False
    except NotFound:
        return True


def leased_across_a_restart(proc: ServerProcess) -> None:
    """Two jobs leased, the server restarted with the leases out; then leased again and completed."""
    with Client(port=proc.ports["workq"]) as client:
        for i in (1, 2):
            client.add(R % i, RESTART, b"r", 600_000, DAY)
        assert {client.lease([RESTART], 1000).id for _ in (1, 2)} == {R % 1, R % 2}
        proc.restart()
    with Client(port=proc.ports["workq"]) as client:
        for _ in (1, 2):
            client.complete(client.lease([RESTART], 10_000).id, b"after the restart")


def finished_before_their_ttl(proc: ServerProcess) -> Dict[str, Span]:
    """K1 completed and K2 failed (no fails allowed) at once, K3 never leased; all three live
    TTL ms. Returns the spans from before each lease to after its answer."""
    spans = {}
    with Client(port=proc.ports["workq"]) as client:
        for i in (1, 2, 3):
            client.add(K % i, KEPT, b"k", 60_000, TTL)
        for i, finish in ((1, client.complete), (2, client.fail)):
            def lease_and_finish():
                job = client.lease([KEPT], 1000)
                assert job.id == K % i
                finish(job.id, b"finished")
            _, spans[K % i] = timed(lease_and_finish)
        wait_for(lambda: all(gone(client, K % i) for i in (1, 2, 3)), 20, "the TTLs to run out")
    return spans


def takeanumber_retries_run_out(proc: ServerProcess) -> Dict[str, Tuple[str, int, int]]:
    """Two jobs RETRYed until none is left (0 and 1 retries allowed), one DONE:
    id -> (outcome, retries, leases) as the client saw them."""
    port = proc.ports["takeanumber"]
    seen = {}
    for allowed, body in ((0, "none"), (1, "one")):
        [added] = line_exchange(port, f"ADD {TAN} {allowed} {body}\r\n".encode())
        id = added[1:].strip().decode()
        exchange = [b"RESERVE %s\r\n" % TAN.encode(), f"RETRY {TAN} {id}\r\n".encode()] * (allowed + 1)
        answers = line_exchange(port, *exchange)
        assert answers[0::2] == [f"+{id} {body}\r\n".encode()] * (allowed + 1), answers
        assert answers[1::2] == [b"+OK\r\n"] * allowed + [b"-ERR No retries remaining.\r\n"], answers
        seen[id] = ("failed", allowed, allowed + 1)
    [added] = line_exchange(port, f"ADD {TAN} 3 done\r\n".encode())
    id = added[1:].strip().decode()
    assert line_exchange(port, f"RESERVE {TAN}\r\n".encode(), f"DONE {TAN} {id}\r\n".encode()) == [
        f"+{id} done\r\n".encode(), b"+OK\r\n"]
    seen[id] = ("completed", 0, 1)
    return seen


def goqueue_delete_of_a_reserved_job(proc: ServerProcess) -> int:
    wire = GoWire(proc.connect("goqueue"))
    try:
        number = wire.add(GO, data=b"g")
        assert reserved_fields(wire.call(g_reserve(GO)))[0] == number
        assert wire.call(g_delete(number)) == b"OK\0"
    finally:
        wire.close()
    return number


@pytest.fixture(scope="module")
def outcomes(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("outcomes")
    data, out = base / "data", base / "out"
    with ServerProcess(shards=2, protocols=["workq", "takeanumber", "goqueue"],
                       extra=["--data-dir", str(data)]) as proc:
        leased_across_a_restart(proc)
        spans = finished_before_their_ttl(proc)
        takeanumber = takeanumber_retries_run_out(proc)
        number = goqueue_delete_of_a_reserved_job(proc)

        def counted(samples) -> bool:   # every add and lease since the restart: the rest is in too
            return (sum(by(samples, "queueserver_jobs_added_total", "queue").values()) == ADDED
                    and sum(by(samples, "queueserver_jobs_leased_total", "queue").values()) == LEASED
                    and set(by(samples, "queueserver_shard_up", "shard").values()) == {1})

        samples = settle(proc, counted, "the adds and leases since the restart in the counters")
    summary = run([str(data / "history")], str(out), spark=spark, stale_after=3600)
    jobs = {r.id: r for r in spark.read.parquet(str(out / "jobs")).select(
        "*", *[F.unix_micros(c).alias(f"{c}_us") for c in ("finished",)]).collect()}
    return SimpleNamespace(summary=summary, out=out, jobs=jobs, spans=spans, takeanumber=takeanumber,
                           number=number, samples=samples)


def test_jobs_leased_at_a_restart_are_released_then_completed(outcomes):
    for i in (1, 2):
        job = outcomes.jobs[R % i]
        assert (job.outcome, job.leases, job.releases, job.attempts, job.requeues) == (
            "completed", 2, 1, 2, 0), job


def test_a_ttl_that_runs_out_after_the_finish_changes_nothing(outcomes):
    jobs = outcomes.jobs
    assert [jobs[K % i].outcome for i in (1, 2, 3)] == ["completed", "failed", "expired"]
    for i in (1, 2):
        job, span = jobs[K % i], outcomes.spans[K % i]
        assert span.w0 - SLACK * 1e6 <= job.finished_us <= span.w1 + SLACK * 1e6, (job, span)
        assert job.run_seconds <= span.m1 - span.m0 + SLACK, (job.run_seconds, span)
    assert jobs[K % 3].leases == 0 and jobs[K % 3].run_seconds is None


def test_retries_running_out_fail_the_job_and_done_or_delete_complete_it(outcomes):
    jobs = outcomes.jobs
    assert {id: (jobs[id].outcome, jobs[id].retries, jobs[id].leases)
            for id in outcomes.takeanumber} == outcomes.takeanumber
    [go] = [j for j in jobs.values() if j.queue == GO]
    assert (go.number, go.outcome, go.protocol) == (outcomes.number, "completed", "goqueue")


def test_history_and_metrics_agree_with_the_clients(spark, outcomes):
    summary = outcomes.summary
    queues = {q.queue: q.outcomes for q in summary.queues}
    for queue, expected in EXPECTED.items():
        history = queues[queue]
        assert {"completed": history["completed"] + history["taken"],
                "failed": history["failed"] + history["dead"],
                "expired": history["expired"]} == outcome_counts(expected), (queue, history)
        assert history["unfinished"] == history["deleted"] == 0, (queue, history)
        metrics = {c: by(outcomes.samples, f"queueserver_jobs_{c}_total", "queue").get(queue, 0)
                   for c in COUNTERS}
        assert metrics == outcome_counts(expected), (queue, metrics)
    # queue_minutes and failed count the same outcomes
    minutes = {r.queue: r for r in spark.read.parquet(str(outcomes.out / "queue_minutes"))
               .groupBy("queue").sum(*COUNTERS).collect()}
    for queue, expected in EXPECTED.items():
        assert [minutes[queue][f"sum({c})"] for c in COUNTERS] == list(outcome_counts(expected).values())
    failed = sorted((r.outcome, r.queue) for r in spark.read.parquet(str(outcomes.out / "failed")).collect())
    assert failed == [("failed", KEPT), ("failed", TAN), ("failed", TAN)]
