"""The output tables, derived from the merged state: ``jobs``, ``queue_minutes``, ``stuck`` and ``failed``.

They are rebuilt from the state on every run (the state is what is kept
incrementally), so they always describe every event read so far. Written
once against :mod:`.frame`, for both engines; each table's column types
are its ``*_TABLE`` schema.

Jobs are named as the engine names them (``queueserver/engine/``): a job
that ended FAILED (``failed`` by its worker, or ``dead``: out of attempts)
is a failed job, listed in ``failed``; a *stuck* job is one that has not
finished and has waited longer than the threshold, READY (in line, or
scheduled: the history does not carry a job's schedule) or LEASED (its
last lease not given back), listed in ``stuck`` with that state.
"""
from __future__ import annotations

from .columns import Schema
from .frame import Expr, Frame, coalesce, col, count_if, day_of, floor_to, lit, percentiles, when
from .schema import EVENTS, FINAL
from .state import MINUTE_US, TAKEN

DAY_US = 86_400_000_000
PERCENTILES = (0.5, 0.95, 0.99)
#: Outcomes of a job whose engine state became FAILED.
FAILED = ("failed", "dead")
#: The engine's names of an unfinished job's state, as the ``stuck`` table writes them.
READY, LEASED = "ready", "leased"
TIMES = ("added", "first_leased", "last_leased", "finished")

JOBS_TABLE: Schema = [
    ("id", "string"), ("queue", "string"), ("protocol", "string"), ("shard", "int"), ("number", "long"),
    ("priority", "long"), ("size", "long"), *[(t, "timestamp") for t in TIMES], ("outcome", "string"),
    ("attempts", "int"), ("leases", "long"), ("returns", "long"), ("requeues", "long"),
    ("releases", "long"), ("retries", "long"), ("wait_seconds", "double"), ("run_seconds", "double"),
    ("date", "date")]
QUEUE_MINUTES_TABLE: Schema = [
    ("queue", "string"), ("minute", "timestamp"),
    *[(e, "long") for e in ("added", "leased", "completed", "failed", "expired", "requeued", "deleted",
                            "taken")],
    *[(f"{kind}_p{round(p * 100)}", "double") for kind in ("wait", "run") for p in PERCENTILES]]
STUCK_TABLE: Schema = [
    ("state", "string"), ("id", "string"), ("queue", "string"), ("protocol", "string"), ("shard", "int"),
    ("number", "long"), ("added", "timestamp"), ("first_leased", "timestamp"),
    ("last_leased", "timestamp"), ("attempts", "int"), ("leases", "long"), ("requeues", "long"),
    ("releases", "long"), ("retries", "long"), ("age_seconds", "double")]
FAILED_TABLE: Schema = [
    ("outcome", "string"), ("id", "string"), ("queue", "string"), ("protocol", "string"),
    ("shard", "int"), ("number", "long"), *[(t, "timestamp") for t in TIMES], ("attempts", "int"),
    ("leases", "long"), ("requeues", "long"), ("retries", "long"), ("wait_seconds", "double"),
    ("run_seconds", "double")]


def _seconds(later: str, earlier: str) -> Expr:
    return (col(later) - col(earlier)) / lit(1e6)


