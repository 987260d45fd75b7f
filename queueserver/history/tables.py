"""The output tables, derived from the merged state: ``jobs``, ``queue_minutes`` and ``stuck``.

They are rebuilt from the state on every run (the state is what is kept
incrementally), so they always describe every event read so far.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .schema import EVENTS, FINAL
from .state import MINUTE_US, TAKEN

DAY_US = 86_400_000_000
PERCENTILES = (0.5, 0.95, 0.99)
FAILED = ("failed", "dead")


def _seconds(later: str, earlier: str) -> Column:
    return (F.col(later) - F.col(earlier)) / F.lit(1e6)


def job_view(state: DataFrame) -> DataFrame:
    """One row per job with the derived values, times still in µs.

    A job's outcome is its first final event: a finished job that the shard
    kept (for its result) and dropped later has not ended twice (shards
    before this one wrote that drop as a second final event). A take is the
    exception: one that never reached its client is given back
    (``returned``) and the job goes on, so a take ends the job only when no
    ``returned`` follows the last one."""
    end, taken, returned = F.col("first_end"), F.col("last_taken"), F.col("last_returned")
    take_stands = taken.isNotNull() & (returned.isNull() | (taken > returned))
    finished = F.coalesce(end.getField("time"), F.when(take_stands, taken))
    outcome = F.when(end.isNotNull(), end.getField("outcome")).when(take_stands, F.lit(TAKEN))
    return (state.select(
        "id", "origin.queue", "origin.protocol", F.col("origin.shard").cast("int").alias("shard"),
        "origin.number", "origin.priority", "origin.size",
        "added", "first_seen", "last_seen", "first_leased", "last_leased",
        finished.alias("finished"), outcome.alias("outcome"),
        F.col("attempts").cast("int").alias("attempts"),
        F.col("leased").alias("leases"), F.col("returned").alias("returns"),
        F.col("requeued").alias("requeues"), F.col("released").alias("releases"),
        F.col("retried").alias("retries"))
        .withColumn("wait_seconds", _seconds("first_leased", "added"))
        .withColumn("run_seconds", _seconds("finished", "last_leased")))


def _timestamp(name: str) -> Column:
    return F.timestamp_micros(name).alias(name)


def jobs_table(jobs: DataFrame) -> DataFrame:
    """The ``jobs`` table; ``date`` is the UTC day of ``added`` (computed without the session's zone)."""
    return jobs.select(
        "id", "queue", "protocol", "shard", "number", "priority", "size",
        *[_timestamp(c) for c in ("added", "first_leased", "last_leased", "finished")],
        "outcome", "attempts", "leases", "returns", "requeues", "releases", "retries",
        "wait_seconds", "run_seconds",
        F.date_from_unix_date(F.expr(f"cast(added div {DAY_US} as int)")).alias("date"))


def _minute(name: str) -> Column:
    return F.col(name) - F.pmod(name, F.lit(MINUTE_US))


def minute_view(minutes: DataFrame, jobs: DataFrame) -> DataFrame:
    """The minute state with the final events counted as outcomes: each job
    once, by its outcome, in the minute it finished (a drop that older shards
    wrote as a second final event, or a take given back, is no outcome).
    ``jobs`` is the job view."""
    outcomes = (jobs.where(F.col("finished").isNotNull())
                .groupBy("queue", _minute("finished").alias("minute"))
                .agg(*[F.count_if(F.col("outcome") == o).alias(o) for o in FINAL]))
    return (minutes.drop(*FINAL).join(outcomes, ["queue", "minute"], "outer")
            .na.fill(0, list(EVENTS)))


def queue_minutes_table(minutes: DataFrame, jobs: DataFrame) -> DataFrame:
    """Per queue and UTC minute: events counted (``minutes`` is the
    :func:`minute_view`), and wait/run percentiles of the jobs finished then."""
    times = (jobs.where(F.col("finished").isNotNull())
             .groupBy("queue", _minute("finished").alias("minute"))
             .agg(F.percentile_approx("wait_seconds", list(PERCENTILES)).alias("wait"),
                  F.percentile_approx("run_seconds", list(PERCENTILES)).alias("run")))
    quantiles = [F.col(kind).getItem(i).alias(f"{kind}_p{round(p * 100)}")
                 for kind in ("wait", "run") for i, p in enumerate(PERCENTILES)]
    return (minutes.join(times, ["queue", "minute"], "left")
            .select("queue", _timestamp("minute"), "added", "leased", "completed",
                    (F.col("failed") + F.col("dead")).alias("failed"), "expired", "requeued",
                    "deleted", "taken", *quantiles))


def stale(now: int, stale_after_us: int) -> Column:
    """Unfinished and added (or, with no "added" seen, first seen) before ``now - stale_after``."""
    since = F.coalesce("added", "first_seen")
    return F.col("outcome").isNull() & (since < F.lit(now - stale_after_us))


def stuck_view(jobs: DataFrame, now: int, stale_after_us: int) -> DataFrame:
    """Jobs that failed, died, or have waited unfinished for longer than the threshold,
    with ``reason`` and ``age_seconds`` (since added, at the newest event); times in µs."""
    reason = (F.when(F.col("outcome").isin(*FAILED), F.col("outcome"))
              .when(stale(now, stale_after_us), F.lit("unfinished")))
    age = (F.lit(now) - F.coalesce("added", "first_seen")) / F.lit(1e6)
    return (jobs.withColumn("reason", reason).where(F.col("reason").isNotNull())
            .withColumn("age_seconds", age))


def stuck_table(stuck: DataFrame) -> DataFrame:
    """The ``stuck`` table, from :func:`stuck_view`."""
    return stuck.select("reason", "id", "queue", "protocol", "shard", "number",
                        *[_timestamp(c) for c in ("added", "first_leased", "last_leased", "finished")],
                        "attempts", "leases", "requeues", "retries", "age_seconds")
