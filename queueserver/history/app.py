"""The history application: history files in; tables, report and checkpoint out.

``queueserver history ...`` and ``spark-submit queueserver/history/app.py
...`` both end in :func:`run_from_args`; tests and other code call
:func:`run`. One run:

1. picks its engine (:func:`choose_engine`): Spark, or, for a small history
   on local disk, plain Python in this process (:mod:`.python_engine`),
   which spares Spark's start-up and gives the same tables;
2. lists the input files and compares them with the checkpoint
   (:mod:`.checkpoint`): new files are read whole, grown ones from where
   the last run stopped;
3. merges the new events into the per-job and per-minute state of earlier
   runs and writes it as a new state generation (:mod:`.state`);
4. rebuilds ``jobs/``, ``queue_minutes/``, ``stuck/`` and ``failed/`` from
   that state (:mod:`.tables`), computes the summary (:mod:`.summary`) and
   writes ``report.html`` (:mod:`.report`);
5. replaces the checkpoint, which makes the new generation current, and
   removes the others.

Every stage is timed (:mod:`.timing`): the log has a line each, the summary
the start / work / stop split, the report the whole breakdown.
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
import os
import uuid
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any, List, Optional, Protocol, Sequence, Tuple

from queueserver.history import checkpoint as ckpt
from queueserver.history import pysource, report, state, tables
from queueserver.history.columns import Schema
from queueserver.history.errors import HistoryError
from queueserver.history.frame import Frame, col, max_, min_
from queueserver.history.localstorage import LocalStorage
from queueserver.history.options import DEFAULT_STALE_AFTER, ENGINES, add_arguments, input_paths
from queueserver.history.python_engine import PythonEngine
from queueserver.history.summary import Summary, queue_stats
from queueserver.history.tally import Tally
from queueserver.history.timing import SPARK_START, SPARK_STOP, Timing

log = logging.getLogger("queueserver.history")
PROG = "queueserver history"


class Store(Protocol):
    """The small files beside the output: :class:`.storage.Storage` (Hadoop's file systems)
    or :class:`.localstorage.LocalStorage`."""
    root: str

    def path(self, name: str) -> str: ...

    def is_file(self, name: str) -> bool: ...

    def read_text(self, name: str) -> Optional[str]: ...

    def write_text(self, name: str, text: str) -> None: ...

    def delete(self, name: str) -> None: ...

    def list_dir(self, name: str) -> List[str]: ...


class Batch(Protocol):
    def events(self) -> Frame: ...

    def tally(self) -> Tally: ...

    def release(self) -> None: ...


class Engine(Protocol):
    """What a run asks of an engine: :class:`.spark_engine.SparkEngine` or
    :class:`.python_engine.PythonEngine`."""
    name: str

    @property
    def storage(self) -> Store: ...

    def list_files(self, inputs: Sequence[str]) -> List[ckpt.Listed]: ...

    def read(self, plan: ckpt.Plan) -> Batch: ...

    def read_table(self, path: str, schema: Schema) -> Frame: ...

    def write(self, frame: Frame, path: str, schema: Schema, partition_by: Sequence[str] = (),
              sort_by: Sequence[str] = (), one_file: bool = False) -> None: ...

    def keep(self, frame: Frame) -> Frame: ...

    def release(self, frame: Frame) -> None: ...
STATE = "_state"
MIB = 1 << 20
#: ``--engine auto`` computes a history of at most this many bytes (read so far and new) in Python.
PYTHON_MAX_BYTES = 64 * MIB


def run(inputs: Sequence[str], out: str, spark: Optional[Any] = None,
        stale_after: float = DEFAULT_STALE_AFTER, rebuild: bool = False,
        master: Optional[str] = None, progress: bool = False, engine: str = "auto") -> Summary:
    """Read what is new in ``inputs``, update the state and rewrite every output under ``out``.

    With ``spark`` (a SparkSession), Spark computes it there. Without, ``engine`` decides
    (``auto``: see :func:`choose_engine`); Spark then uses the active session, or starts one
    (``master``, default local[*]) and stops it at the end. ``rebuild`` forgets the
    checkpoint and reads everything again. Raises :class:`HistoryError` for bad input or a
    checkpoint that does not fit."""
    if stale_after < 0:
        raise HistoryError(f"--stale-after must be 0 or more seconds, not {stale_after:g}")
    if engine not in ENGINES:
        raise HistoryError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    inputs, out = list(inputs), out.rstrip("/") or "/"
    timing = Timing()
    if spark is not None:
        timing.engine, timing.reason = "spark", "the caller's SparkSession"
    else:
        timing.engine, timing.reason = choose_engine(engine, inputs, out, master, rebuild)
        if timing.engine == "spark":
            from queueserver.history.session import check_java
            check_java()
    log.info("engine: %s (%s)", timing.engine, timing.reason)
    if timing.engine == "python":
        summary = _run(PythonEngine(out), inputs, out, stale_after, rebuild, timing)
    else:
        from queueserver.history.session import spark_session
        from queueserver.history.spark_engine import SparkEngine
        if spark is not None:
            summary = _run(SparkEngine(spark, out), inputs, out, stale_after, rebuild, timing)
        else:
            with ExitStack() as stack:
                with timing.stage(SPARK_START):
                    session = stack.enter_context(spark_session(master, progress))
                try:
                    summary = _run(SparkEngine(session, out), inputs, out, stale_after, rebuild, timing)
                finally:
                    with timing.stage(SPARK_STOP):
                        stack.close()
    timing.finish()
    return summary


def choose_engine(engine: str, inputs: Sequence[str], out: str, master: Optional[str],
                  rebuild: bool) -> Tuple[str, str]:
    """``(engine, why)``. ``auto`` takes Python for a history on local disk of at most
    :data:`PYTHON_MAX_BYTES` (what the checkpoint has read plus what is new), written to a
    local ``--out``, when no ``--master`` was given and spark-submit did not start this;
    anything else goes to Spark."""
    local = [pysource.local_path(path) for path in [*inputs, out]]
    if engine == "spark":
        return "spark", "--engine spark"
    if engine == "python":
        if None in local:
            raise HistoryError("--engine python reads and writes local paths only; "
                               "use --engine spark for hdfs://, s3a:// and the like")
        return "python", "--engine python"
    if master is not None:
        return "spark", f"--master {master}"
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return "spark", "run by spark-submit"
    if None in local:
        return "spark", "a path only Spark reads"
    if any("{" in path for path in inputs):
        return "spark", "a {...} glob, which only Spark expands"
    size = history_bytes(inputs, out, rebuild)
    limit = f"{PYTHON_MAX_BYTES // MIB} MiB"
    if size <= PYTHON_MAX_BYTES:
        return "python", f"{size:,} bytes of history, at most {limit}"
    return "spark", f"{size:,} bytes of history, over {limit}"


def history_bytes(inputs: Sequence[str], out: str, rebuild: bool) -> int:
    """The bytes of history a run would hold: those its checkpoint read, and the new ones."""
    listed = pysource.list_files(inputs)
    previous = ckpt.Checkpoint()
    if not rebuild:
        try:
            text = LocalStorage(str(pysource.local_path(out))).read_text(ckpt.NAME)
            if text is not None:
                previous = ckpt.Checkpoint.from_json(text, out)
        except (OSError, HistoryError):
            pass    # the engine that runs says what is wrong with it
    try:
        plan = ckpt.plan(previous, listed)
    except HistoryError:
        plan = ckpt.plan(ckpt.Checkpoint(), listed)
    sizes = {item.path: item.size for item in listed}
    return (sum(mark.consumed for mark in previous.files.values())
            + sum(sizes[path] - plan.grown.get(path, 0) for path in plan.paths))


def _run(engine: Engine, inputs: List[str], out: str, stale_after: float, rebuild: bool,
         timing: Timing) -> Summary:
    storage = engine.storage
    if storage.is_file(""):
        raise HistoryError(f"--out {out} is a file, not a directory")
    previous = ckpt.Checkpoint() if rebuild else _checkpoint(storage)
    with timing.stage(f"listing {', '.join(inputs)}"):
        listed = engine.list_files(inputs)
    plan = ckpt.plan(previous, listed)
    log.info("%d files: %d new, %d grown, %d already read", len(listed), len(plan.new),
             len(plan.grown), len(listed) - len(plan.paths))

    tally, generation = Tally(), previous.state
    if plan.paths or generation is None:
        generation = _new_generation()
        batch = None
        try:
            with timing.stage(f"reading {len(plan.paths)} files"):
                batch = engine.read(plan)
                tally = batch.tally()
            log.info("%d records, %d bytes; rejected: %d malformed, %d of unknown versions %s",
                     tally.records, tally.bytes_read, tally.malformed,
                     sum(tally.versions.values()), sorted(tally.versions) or "")
            with timing.stage(f"merging into state {generation}"):
                _write_state(engine, previous.state, generation, batch.events())
        finally:
            if batch is not None:
                batch.release()

    current = ckpt.Checkpoint(
        state=generation, files={**previous.files, **tally.marks},
        records=previous.records + tally.records, malformed=previous.malformed + tally.malformed,
        versions={v: previous.versions.get(v, 0) + tally.versions.get(v, 0)
                  for v in set(previous.versions) | set(tally.versions)})
    summary = _write_outputs(engine, out, current, listed, plan, tally, stale_after, timing)
    storage.write_text(ckpt.NAME, current.to_json())
    for name in storage.list_dir(STATE):
        if name != generation:
            storage.delete(f"{STATE}/{name}")
    return summary


def _checkpoint(storage: Store) -> ckpt.Checkpoint:
    """The checkpoint of the runs so far (an empty one before the first)."""
    where = storage.path(ckpt.NAME)
    try:
        text = storage.read_text(ckpt.NAME)
    except OSError as err:
        raise ckpt.unusable(where, err) from None
    return ckpt.Checkpoint() if text is None else ckpt.Checkpoint.from_json(text, where)


def _new_generation() -> str:
    return f"gen-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def _state_path(engine: Engine, generation: str, part: str) -> str:
    return str(engine.storage.path(f"{STATE}/{generation}/{part}"))


def _read_jobs(engine: Engine, generation: str) -> Frame:
    jobs = engine.read_table(_state_path(engine, generation, "jobs"), state.JOB_STATE)
    return state.upgraded_jobs(jobs)


def _write_state(engine: Engine, old: Optional[str], new: str, events: Frame) -> None:
    """The earlier generation (if any) merged with the new events, written as generation ``new``."""
    for part, rows, merge, schema in (("jobs", state.job_rows, state.merge_jobs, state.JOB_STATE),
                                      ("minutes", state.minute_rows, state.merge_minutes,
                                       state.MINUTE_STATE)):
        earlier = None
        if old is not None:
            earlier = (_read_jobs(engine, old) if part == "jobs" else
                       engine.read_table(_state_path(engine, old, part), schema)).conform(schema)
        merged = state.merged(rows(events).conform(schema), earlier, merge)
        engine.write(merged, _state_path(engine, new, part), schema)


def _write_outputs(engine: Engine, out: str, current: ckpt.Checkpoint, listed: List[ckpt.Listed], plan: ckpt.Plan,
                   tally: Tally, stale_after: float, timing: Timing) -> Summary:
    assert current.state is not None
    storage = engine.storage
    jobs = engine.keep(tables.job_view(_read_jobs(engine, current.state)))
    minutes = tables.minute_view(
        engine.read_table(_state_path(engine, current.state, "minutes"), state.MINUTE_STATE), jobs)
    try:
        with timing.stage(f"loading state {current.state}"):
            [bounds] = jobs.group_by().agg(min_(col("first_seen")).alias("first"),
                                           max_(col("last_seen")).alias("last")).collect()
            first, last = bounds["first"], bounds["last"]
        now, stale_us = (last or 0), round(stale_after * 1e6)
        stuck, failed = tables.stuck_view(jobs, now, stale_us), tables.failed_view(jobs)
        with timing.stage("writing jobs"):
            engine.write(tables.jobs_table(jobs), storage.path("jobs"), tables.JOBS_TABLE,
                         partition_by=("date", "queue"), sort_by=("added", "id"))
        with timing.stage("writing queue_minutes"):
            engine.write(tables.queue_minutes_table(minutes, jobs), storage.path("queue_minutes"),
                         tables.QUEUE_MINUTES_TABLE, sort_by=("queue", "minute"), one_file=True)
        with timing.stage("writing stuck"):
            engine.write(tables.stuck_table(stuck), storage.path("stuck"), tables.STUCK_TABLE,
                         sort_by=("queue", "added", "id"), one_file=True)
        with timing.stage("writing failed"):
            engine.write(tables.failed_table(failed), storage.path("failed"), tables.FAILED_TABLE,
                         sort_by=("queue", "added", "id"), one_file=True)
        with timing.stage("summing up"):
            summary = Summary(
                out=out, queues=queue_stats(jobs, now, stale_us), stale_after=stale_after,
                first_event=first, last_event=last, files_listed=len(listed),
                new_files=len(plan.new), grown_files=len(plan.grown), bytes_read=tally.bytes_read,
                records_read=tally.records, records=current.records, malformed=current.malformed,
                unknown_versions=dict(current.versions), partial_lines=current.partial_lines,
                timing=timing)
        with timing.stage("writing report.html"):
            page = report.render(summary, jobs, minutes, stuck, failed, datetime.now(timezone.utc),
                                 timing)
            storage.write_text("report.html", page)
    finally:
        engine.release(jobs)
    return summary


def run_from_args(args: argparse.Namespace, prog: str = PROG) -> int:
    """The command: run, print the summary; a :class:`HistoryError` is one line on stderr, status 2."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s history %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        summary = run(input_paths(args), args.out, stale_after=args.stale_after,
                      rebuild=args.rebuild, master=args.master, progress=args.spark_progress,
                      engine=args.engine)
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