def job_view(state: Frame) -> Frame:
    """One row per job with the derived values, times still in µs.

    A job's outcome is its first final event: a finished job that the shard
    kept (for its result) and dropped later has not ended twice (shards
    before this one wrote that drop as a second final event). A take is the
    exception: one that never reached its client is given back
    (``returned``) and the job goes on, so a take ends the job only when no
    ``returned`` follows the last one. An unfinished job is LEASED when its
    last lease came after the last event that puts a job back in line."""
    end, taken, returned = col("first_end"), col("last_taken"), col("last_returned")
    take_stands = taken.is_not_null() & (returned.is_null() | (taken > returned))
    finished = coalesce(end.field("time"), when(take_stands, taken))
    outcome = when(end.is_not_null(), end.field("outcome")).when(take_stands, lit(TAKEN))
    leased, back = col("last_leased"), col("last_back")
    holds = leased.is_not_null() & (back.is_null() | (leased > back))
    return (state.select(
        "id", col("origin").field("queue").alias("queue"),
        col("origin").field("protocol").alias("protocol"),
        col("origin").field("shard").to_int().alias("shard"),
        *[col("origin").field(name).alias(name) for name in ("number", "priority", "size")],
        "added", "first_seen", "last_seen", "first_leased", "last_leased",
        finished.alias("finished"), outcome.alias("outcome"),
        when(outcome.is_null(), when(holds, lit(LEASED)).otherwise(lit(READY))).alias("state"),
        col("attempts").to_int().alias("attempts"),
        col("leased").alias("leases"), col("returned").alias("returns"),
        col("requeued").alias("requeues"), col("released").alias("releases"),
        col("retried").alias("retries"))
        .with_column("wait_seconds", _seconds("first_leased", "added"))
        .with_column("run_seconds", _seconds("finished", "last_leased")))


def jobs_table(jobs: Frame) -> Frame:
    """The ``jobs`` table; ``date`` is the UTC day of ``added``."""
    return jobs.select(*[name for name, _ in JOBS_TABLE[:-1]], day_of(col("added"), DAY_US).alias("date"))


def _finished_minute() -> Expr:
    return floor_to(col("finished"), MINUTE_US)


def minute_view(minutes: Frame, jobs: Frame) -> Frame:
    """The minute state with the final events counted as outcomes: each job
    once, by its outcome, in the minute it finished (a drop that older shards
    wrote as a second final event, or a take given back, is no outcome).
    ``jobs`` is the job view."""
    outcomes = (jobs.where(col("finished").is_not_null())
                .group_by("queue", _finished_minute().alias("minute"))
                .agg(*[count_if(col("outcome") == o).alias(o) for o in FINAL]))
    return minutes.drop(*FINAL).join(outcomes, ["queue", "minute"], "outer").fill_zero(list(EVENTS))


def queue_minutes_table(minutes: Frame, jobs: Frame) -> Frame:
    """Per queue and UTC minute: events counted (``minutes`` is the
    :func:`minute_view`), and wait/run percentiles of the jobs finished then."""
    times = (jobs.where(col("finished").is_not_null())
             .group_by("queue", _finished_minute().alias("minute"))
             .agg(percentiles(col("wait_seconds"), PERCENTILES).alias("wait"),
                  percentiles(col("run_seconds"), PERCENTILES).alias("run")))
    quantiles = [col(kind).item(i).alias(f"{kind}_p{round(p * 100)}")
                 for kind in ("wait", "run") for i, p in enumerate(PERCENTILES)]
    return (minutes.join(times, ["queue", "minute"], "left")
            .select("queue", "minute", "added", "leased", "completed",
                    (col("failed") + col("dead")).alias("failed"), "expired", "requeued", "deleted",
                    "taken", *quantiles))


def stale(now: int, stale_after_us: int) -> Expr:
    """Unfinished and added (or, with no "added" seen, first seen) before ``now - stale_after``."""
    since = coalesce(col("added"), col("first_seen"))
    return col("outcome").is_null() & (since < lit(now - stale_after_us))


def stuck_view(jobs: Frame, now: int, stale_after_us: int) -> Frame:
    """Stuck jobs: unfinished for longer than the threshold, with ``age_seconds`` (since
    added, at the newest event); times in µs."""
    age = (lit(now) - coalesce(col("added"), col("first_seen"))) / lit(1e6)
    return jobs.where(stale(now, stale_after_us)).with_column("age_seconds", age)


def failed_view(jobs: Frame) -> Frame:
    """Jobs whose engine state became FAILED: ``failed`` or ``dead``."""
    return jobs.where(col("outcome").isin(*FAILED))


def stuck_table(stuck: Frame) -> Frame:
    """The ``stuck`` table, from :func:`stuck_view`."""
    return stuck.select(*[name for name, _ in STUCK_TABLE])


def failed_table(failed: Frame) -> Frame:
    """The ``failed`` table, from :func:`failed_view`."""
    return failed.select(*[name for name, _ in FAILED_TABLE])
