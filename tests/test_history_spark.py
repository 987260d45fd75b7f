"""``queueserver history`` (queueserver/history/) on a real local Spark.

A synthetic history with known outcomes, written the way shards write it
(JSON lines per shard, rotated files, a file being written that ends in a
partial line), is turned into tables; every count and a few times are
checked against what the history was built to contain. The history is
also fed in two batches to check that incremental runs add up to one run
over everything.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from queueserver import cli
from queueserver.history.app import run
from queueserver.history.errors import HistoryError
from queueserver.history.summary import Summary

S = 1_000_000                                   # µs per second
T0 = 1_709_247_600 * S                          # 2024-02-29 23:00:00 UTC
MIDNIGHT = T0 + 3600 * S                        # 2024-03-01 00:00:00 UTC
END = T0 + 3 * 3600 * S                         # the newest event of the history
STALE_AFTER = 3600
QUEUES = {"emails": "workq", "images": "goqueue", "reports": "taskflux", "orders": "queued",
          "sms": "takeanumber"}
SHARDS = 3
LINES_PER_FILE = 40
CUT = T0 + 4000 * S                             # batch 1 is what was written before this


# --------------------------------------------------------------------------- the history
# A job's life as (seconds after it was added, event, attempt); outcome is what it should end as.
KINDS: Dict[str, Tuple[List[Tuple[float, str, int]], str]] = {
    "completed": ([(0, "added", 0), (1.5, "leased", 1), (4, "completed", 1)], "completed"),
    "failed": ([(0, "added", 0), (2, "leased", 1), (3, "failed", 1)], "failed"),
    "dead": ([(0, "added", 0), (1, "leased", 1), (31, "requeued", 1), (32, "leased", 2),
              (62, "dead", 2)], "dead"),
    "expired": ([(0, "added", 0), (120, "expired", 0)], "expired"),
    "ttr_completed": ([(0, "added", 0), (2, "leased", 1), (32, "requeued", 1), (35, "leased", 2),
                       (45, "completed", 2)], "completed"),
    "released_completed": ([(0, "added", 0), (1, "leased", 1), (5, "released", 1),
                            (6, "leased", 2), (9, "completed", 2)], "completed"),
    "retried_completed": ([(0, "added", 0), (1, "leased", 1), (2, "retried", 1), (3, "leased", 2),
                           (4, "completed", 2)], "completed"),
    "deleted": ([(0, "added", 0), (7, "deleted", 0)], "deleted"),
    "taken": ([(0, "added", 0), (3, "taken", 0)], "taken"),
    # A take that never reached its client is given back: the job goes on.
    "taken_returned": ([(0, "added", 0), (3, "taken", 0), (3, "returned", 0)], "unfinished"),
    "stale": ([(0, "added", 0)], "unfinished"),
    "stale_leased": ([(0, "added", 0), (10, "leased", 1)], "unfinished"),
}
# How many jobs of each kind each queue gets (varied, so per-queue counts mean something).
PLAN = {
    "emails": {"completed": 12, "failed": 2, "dead": 1, "expired": 1, "ttr_completed": 3,
               "released_completed": 1, "retried_completed": 1, "deleted": 1, "stale": 2},
    "images": {"completed": 8, "failed": 1, "dead": 2, "expired": 3, "ttr_completed": 1,
               "deleted": 2, "stale_leased": 1},
    "reports": {"completed": 5, "dead": 1, "expired": 1, "retried_completed": 2, "taken": 2,
                "taken_returned": 1, "stale": 1},
    "orders": {"completed": 9, "failed": 3, "taken": 4, "taken_returned": 1, "deleted": 1},
    "sms": {"completed": 4, "expired": 2, "released_completed": 2, "stale": 3},
}
FRESH = 4                 # unfinished jobs added near the end of each queue's history: not stale
PERCENTILE_MINUTE = T0 + 8040 * S   # 10 "reports" jobs finish in this minute, and nothing else there


@dataclass
class Job:
    id: str
    queue: str
    kind: str
    added: int
    shard: int
    number: int
    events: List[Tuple[int, str, int]] = field(default_factory=list)   # (µs, event, attempt)

    @property
    def outcome(self) -> str:
        return KINDS[self.kind][1] if self.kind in KINDS else self.kind


def make_jobs() -> List[Job]:
    jobs: List[Job] = []

    def new(queue: str, kind: str, added: int, script: List[Tuple[float, str, int]]) -> Job:
        n = len(jobs)
        job = Job(f"00000000-0000-4000-8000-{n:012d}", queue, kind, added, n % SHARDS, n + 1)
        job.events = [(added + round(dt * S), event, attempt) for dt, event, attempt in script]
        jobs.append(job)
        return job

    slot = 0
    for queue, kinds in PLAN.items():
        for kind, count in kinds.items():
            for _ in range(count):
                new(queue, kind, T0 + slot * 80 * S, KINDS[kind][0])
                slot += 1
        for i in range(FRESH):
            new(queue, "unfinished", END - (600 - 60 * i) * S, [(0, "added", 0), (30, "leased", 1)])
    for k in range(1, 11):           # wait k s, run 20 + 3k s, all finishing in PERCENTILE_MINUTE
        start = PERCENTILE_MINUTE - 20 * S
        new("reports", "completed", start,
            [(0, "added", 0), (k, "leased", 1), (20 + 4 * k, "completed", 1)])
    new("emails", "completed", END - 10 * S, [(0, "added", 0), (5, "leased", 1), (10, "completed", 1)])
    # Every early job is over (or stale) well before the percentile minute and the stale line.
    early = [j for j in jobs if j.added < T0 + slot * 80 * S]
    assert max(t for j in early for t, _, _ in j.events) < min(END - STALE_AFTER * S,
                                                                      PERCENTILE_MINUTE - 60 * S)
    assert max(t for j in jobs for t, _, _ in j.events) == END
    return jobs


JOBS = make_jobs()


def line(job: Job, at: int, event: str, attempt: int, version: int = 1) -> str:
    final = event in ("completed", "failed", "dead", "expired", "deleted", "taken")
    return json.dumps({
        "v": version, "time": at, "shard": job.shard, "event": event,
        "protocol": QUEUES[job.queue] if event == "added" else ("workq" if event == "leased" else None),
        "queue": job.queue, "id": job.id, "number": job.number, "attempt": attempt,
        "priority": job.number % 3, "size": 100 + job.number, "outcome": event if final else None,
        "conn": f"0-{job.number}" if event == "leased" else None}, separators=(",", ":")) + "\n"


@dataclass
class HistoryFile:
    path: str            # relative to the history directory
    data: bytes
    cut: int             # bytes of it written before CUT (0: not there yet)


def history_files() -> List[HistoryFile]:
    """Every shard's lines in time order, rotated every LINES_PER_FILE lines; shard 1's first file
    also holds two records of schema version 2 and a malformed line, and shard 2's last file ends
    in a partial line that is never finished."""
    files: List[HistoryFile] = []
    for shard in range(SHARDS):
        lines = sorted((at, i, line(job, at, event, attempt))
                       for i, job in enumerate(JOBS) if job.shard == shard
                       for at, event, attempt in job.events)
        for n, first in enumerate(range(0, len(lines), LINES_PER_FILE)):
            chunk = [(at, text) for at, _, text in lines[first:first + LINES_PER_FILE]]
            if shard == 1 and n == 0:
                chunk[5:5] = [(T0, line(JOBS[1], T0, "added", 0, version=2)),
                              (T0, "{this is not json\n"),
                              (T0, line(JOBS[1], T0, "leased", 1, version=2))]
            data = "".join(text for _, text in chunk).encode()
            if shard == 2 and first + LINES_PER_FILE >= len(lines):
                data += b'{"v":1,"time":17092'
            before = [at < CUT for at, _ in chunk]
            if all(before):
                cut = len(data)
            elif not before[0]:
                cut = 0
            else:                      # the file being written at CUT: ends mid-line
                cut = len("".join(text for _, text in chunk[:before.index(False)])) + 25
            files.append(HistoryFile(f"shard-{shard}/history-{lines[first][0]}-{n + 1:06d}.jsonl",
                                     data, cut))
    return files


FILES = history_files()


def write_history(root: Path, batch: int) -> None:
    """Batch 1: what existed at CUT. Batch 2 (after batch 1): the rest, appended as a writer would."""
    for f in FILES:
        path = root / "history" / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if batch == 1 and f.cut:
            path.write_bytes(f.data[:f.cut])
        elif batch == 2 and f.cut < len(f.data):
            with open(path, "ab") as out:
                out.write(f.data[f.cut:])


def expected_outcomes(queue: str = "") -> Dict[str, int]:
    counts = {o: 0 for o in ("completed", "failed", "dead", "expired", "deleted", "taken", "unfinished")}
    for job in JOBS:
        if queue in ("", job.queue):
            counts[job.outcome] += 1
    return counts


def event_count(event: str) -> int:
    return sum(1 for job in JOBS for _, e, _ in job.events if e == event)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def full(spark, tmp_path_factory) -> Tuple[Path, Summary]:
    """One run over the whole history (in ``<root>/history``, the layout of a data directory)."""
    root = tmp_path_factory.mktemp("full")
    write_history(root, 1)
    write_history(root, 2)
    out = root / "out"
    return out, run([str(root / "history")], str(out), spark=spark, stale_after=STALE_AFTER)


def rows(spark, path: Path, *order: str) -> list:
    return [r.asDict() for r in spark.read.parquet(str(path)).orderBy(*order).collect()]


# --------------------------------------------------------------------------- tests
def test_every_job_and_outcome_is_counted(spark, full):
    out, summary = full
    assert summary.jobs == len(JOBS) == 115
    assert summary.outcomes == expected_outcomes()
    assert {q.queue: q.outcomes for q in summary.queues} == {q: expected_outcomes(q) for q in QUEUES}
    assert summary.records == sum(len(job.events) for job in JOBS)
    assert summary.first_event == T0 and summary.last_event == END

    jobs = spark.read.parquet(str(out / "jobs"))
    assert jobs.count() == len(JOBS)
    assert {r.queue: r["count"] for r in jobs.groupBy("queue").count().collect()} == {
        q: sum(1 for j in JOBS if j.queue == q) for q in QUEUES}
    assert {r.date: r["count"] for r in jobs.groupBy("date").count().collect()} == {
        date(2024, 2, 29): sum(1 for j in JOBS if j.added < MIDNIGHT),
        date(2024, 3, 1): sum(1 for j in JOBS if j.added >= MIDNIGHT)}
    assert {r.outcome: r["count"] for r in jobs.groupBy("outcome").count().collect()} == {
        (None if o == "unfinished" else o): n for o, n in expected_outcomes().items() if n}
    assert {r.protocol for r in jobs.select("protocol").distinct().collect()} == set(QUEUES.values())
    totals = jobs.groupBy().sum("leases", "requeues", "releases", "retries", "returns").first()
    assert list(totals) == [event_count(e) for e in ("leased", "requeued", "released", "retried",
                                                     "returned")]
    assert sorted(p.name for p in (out / "jobs").glob("date=*")) == ["date=2024-02-29",
                                                                      "date=2024-03-01"]
    assert sorted(p.name for p in (out / "jobs" / "date=2024-03-01").iterdir()) == sorted(
        f"queue={q}" for q in QUEUES)


def test_queue_minutes_count_each_event_and_each_outcome_once(spark, full):
    out, _ = full
    minutes = spark.read.parquet(str(out / "queue_minutes"))
    sums = minutes.groupBy().sum("added", "leased", "completed", "failed", "expired", "requeued",
                                 "deleted", "taken").first()
    outcomes = expected_outcomes()   # a take given back ("returned") is no outcome
    assert list(sums) == [event_count("added"), event_count("leased"), outcomes["completed"],
                          outcomes["failed"] + outcomes["dead"], outcomes["expired"],
                          event_count("requeued"), outcomes["deleted"], outcomes["taken"]]
    assert event_count("taken") > outcomes["taken"]
    per_queue = {r.queue: r["sum(added)"] for r in minutes.groupBy("queue").sum("added").collect()}
    assert per_queue == {q: sum(1 for j in JOBS if j.queue == q) for q in QUEUES}
    keys = minutes.select("queue", "minute").distinct().count()
    assert keys == minutes.count() == len({(j.queue, t - t % (60 * S))
                                           for j in JOBS for t, _, _ in j.events})


def test_percentiles_of_the_jobs_finished_in_a_minute(spark, full):
    out, _ = full
    [row] = spark.read.parquet(str(out / "queue_minutes")).where(
        f"queue = 'reports' and minute = timestamp_micros({PERCENTILE_MINUTE})").collect()
    assert row.completed == 10 and row.added == 0 and row.leased == 0
    assert (row.wait_p50, row.wait_p95, row.wait_p99) == (5.0, 10.0, 10.0)
    assert (row.run_p50, row.run_p95, row.run_p99) == (35.0, 50.0, 50.0)


def test_times_of_a_job_requeued_by_ttr_then_completed(spark, full):
    out, _ = full
    job = next(j for j in JOBS if j.kind == "ttr_completed" and j.queue == "images")
    [row] = spark.read.parquet(str(out / "jobs")).where(f"id = '{job.id}'").collect()
    assert job.added == T0 + 3040 * S                   # 2024-02-29 23:50:40 UTC
    assert row.date == date(2024, 2, 29)
    assert (row.queue, row.protocol, row.shard, row.number) == ("images", "goqueue", job.shard,
                                                                 job.number)
    assert (row.outcome, row.attempts, row.leases, row.requeues) == ("completed", 2, 2, 1)
    assert (row.wait_seconds, row.run_seconds) == (2.0, 10.0)
    # Timestamps are instants; compare them in UTC whatever the machine's zone.
    times = spark.read.parquet(str(out / "jobs")).where(f"id = '{job.id}'").selectExpr(
        "unix_micros(added)", "unix_micros(first_leased)", "unix_micros(last_leased)",
        "unix_micros(finished)").first()
    a = job.added
    assert list(times) == [a, a + 2 * S, a + 35 * S, a + 45 * S]


def test_stuck_lists_stale_unfinished_jobs_by_their_state(spark, full):
    """Stuck: unfinished for longer than the threshold; leased when the last lease stands."""
    out, summary = full
    stuck = rows(spark, out / "stuck", "id")
    expected = sorted((j.id, "leased" if j.kind == "stale_leased" else "ready") for j in JOBS
                      if j.outcome == "unfinished" and j.added < END - STALE_AFTER * S)
    assert [(r["id"], r["state"]) for r in stuck] == expected
    assert summary.stuck == len(expected) == 9
    assert summary.stuck_states == {"ready": 8, "leased": 1}
    oldest = min(j.added for j in JOBS if j.outcome == "unfinished")
    assert max(r["age_seconds"] for r in stuck) == (END - oldest) / S


def test_failed_lists_the_jobs_that_ended_failed_and_none_is_stuck(spark, full):
    """Failed and dead jobs ended (the engine's state FAILED): listed in failed, not in stuck."""
    out, summary = full
    failed = rows(spark, out / "failed", "id")
    assert [(r["id"], r["outcome"]) for r in failed] == sorted(
        (j.id, j.outcome) for j in JOBS if j.outcome in ("failed", "dead"))
    assert summary.failed == len(failed) == 10
    assert not {r["id"] for r in failed} & {r["id"] for r in rows(spark, out / "stuck", "id")}


def test_rejected_and_partial_lines_are_counted_and_reported(full):
    out, summary = full
    assert summary.unknown_versions == {2: 2}
    assert summary.malformed == 1
    assert summary.partial_lines == 1
    text = summary.format()
    assert "rejected: 1 malformed line; 2 records of unknown version (v2: 2); 1 file ending in a " \
           "partial line" in text
    assert "unknown schema version 2" in (out / "report.html").read_text()


def test_report_is_one_self_contained_file(full):
    out, summary = full
    page = (out / "report.html").read_text()
    assert not re.search(r"https?:|//[a-z]|<link|<img|@import|src=|href=|url\(", page, re.I)
    assert len(re.findall(r"<script>", page)) == 1                        # the charts' own script
    charts = re.findall(r'<svg class="chart"', page)
    assert len(charts) == 6      # jobs, failures, wait times, run times, queues, queues over time
    assert len(re.findall(r'<script type="application/json" class="chart-data">', page)) == 6
    for queue in QUEUES:
        assert f'<span class="name" title="{queue}">{queue}</span></td>' in page
    assert f"Stuck jobs ({summary.stuck})" in page and f"Failed jobs ({summary.failed})" in page
    assert "worst queues: " in page and "How long this run took" in page


def test_incremental_runs_give_what_one_run_gives(spark, full, tmp_path):
    out_full, whole = full
    write_history(tmp_path, 1)
    out = tmp_path / "out"
    first = run([str(tmp_path / "history")], str(out), spark=spark, stale_after=STALE_AFTER)
    assert first.files_listed == first.new_files == sum(1 for f in FILES if f.cut)
    assert first.partial_lines == sum(1 for f in FILES if 0 < f.cut < len(f.data)) == SHARDS
    assert first.jobs < whole.jobs
    write_history(tmp_path, 2)
    second = run([str(tmp_path / "history")], str(out), spark=spark, stale_after=STALE_AFTER)
    assert second.grown_files == sum(1 for f in FILES if 0 < f.cut < len(f.data))
    assert second.new_files == sum(1 for f in FILES if not f.cut)
    assert second.bytes_read < sum(len(f.data) for f in FILES)
    assert second.records_read + first.records_read == whole.records
    generation = json.loads((out / "_checkpoint.json").read_text())["state"]
    third = run([str(tmp_path / "history")], str(out), spark=spark, stale_after=STALE_AFTER)
    assert (third.new_files, third.grown_files, third.records_read) == (0, 0, 0)
    assert json.loads((out / "_checkpoint.json").read_text())["state"] == generation
    assert os.listdir(out / "_state") == [generation]
    for summary in (second, third):
        assert (summary.queues, summary.records, summary.malformed, summary.unknown_versions,
                summary.partial_lines) == (whole.queues, whole.records, whole.malformed,
                                           whole.unknown_versions, whole.partial_lines)
    # The third run rebuilt the tables from the state the second left (same generation).
    for table, order in (("jobs", ("id",)), ("queue_minutes", ("queue", "minute")), ("stuck", ("id",)),
                         ("failed", ("id",))):
        assert rows(spark, out / table, *order) == rows(spark, out_full / table, *order), table


def test_empty_history_then_a_file_then_the_file_shrank(spark, tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    (history / "shard-0").mkdir(parents=True)
    empty = run([str(history)], str(out), spark=spark)
    assert (empty.jobs, empty.files_listed, empty.records, empty.first_event) == (0, 0, 0, None)
    assert spark.read.parquet(str(out / "queue_minutes")).count() == 0
    assert spark.read.parquet(str(out / "stuck")).count() == 0
    assert spark.read.parquet(str(out / "failed")).count() == 0
    assert "No events yet." in (out / "report.html").read_text()

    job = next(j for j in JOBS if j.kind == "completed")
    lines = [line(job, at, event, attempt) for at, event, attempt in job.events]
    path = history / "shard-0" / "history-1-000001.jsonl"
    path.write_text("".join(lines))
    one = run([str(history)], str(out), spark=spark)
    assert (one.new_files, one.jobs, one.outcomes["completed"], one.records) == (1, 1, 1, 3)

    path.write_text(lines[0])                     # rewritten shorter: not a history file's way
    with pytest.raises(HistoryError, match="shrank from .* to .* bytes.*--rebuild"):
        run([str(history)], str(out), spark=spark)
    rebuilt = run([str(history)], str(out), spark=spark, rebuild=True)
    assert (rebuilt.new_files, rebuilt.jobs, rebuilt.outcomes["unfinished"], rebuilt.records) == (
        1, 1, 1, 1)
    assert len(os.listdir(out / "_state")) == 1


def test_cli_continues_from_the_checkpoint_and_prints_the_summary(full, capsys):
    out, whole = full
    assert cli.main(["history", "--data-dir", str(out.parent), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"queueserver history: {len(JOBS)} jobs in {len(QUEUES)} queues" in printed
    assert f"read 0 of {len(FILES)} files (0 new, 0 grown), 0 bytes" in printed
    assert ", ".join(f"{o} {n}" for o, n in expected_outcomes().items()) in printed
    assert f"failed: {whole.failed} (6 failed by their worker, 4 dead: out of attempts) in {out}/failed" \
        in printed
    assert f"stuck: {whole.stuck} unfinished for more than 3600 s (8 ready, 1 leased) in {out}/stuck" \
        in printed
    assert "worst queues: images 35.3% failed/dead/expired" in printed
    assert re.search(r"took \d+\.\d s in Python, without Spark \([\d,]+ bytes of history", printed)


def test_cli_with_a_missing_input_is_one_line(spark, tmp_path, capsys):
    status = cli.main(["history", "--input", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("queueserver history: error: cannot read the input: ")
    assert "nothing" in err[-1]


def test_the_server_command_line_does_not_load_spark():
    code = ("import sys, queueserver.cli as c; "
            "a = c.build_parser().parse_args(['history', '--input', 'x', '--out', 'y']); "
            "assert a.stale_after == 3600 and 'pyspark' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
