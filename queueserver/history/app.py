"""The history application: history files in; tables, report and checkpoint out.

``queueserver history ...`` and ``spark-submit queueserver/history/app.py
...`` both end in :func:`run_from_args`; tests and other code call
:func:`run`. One run:

1. lists the input files and compares them with the checkpoint
   (:mod:`.checkpoint`): new files are read whole, grown ones from where
   the last run stopped (:mod:`.source`);
2. merges the new events into the per-job and per-minute state of earlier
   runs and writes it as a new state generation (:mod:`.state`);
3. rebuilds ``jobs/``, ``queue_minutes/`` and ``stuck/`` from that state
   (:mod:`.tables`), computes the summary (:mod:`.summary`) and writes
   ``report.html`` (:mod:`.report`);
4. replaces the checkpoint, which makes the new generation current, and
   removes the others.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file (spark-submit queueserver/history/app.py): import the package from the
    # tree this file is in, and not this directory's modules as top-level ones.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import logging
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator, List, Optional, Sequence

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from queueserver.history import checkpoint as ckpt
from queueserver.history import report, source, state, tables
from queueserver.history.errors import HistoryError
from queueserver.history.options import DEFAULT_STALE_AFTER, add_arguments, input_paths
from queueserver.history.session import spark_session
from queueserver.history.storage import Storage
from queueserver.history.summary import Summary, queue_stats

log = logging.getLogger("queueserver.history")
PROG = "queueserver history"
STATE = "_state"


@contextmanager
def stage(what: str) -> Iterator[None]:
    """Log a stage's start and how long it took: the progress of a long run."""
    log.info("%s ...", what)
    started = time.monotonic()
    yield
    log.info("%s: done in %.1f s", what, time.monotonic() - started)


def run(inputs: Sequence[str], out: str, spark: Optional[SparkSession] = None,
        stale_after: float = DEFAULT_STALE_AFTER, rebuild: bool = False,
        master: Optional[str] = None, progress: bool = False) -> Summary:
    """Read what is new in ``inputs``, update the state and rewrite every output under ``out``.

    Without ``spark``, the active session is used, or one is started
    (``master``, default local[*]) and stopped at the end. ``rebuild``
    forgets the checkpoint and reads everything again. Raises
    :class:`HistoryError` for bad input or a checkpoint that does not fit."""
    if stale_after < 0:
        raise HistoryError(f"--stale-after must be 0 or more seconds, not {stale_after:g}")
    if spark is None:
        with spark_session(master, progress) as session:
            return _run(session, list(inputs), out.rstrip("/") or "/", stale_after, rebuild)
    return _run(spark, list(inputs), out.rstrip("/") or "/", stale_after, rebuild)


def _run(spark: SparkSession, inputs: List[str], out: str, stale_after: float,
         rebuild: bool) -> Summary:
    storage = Storage(spark, out)
    if storage.is_file(""):
        raise HistoryError(f"--out {out} is a file, not a directory")
    previous = ckpt.Checkpoint() if rebuild else _checkpoint(storage)
    with stage(f"listing {', '.join(inputs)}"):
        listed = source.list_files(spark, inputs)
    plan = ckpt.plan(previous, listed)
    log.info("%d files: %d new, %d grown, %d already read", len(listed), len(plan.new),
             len(plan.grown), len(listed) - len(plan.paths))

    tally, generation = source.Tally(), previous.state
    if plan.paths or generation is None:
        generation = _new_generation()
        batch = None
        try:
            with stage(f"reading {len(plan.paths)} files"):
                batch = source.read(spark, plan)
                tally = batch.tally()
            log.info("%d records, %d bytes; rejected: %d malformed, %d of unknown versions %s",
                     tally.records, tally.bytes_read, tally.malformed,
                     sum(tally.versions.values()), sorted(tally.versions) or "")
            with stage(f"merging into state {generation}"):
                _write_state(spark, storage, previous.state, generation, batch.events())
        finally:
            if batch is not None:
                batch.release()

    current = ckpt.Checkpoint(
        state=generation, files={**previous.files, **tally.marks},
        records=previous.records + tally.records, malformed=previous.malformed + tally.malformed,
        versions={v: previous.versions.get(v, 0) + tally.versions.get(v, 0)
                  for v in set(previous.versions) | set(tally.versions)})
    summary = _write_outputs(spark, storage, current, listed, plan, tally, stale_after)
    storage.write_text(ckpt.NAME, current.to_json())
    for name in storage.list_dir(STATE):
        if name != generation:
            storage.delete(f"{STATE}/{name}")
    return summary


