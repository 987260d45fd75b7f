"""Per-job and per-minute partial state: what the events read so far add up to.

Every event becomes one *state row* of the same shape as a job's state, and
state rows are combined only with associative, commutative aggregates
(min, max, sum, and min of a struct for "the first"). So the state of all
events equals the state of yesterday's events merged with today's, in any
order and any split: an incremental run gives what one run over everything
gives. Times stay integer microseconds here; tables turn them into
timestamps.
"""
from __future__ import annotations

from typing import Callable, Optional

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .schema import ADDED, EVENTS, FINAL, LEASED, RELEASED, REQUEUED, RETRIED, RETURNED

MINUTE_US = 60_000_000
COUNTED = (LEASED, RETURNED, REQUEUED, RELEASED, RETRIED)
TAKEN = "taken"
#: Final events that no later event undoes (a take may be given back: ``returned``).
ENDS = tuple(event for event in FINAL if event != TAKEN)


def _at(event: str) -> Column:
    """The event's time when it is ``event``, else null."""
    return F.when(F.col("event") == event, F.col("time"))


def job_rows(events: DataFrame) -> DataFrame:
    """One state row per event (the record schema's columns in)."""
    return events.select(
        "id",
        # Where the job's attributes come from: its "added" event, else its earliest one.
        F.struct(F.when(F.col("event") == ADDED, 0).otherwise(1).alias("rank"), "time", "queue",
                 "protocol", "shard", "number", "priority", "size").alias("origin"),
        _at(ADDED).alias("added"),
        F.col("time").alias("first_seen"), F.col("time").alias("last_seen"),
        _at(LEASED).alias("first_leased"), _at(LEASED).alias("last_leased"),
        _at(RETURNED).alias("last_returned"),
        F.when(F.col("event").isin(*ENDS), F.struct(
            "time", F.coalesce("outcome", "event").alias("outcome"))).alias("first_end"),
        _at(TAKEN).alias("last_taken"),
        F.col("attempt").alias("attempts"),
        *[F.when(F.col("event") == e, 1).otherwise(0).cast("long").alias(e) for e in COUNTED])


def merge_jobs(rows: DataFrame) -> DataFrame:
    """State rows (of events, of earlier state, or both) combined per job."""
    return rows.groupBy("id").agg(
        F.min("origin").alias("origin"), F.min("added").alias("added"),
        F.min("first_seen").alias("first_seen"), F.max("last_seen").alias("last_seen"),
        F.min("first_leased").alias("first_leased"), F.max("last_leased").alias("last_leased"),
        F.max("last_returned").alias("last_returned"),
        F.min("first_end").alias("first_end"),   # a job ends once: later "ends" are drops
        F.max("last_taken").alias("last_taken"),   # a "returned" after it undoes it
        F.max("attempts").alias("attempts"),
        *[F.sum(e).alias(e) for e in COUNTED])


def minute_rows(events: DataFrame) -> DataFrame:
    """Events counted per queue, minute (µs, UTC) and event."""
    minute = (F.col("time") - F.pmod("time", F.lit(MINUTE_US))).alias("minute")
    return (events.groupBy("queue", minute).pivot("event", list(EVENTS)).count()
            .na.fill(0, list(EVENTS)))


def merge_minutes(rows: DataFrame) -> DataFrame:
    """Minute counts combined per queue and minute."""
    return rows.groupBy("queue", "minute").agg(*[F.sum(e).alias(e) for e in EVENTS])


def merged(new: DataFrame, old: Optional[DataFrame],
           merge: Callable[[DataFrame], DataFrame]) -> DataFrame:
    """``merge`` over the new rows and the earlier state, when there is one."""
    return merge(new if old is None else new.unionByName(old))
