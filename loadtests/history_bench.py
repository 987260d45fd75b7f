"""``make bench-spark``: the throughput of ``queueserver history`` and of the DataFrame writer.

    python loadtests/history_bench.py [--events 10000000] [--rows 100000] [--quick]
                                      [--dir DIR] [--driver-memory 4g] [--json FILE]

1. Writes a synthetic job history of ``--events`` events (default 10 M) the
   way shards write it: JSON lines (schema version 1, the writer's exact
   layout), one directory per shard, rotated every 64 MiB, each shard's lines
   in time order. Jobs are spread over 64 queues (a few busy, many quiet)
   and 5 protocols, about 4 events each: most complete at once, some after
   a TTR requeue, a retry or a release; some fail, die, expire, are deleted,
   taken (queued and TaskFlux queues) or stay unfinished. Lines are built
   column-wise with pyarrow (no Python loop per line) and written as whole
   byte ranges.
2. ``run()`` over them on ``local[*]`` (one SparkSession for both runs, so
   the JVM start is not counted): a full run, then 10% more events appended
   the way the writer appends (the files being written grow, new files
   follow), and an incremental run. Both are timed; the events/s of each is
   the events it read over its wall time. The summaries are checked against
   what was generated (records, jobs, outcomes): a wrong count is a problem
   and the exit status is 1.
3. ``queueserver.spark.enqueue_dataframe``: ``--rows`` rows of 100 bytes into
   a real server (2 shards, workq only) started for it; once with new keys,
   once more with the same keys (every row a duplicate, as a re-run sees).
   A small write first starts Spark's Python workers, so neither measured
   write pays for that. It runs before the history runs, in the same
   session: a history run that kills the JVM cannot take its figures along.

A small table goes to stdout (``--json`` writes the figures too); Spark's
own log and the history's stage log go to stderr. The history directory is
removed at the end, the server is stopped, always. ``--quick``: 200,000
events and 10,000 rows, for the smoke test.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MASTER = "local[*]"
QUEUES = 64
PROTOCOLS = ("workq", "takeanumber", "goqueue", "queued", "taskflux")
TAKERS = ("queued", "taskflux")          # protocols whose clients take a job without an ack
SHARDS = 4
ROTATE_BYTES = 64 << 20                  # the shards' history writer rotates at 64 MiB
APPEND_SHARE = 0.10
T0 = 1_735_689_600_000_000               # 2025-01-01 00:00:00 UTC, µs
JOBS_PER_SECOND = 100                    # the history's pace: about 385 events a second
CHUNK = 1_000_000                        # lines built at a time
TTR_S, TTL_S = 30, 120
QUICK_EVENTS, QUICK_ROWS = 200_000, 10_000
PAYLOAD_BYTES = 100
SPARK_OOM_EXIT = 52                      # org.apache.spark.util.SparkExitCode.OOM
JVM_EXIT_WAIT = 10.0                     # after a failed run: how long the JVM may take to exit

# A job's life: (event, × its wait, × its run time, + seconds, attempt after it, a client's doing).
# Timer events (a TTR requeue, a TTL expiry, the last requeue that kills a job) have no client.
Step = Tuple[str, float, float, float, int, bool]
KINDS: List[Tuple[str, float, List[Step]]] = [
    ("completed", 0.45, [("added", 0, 0, 0, 0, True), ("leased", 1, 0, 0, 1, True),
                         ("completed", 1, 1, 0, 1, True)]),
    ("requeued, completed", 0.20, [("added", 0, 0, 0, 0, True), ("leased", 1, 0, 0, 1, True),
                                   ("requeued", 1, 0, TTR_S, 1, False),
                                   ("leased", 2, 0, TTR_S, 2, True),
                                   ("completed", 2, 1, TTR_S, 2, True)]),
    ("retried, completed", 0.15, [("added", 0, 0, 0, 0, True), ("leased", 1, 0, 0, 1, True),
                                  ("retried", 1, 1, 0, 1, True), ("leased", 2, 1, 0, 2, True),
                                  ("completed", 2, 2, 0, 2, True)]),
    ("released, completed", 0.07, [("added", 0, 0, 0, 0, True), ("leased", 1, 0, 0, 1, True),
                                   ("released", 1, 0.5, 0, 1, False),
                                   ("leased", 2, 0.5, 0, 2, True),
                                   ("completed", 2, 1.5, 0, 2, True)]),
    ("failed", 0.04, [("added", 0, 0, 0, 0, True), ("leased", 1, 0, 0, 1, True),
                      ("failed", 1, 1, 0, 1, True)]),
    ("dead", 0.03, [("added", 0, 0, 0, 0, True), ("leased", 1, 0, 0, 1, True),
                    ("requeued", 1, 0, TTR_S, 1, False), ("leased", 2, 0, TTR_S, 2, True),
                    ("dead", 2, 0, 2 * TTR_S, 2, False)]),
    ("expired", 0.03, [("added", 0, 0, 0, 0, True), ("expired", 0, 0, TTL_S, 0, False)]),
    ("deleted", 0.01, [("added", 0, 0, 0, 0, True), ("deleted", 0, 1, 0, 0, True)]),
    ("taken", 0.01, [("added", 0, 0, 0, 0, True), ("taken", 1, 0, 0, 0, True)]),
    ("unfinished", 0.01, [("added", 0, 0, 0, 0, True), ("leased", 1, 0, 0, 1, True)]),
]
EVENTS = ("added", "leased", "requeued", "released", "returned", "retried",
          "completed", "failed", "dead", "expired", "deleted", "taken")
FINAL = ("completed", "failed", "dead", "expired", "deleted", "taken")
OUTCOMES = FINAL + ("unfinished",)

log = logging.getLogger("history_bench")


# --------------------------------------------------------------------------- the history
@dataclass
class History:
    """What was generated: the counts a correct analysis must find."""
    root: Path                       # holds history/ (read) and pending/ (appended later)
    events: int                      # in the first batch
    appended: int
    jobs_first: int                  # jobs with an event in the first batch
    jobs: int
    outcomes: Dict[str, int]         # of all jobs, once everything is appended
    bytes_first: int = 0
    bytes_appended: int = 0
    files_first: int = 0
    files: int = 0
    seconds: float = 0.0

    def history(self) -> Path:
        return self.root / "history"


class Scripts:
    """KINDS as lookup tables indexed by [kind, step]."""

    def __init__(self) -> None:
        steps = max(len(script) for _, _, script in KINDS)
        shape = (len(KINDS), steps)
        self.weights = np.array([w for _, w, _ in KINDS]) / sum(w for _, w, _ in KINDS)
        self.length = np.array([len(script) for _, _, script in KINDS])
        self.event = np.zeros(shape, np.int8)
        self.coef = np.zeros(shape + (3,))
        self.attempt = np.zeros(shape, np.int64)
        self.client = np.zeros(shape, bool)
        for k, (_, _, script) in enumerate(KINDS):
            for i, (event, wait, run, const, attempt, client) in enumerate(script):
                self.event[k, i] = EVENTS.index(event)
                self.coef[k, i] = (wait, run, const)
                self.attempt[k, i] = attempt
                self.client[k, i] = client
        self.mean = float(self.weights @ self.length)


def _strings(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def _json_strings(names) -> pa.Array:
    return pa.array([json.dumps(n) for n in names])


def generate(root: Path, events: int, seed: int = 1) -> History:
    """``events`` events plus 10% more to append, written under ``root``: the first batch in
    ``history/shard-N/`` (what a run finds first), the rest in ``pending/shard-N/`` under the
    name of the file each part is appended to (see :func:`append`)."""
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    scripts = Scripts()
    appended = int(events * APPEND_SHARE)
    total = events + appended

    # Jobs: kind, queue (a few busy queues, many quiet ones), times.
    n_jobs = int(total / scripts.mean * 1.05) + 16
    popularity = 1.0 / np.arange(1, QUEUES + 1) ** 1.1
    queue = rng.choice(QUEUES, size=n_jobs, p=popularity / popularity.sum())
    protocol = queue % len(PROTOCOLS)
    kind = rng.choice(len(KINDS), size=n_jobs, p=scripts.weights)
    takes = np.isin(protocol, [PROTOCOLS.index(p) for p in TAKERS])
    kind[(kind == [k for k, (name, _, _) in enumerate(KINDS) if name == "taken"][0]) & ~takes] = 0
    ends = np.cumsum(scripts.length[kind])
    n_jobs = int(np.searchsorted(ends, total)) + 1          # the last one may lose its tail
    queue, protocol, kind = queue[:n_jobs], protocol[:n_jobs], kind[:n_jobs]
    ends = ends[:n_jobs]
    starts = ends - scripts.length[kind]
    step_us = 1_000_000 // JOBS_PER_SECOND
    added = T0 + np.arange(n_jobs, dtype=np.int64) * step_us + rng.integers(0, step_us, n_jobs)
    wait = rng.exponential(2e6, n_jobs).astype(np.int64) + 1_000
    run = rng.exponential(5e6, n_jobs).astype(np.int64) + 1_000

    # Events: job, step, time; in time order (the order shards write them in).
    job = np.repeat(np.arange(n_jobs), scripts.length[kind])[:total]
    step = np.arange(total) - starts[job]
    k = kind[job]
    coef = scripts.coef[k, step]
    at = (added[job] + (coef[:, 0] * wait[job]).astype(np.int64)
          + (coef[:, 1] * run[job]).astype(np.int64) + (coef[:, 2] * 1e6).astype(np.int64))
    del coef
    order = np.argsort(at, kind="stable")
    later = np.empty(total, bool)
    later[order] = np.arange(total) >= events             # appended after the first run

    # What a correct analysis finds: each job ends as its last event says.
    last_event = scripts.event[kind, np.minimum(scripts.length[kind], total - starts) - 1]
    final = np.array([EVENTS[e] if EVENTS[e] in FINAL else "unfinished" for e in range(len(EVENTS))])
    names, counts = np.unique(final[last_event], return_counts=True)
    outcomes = {o: 0 for o in OUTCOMES} | dict(zip(names.tolist(), counts.tolist()))
    first = np.zeros(n_jobs, bool)
    first[job[order[:events]]] = True
    history = History(root, events, appended, int(first.sum()), n_jobs, outcomes)

    # Constant pieces of the lines, looked up per row.
    queue_json = _json_strings(f"q{q:02d}-{PROTOCOLS[q % len(PROTOCOLS)]}" for q in range(QUEUES))
    protocol_json = pa.array(_json_strings(PROTOCOLS).to_pylist() + ["null"])
    event_names = pa.array(EVENTS)
    outcome_json = pa.array([json.dumps(e) if e in FINAL else "null" for e in EVENTS])
    null = len(PROTOCOLS)

    shard_of = job % SHARDS
    for shard in range(SHARDS):
        mine = order[shard_of[order] == shard]              # this shard's events, in time order
        written, names_by_file = 0, {}
        for lo in range(0, len(mine), CHUNK):
            idx = mine[lo:lo + CHUNK]
            j, kk, s = job[idx], k[idx], step[idx]
            ev, client = scripts.event[kk, s], scripts.client[kk, s]
            number = _strings(j + 1)
            lines = pc.binary_join_element_wise(
                '{"v":1,"time":', _strings(at[idx]), f',"shard":{shard},"event":"',
                event_names.take(ev), '","protocol":',
                protocol_json.take(np.where(client, protocol[j], null)), ',"queue":',
                queue_json.take(queue[j]), ',"id":"00000000-0000-4000-8000-',
                pc.utf8_lpad(number, 12, "0"), '","number":', number, ',"attempt":',
                _strings(scripts.attempt[kk, s]), ',"priority":', _strings(j % 3), ',"size":',
                _strings(100 + j % 900), ',"outcome":', outcome_json.take(ev), ',"conn":',
                pc.if_else(pa.array(client), pc.binary_join_element_wise(
                    '"0-', _strings(j % 509), '"', ""), "null"),
                "}\n", "")
            offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset:lines.offset + len(lines) + 1]
            data = memoryview(lines.buffers()[2])
            file_no = (written + offsets[:-1].astype(np.int64)) // ROTATE_BYTES
            part = file_no * 2 + later[idx]                  # runs of one file and one batch
            cuts = np.concatenate(([0], np.flatnonzero(np.diff(part)) + 1, [len(idx)]))
            for a, b in zip(cuts[:-1], cuts[1:]):
                n = int(file_no[a])
                if n not in names_by_file:
                    names_by_file[n] = f"history-{int(at[idx[a]])}-{n + 1:06d}.jsonl"
                batch = "pending" if later[idx[a]] else "history"
                directory = root / batch / f"shard-{shard}"
                directory.mkdir(parents=True, exist_ok=True)
                with open(directory / names_by_file[n], "ab") as out:
                    out.write(data[offsets[a]:offsets[b]])
                size = int(offsets[b] - offsets[a])
                if later[idx[a]]:
                    history.bytes_appended += size
                else:
                    history.bytes_first += size
            written += int(offsets[-1] - offsets[0])
        history.files += len(names_by_file)
    history.files_first = sum(1 for _ in history.history().glob("shard-*/*.jsonl"))
    history.seconds = time.monotonic() - started
    return history


def append(history: History) -> None:
    """The second batch, appended as the shards' writer would: to the files being written, then
    in new files."""
    for part in sorted((history.root / "pending").glob("shard-*/*.jsonl")):
        target = history.history() / part.parent.name / part.name
        with open(part, "rb") as src, open(target, "ab") as out:
            shutil.copyfileobj(src, out, 16 << 20)
        part.unlink()


# --------------------------------------------------------------------------- the runs
class StageLog(logging.Handler):
    """Collects the history's "<stage>: done in N s" lines of one run."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.stages: List[Tuple[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if ": done in " in message:
            what, seconds = message.rsplit(": done in ", 1)
            words = what.split(" ")
            label = words[1] if words[0] == "writing" and len(words) > 1 else words[0]
            self.stages.append((label, float(seconds.split()[0])))