def _checkpoint(storage: Storage) -> ckpt.Checkpoint:
    """The checkpoint of the runs so far (an empty one before the first)."""
    where = storage.path(ckpt.NAME)
    try:
        text = storage.read_text(ckpt.NAME)
    except OSError as err:
        raise ckpt.unusable(where, err) from None
    return ckpt.Checkpoint() if text is None else ckpt.Checkpoint.from_json(text, where)


def _new_generation() -> str:
    return f"gen-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def _read_state(spark: SparkSession, storage: Storage, generation: str, part: str) -> DataFrame:
    path = storage.path(f"{STATE}/{generation}/{part}")
    try:
        return spark.read.parquet(path)
    except AnalysisException:
        raise HistoryError(f"the state {path} named by the checkpoint is missing; "
                           "run again with --rebuild to read every file anew") from None


def _write_state(spark: SparkSession, storage: Storage, old: Optional[str], new: str,
                 events: DataFrame) -> None:
    """The earlier generation (if any) merged with the new events, written as generation ``new``."""
    for part, rows, merge in (("jobs", state.job_rows, state.merge_jobs),
                              ("minutes", state.minute_rows, state.merge_minutes)):
        earlier = None if old is None else _read_state(spark, storage, old, part)
        merged = state.merged(rows(events), earlier, merge)
        merged.write.mode("overwrite").parquet(storage.path(f"{STATE}/{new}/{part}"))


def _write(frame: DataFrame, path: str, *partitions: str) -> None:
    writer = frame.write.mode("overwrite").option("partitionOverwriteMode", "static")
    if partitions:
        writer = writer.partitionBy(*partitions)
    writer.parquet(path)


def _write_outputs(spark: SparkSession, storage: Storage, current: ckpt.Checkpoint,
                   listed: List[ckpt.Listed], plan: ckpt.Plan, tally: source.Tally,
                   stale_after: float) -> Summary:
    assert current.state is not None
    jobs = tables.job_view(_read_state(spark, storage, current.state, "jobs"))
    jobs = jobs.persist(StorageLevel.MEMORY_AND_DISK)
    minutes = tables.minute_view(_read_state(spark, storage, current.state, "minutes"), jobs)
    try:
        with stage(f"loading state {current.state}"):
            bounds = jobs.agg(F.min("first_seen"), F.max("last_seen")).first()
            assert bounds is not None   # an aggregate without groups is one row (nulls if no jobs)
            first, last = bounds
        now, stale_us = (last or 0), round(stale_after * 1e6)
        stuck = tables.stuck_view(jobs, now, stale_us)
        with stage("writing jobs"):
            table = tables.jobs_table(jobs)
            _write(table.repartition("date", "queue").sortWithinPartitions("added", "id"),
                   storage.path("jobs"), "date", "queue")
        with stage("writing queue_minutes"):
            _write(tables.queue_minutes_table(minutes, jobs).repartition(1)
                   .sortWithinPartitions("queue", "minute"), storage.path("queue_minutes"))
        with stage("writing stuck"):
            _write(tables.stuck_table(stuck).repartition(1)
                   .sortWithinPartitions("reason", "queue", "added", "id"), storage.path("stuck"))
        with stage("summing up"):
            summary = Summary(
                out=storage.root, queues=queue_stats(jobs, now, stale_us), stale_after=stale_after,
                first_event=first, last_event=last, files_listed=len(listed),
                new_files=len(plan.new), grown_files=len(plan.grown), bytes_read=tally.bytes_read,
                records_read=tally.records, records=current.records, malformed=current.malformed,
                unknown_versions=dict(current.versions), partial_lines=current.partial_lines)
        with stage("writing report.html"):
            page = report.render(summary, jobs, minutes, stuck, datetime.now(timezone.utc))
            storage.write_text("report.html", page)
    finally:
        jobs.unpersist()
    return summary


def run_from_args(args: argparse.Namespace, prog: str = PROG) -> int:
    """The command: run, print the summary; a :class:`HistoryError` is one line on stderr, status 2."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s history %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        summary = run(input_paths(args), args.out, stale_after=args.stale_after,
                      rebuild=args.rebuild, master=args.master, progress=args.spark_progress)
    except HistoryError as err:
        print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
        return 2
    print(summary.format(), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Turn the shards' job history into Parquet tables and an HTML report.")
    add_arguments(parser)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """``spark-submit queueserver/history/app.py --input ... --out ...``."""
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