@dataclass
class Timed:
    what: str
    events: int
    bytes: int
    seconds: float
    stages: List[Tuple[str, float]] = field(default_factory=list)
    failed: bool = False

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def timed_run(spark, history: History, out: Path, what: str, expect_records: int,
              expect_jobs: int, expect_outcomes: Optional[Dict[str, int]],
              problems: List[str]) -> Timed:
    """One ``run()``, timed and checked; a run that raises is a problem (its row says failed)."""
    from queueserver.history.app import run
    stages = StageLog()
    logging.getLogger("queueserver.history").addHandler(stages)
    started = time.monotonic()
    try:
        summary = run([str(history.history())], str(out), spark=spark)
    except Exception as err:             # noqa: BLE001 - reported, and the exit status is 1
        seconds = time.monotonic() - started
        log.exception("%s run failed after %.1f s", what, seconds)
        problems.append(f"{what} run failed after {seconds:.1f} s: {_error(err)}")
        return Timed(what, 0, 0, seconds, stages.stages, failed=True)
    finally:
        logging.getLogger("queueserver.history").removeHandler(stages)
    seconds = time.monotonic() - started
    log.info("%s run: %.1f s\n%s", what, seconds, summary.format())
    found = {"records (all runs)": (summary.records, expect_records),
             "jobs": (summary.jobs, expect_jobs),
             "rejected lines": (summary.rejected, 0), "partial lines": (summary.partial_lines, 0)}
    if expect_outcomes is not None:
        found["outcomes"] = (summary.outcomes, expect_outcomes)
    for name, (got, want) in found.items():
        if got != want:
            problems.append(f"{what} run: {name} {got}, expected {want}")
    return Timed(what, summary.records_read, summary.bytes_read, seconds, stages.stages)


def _error(err: BaseException) -> str:
    """The first line of an error, or how the Spark JVM ended when it is gone."""
    from pyspark import SparkContext
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is not None:
        try:                             # a JVM whose task hit OutOfMemoryError is exiting
            proc.wait(JVM_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            pass
    if proc is not None and proc.poll() is not None:
        return (f"the Spark JVM exited with status {proc.returncode}"
                + (" (Spark's exit status for java.lang.OutOfMemoryError)"
                   if proc.returncode == SPARK_OOM_EXIT else "") + "; its log is above")
    chain, seen = [], err               # the error and those it was raised while handling
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for e in chain:
        try:
            text = str(e)
        except Exception:                # noqa: BLE001 - py4j's str() asks the JVM
            continue
        oom = [line.strip() for line in text.splitlines() if "OutOfMemoryError" in line]
        if oom:
            return f"{type(e).__name__}: ... {oom[0][:300]}"
    lines = [line.strip() for line in str(chain[-1]).splitlines() if line.strip()]
    return f"{type(chain[-1]).__name__}: {(lines or ['(no message)'])[0][:300]}"


def spark_session(driver_memory: str):
    """One local[*] session for the bench (Spark's Python workers use this interpreter)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(MASTER).appName("queueserver history bench")
             .config("spark.driver.memory", driver_memory)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


# --------------------------------------------------------------------------- the writer
@dataclass
class Written:
    what: str
    rows: int
    added: int
    duplicates: int
    seconds: float                   # wall time of enqueue_dataframe
    writer_rows_per_second: float    # the writer's own figure (its start to its commit)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def bench_writer(spark, rows: int, problems: List[str]) -> List[Written]:
    from pyspark.sql import functions as F
    from queueserver.testing.serverprocess import ServerProcess
    from queueserver.spark import enqueue_dataframe

    def frame(n: int):
        return spark.range(n).select(
            "id", F.concat(F.lit("p" * (PAYLOAD_BYTES - 12)),
                           F.lpad(F.col("id").cast("string"), 12, "0")).alias("payload"))

    results = []
    with ServerProcess(shards=2, protocols=["workq"]) as server:
        port = server.port("workq")
        enqueue_dataframe(frame(1000), port=port, queue="warm-up", key_column="id",
                          namespace=str(uuid.uuid4()))      # starts the Python workers
        queue, namespace = f"bench-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
        for what, want_added in (("new rows", rows), ("the same rows again", 0)):
            started = time.monotonic()
            totals = enqueue_dataframe(frame(rows), port=port, queue=queue, key_column="id",
                                       namespace=namespace)
            seconds = time.monotonic() - started
            written = Written(what, totals["rows"], totals["added"], totals["duplicates"], seconds,
                              totals["rows_per_second"])
            if (written.rows, written.added, written.duplicates) != (rows, want_added,
                                                                     rows - want_added):
                problems.append(f"writer, {what}: {totals}, expected {rows} rows, "
                                f"{want_added} added")
            results.append(written)
    return results


# --------------------------------------------------------------------------- the report
def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return ""


def machine() -> str:
    def java() -> str:
        try:
            out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
            return out.stderr.splitlines()[0].split('"')[1]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "?"

    import pyspark
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores, {memory:.1f} GiB, load {load}; Python "
            f"{platform.python_version()}, PySpark {pyspark.__version__}, Java {java()}")


def render(opts: argparse.Namespace, history: History, runs: List[Timed],
           writes: List[Written], problems: List[str], started_machine: str) -> str:
    lines = [f"queueserver history bench: {history.events:,} events + {history.appended:,} "
             f"appended, {history.jobs:,} jobs in {QUEUES} queues, {len(PROTOCOLS)} protocols, "
             f"{SHARDS} shards",
             f"command: {' '.join([os.path.basename(sys.argv[0])] + sys.argv[1:])}",
             f"machine: {started_machine}",
             f"spark: {MASTER}, driver memory {opts.driver_memory}, one session for both runs",
             f"generated: {history.events + history.appended:,} events, "
             f"{_size(history.bytes_first + history.bytes_appended)} in {history.files} files "
             f"({history.files_first} before the append) in {history.seconds:.1f} s "
             f"({(history.events + history.appended) / history.seconds:,.0f} events/s written)",
             "",
             f"{'history run':<26} {'events read':>12} {'bytes read':>12} {'seconds':>9} "
             f"{'events/s':>10} {'MB/s':>7}"]
    for r in runs:
        if r.failed:
            lines.append(f"{r.what:<26} {'failed':>12} {'-':>12} {r.seconds:>9.1f} {'-':>10} {'-':>7}")
        else:
            lines.append(f"{r.what:<26} {r.events:>12,} {_size(r.bytes):>12} {r.seconds:>9.1f} "
                         f"{r.events_per_second:>10,.0f} {r.bytes / r.seconds / 1e6:>7.1f}")
    for r in runs:
        lines.append(f"  {r.what} stages: " + ", ".join(f"{what} {s:.1f} s" for what, s in r.stages))
    if writes:
        lines += ["", f"{'DataFrame writer':<26} {'rows':>12} {'added':>12} {'seconds':>9} "
                      f"{'rows/s':>10} {'writer rows/s':>14}"]
        for w in writes:
            lines.append(f"{w.what:<26} {w.rows:>12,} {w.added:>12,} {w.seconds:>9.2f} "
                         f"{w.rows_per_second:>10,.0f} {w.writer_rows_per_second:>14,.0f}")
        lines.append(f"  {PAYLOAD_BYTES}-byte payloads, 2 shards, workq; rows/s: wall time of "
                     "enqueue_dataframe; writer rows/s: its own figure (its start to its commit)")
    lines += ["", f"machine at the end: load {' '.join(f'{x:.1f}' for x in os.getloadavg())}"]
    if problems:
        lines += ["", "problems:"] + [f"  {p}" for p in problems]
    return "\n".join(lines)


def to_json(history: History, runs: List[Timed], writes: List[Written],
            problems: List[str]) -> Dict[str, Any]:
    return {"events": history.events, "appended": history.appended, "jobs": history.jobs,
            "generate_seconds": history.seconds,
            "runs": [{"what": r.what, "failed": r.failed, "events": r.events, "bytes": r.bytes, "seconds": r.seconds,
                      "events_per_second": r.events_per_second, "stages": r.stages} for r in runs],
            "writes": [{"what": w.what, "rows": w.rows, "added": w.added,
                        "duplicates": w.duplicates, "seconds": w.seconds,
                        "rows_per_second": w.rows_per_second,
                        "writer_rows_per_second": w.writer_rows_per_second} for w in writes],
            "problems": problems}


# --------------------------------------------------------------------------- main
def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=None,
                   help="events in the first batch (default 10,000,000; 10%% more are appended)")
    p.add_argument("--rows", type=int, default=None,
                   help="rows the DataFrame writer enqueues (default 100,000)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_EVENTS:,} events and {QUICK_ROWS:,} rows")
    p.add_argument("--dir", default=None, help="where the temporary history goes (default: $TMPDIR)")
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
    p.add_argument("--no-writer", action="store_true", help="skip the DataFrame writer")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON too")
    opts = p.parse_args(argv)
    if opts.events is None:
        opts.events = QUICK_EVENTS if opts.quick else 10_000_000
    if opts.rows is None:
        opts.rows = QUICK_ROWS if opts.quick else 100_000
    if opts.events < 10 or opts.rows < 1:
        p.error("--events must be 10 or more and --rows 1 or more")
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name in ("history_bench", "queueserver"):
        logging.getLogger(name).setLevel(logging.INFO)
    started_machine = machine()
    problems: List[str] = []
    runs: List[Timed] = []
    writes: List[Written] = []
    root = Path(tempfile.mkdtemp(prefix="qs-history-bench-", dir=opts.dir))
    spark = None
    try:
        log.info("writing %d + %d events under %s", opts.events, int(opts.events * APPEND_SHARE),
                 root)
        history = generate(root, opts.events)
        log.info("written in %.1f s: %d files, %d bytes", history.seconds, history.files_first,
                 history.bytes_first)
        spark = spark_session(opts.driver_memory)
        if not opts.no_writer:           # first: a history run that kills the JVM cannot stop it
            writes = bench_writer(spark, opts.rows, problems)
        out = root / "out"
        runs.append(timed_run(spark, history, out, "full", history.events, history.jobs_first,
                              None, problems))
        if not runs[-1].failed:
            append(history)
            runs.append(timed_run(spark, history, out, "incremental (+10%)",
                                  history.events + history.appended, history.jobs,
                                  history.outcomes, problems))
        for r, want in zip(runs, (history.events, history.appended)):
            if not r.failed and r.events != want:
                problems.append(f"{r.what} run read {r.events:,} events, expected {want:,}")
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception:            # noqa: BLE001 - a JVM that died cannot be stopped
                log.warning("the SparkSession did not stop cleanly", exc_info=True)
        shutil.rmtree(root, ignore_errors=True)
    text = render(opts, history, runs, writes, problems, started_machine)
    print(text, flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(to_json(history, runs, writes, problems), f, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
