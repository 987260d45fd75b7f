"""Per-job and per-minute partial state: what the events read so far add up to.

Every event becomes one *state row* of the same shape as a job's state, and
state rows are combined only with associative, commutative aggregates
(min, max, sum, and min of a struct for "the first"). So the state of all
events equals the state of yesterday's events merged with today's, in any
order and any split: an incremental run gives what one run over everything
gives. Times stay integer microseconds here; tables turn them into
timestamps. Written once against :mod:`.frame`, for both engines.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from .columns import Schema
from .frame import (Expr, Frame, NamedAgg, coalesce, col, count_if, floor_to, lit, max_, min_, struct, sum_,
                    when)
from .schema import ADDED, EVENTS, FINAL, LEASED, RELEASED, REQUEUED, RETRIED, RETURNED

MINUTE_US = 60_000_000
COUNTED = (LEASED, RETURNED, REQUEUED, RELEASED, RETRIED)
#: Events after which a job is back in line (or stays there): a lease before them is over.
BACK = (REQUEUED, RELEASED, RETURNED, RETRIED)
TAKEN = "taken"
#: Final events that no later event undoes (a take may be given back: ``returned``).
ENDS = tuple(event for event in FINAL if event != TAKEN)

ORIGIN: Schema = [("rank", "int"), ("time", "long"), ("queue", "string"), ("protocol", "string"),
                  ("shard", "long"), ("number", "long"), ("priority", "long"), ("size", "long")]
#: The per-job state, as ``_state/<generation>/jobs`` holds it.
JOB_STATE: Schema = [
    ("id", "string"), ("origin", ORIGIN), ("added", "long"), ("first_seen", "long"),
    ("last_seen", "long"), ("first_leased", "long"), ("last_leased", "long"),
    ("last_returned", "long"), ("last_back", "long"),
    ("first_end", [("time", "long"), ("outcome", "string")]), ("last_taken", "long"),
    ("attempts", "long"), *[(e, "long") for e in COUNTED]]
#: The per-minute state, as ``_state/<generation>/minutes`` holds it.
MINUTE_STATE: Schema = [("queue", "string"), ("minute", "long"), *[(e, "long") for e in EVENTS]]


def _at(*events: str) -> Expr:
    """The event's time when it is one of ``events``, else null."""
    return when(col("event").isin(*events), col("time"))


def job_rows(events: Frame) -> Frame:
    """One state row per event (the record schema's columns in)."""
    event = col("event")
    return events.select(
        "id",
        # Where the job's attributes come from: its "added" event, else its earliest one.
        struct(when(event == ADDED, 0).otherwise(1).alias("rank"), col("time").alias("time"),
               *[col(name).alias(name) for name, _ in ORIGIN[2:]]).alias("origin"),
        _at(ADDED).alias("added"),
        col("time").alias("first_seen"), col("time").alias("last_seen"),
        _at(LEASED).alias("first_leased"), _at(LEASED).alias("last_leased"),
        _at(RETURNED).alias("last_returned"), _at(*BACK).alias("last_back"),
        when(event.isin(*ENDS), struct(
            col("time").alias("time"),
            coalesce(col("outcome"), event).alias("outcome")))
        .alias("first_end"),
        _at(TAKEN).alias("last_taken"),
        col("attempt").alias("attempts"),
        *[when(event == e, lit(1)).otherwise(lit(0)).alias(e) for e in COUNTED])


def _job_merge() -> List[NamedAgg]:
    return [min_(col("origin")).alias("origin"), min_(col("added")).alias("added"),
            min_(col("first_seen")).alias("first_seen"), max_(col("last_seen")).alias("last_seen"),
            min_(col("first_leased")).alias("first_leased"),
            max_(col("last_leased")).alias("last_leased"),
            max_(col("last_returned")).alias("last_returned"),
            max_(col("last_back")).alias("last_back"),
            min_(col("first_end")).alias("first_end"),   # a job ends once: later "ends" are drops
            max_(col("last_taken")).alias("last_taken"),  # a "returned" after it undoes it
            max_(col("attempts")).alias("attempts"),
            *[sum_(col(e)).alias(e) for e in COUNTED]]


def merge_jobs(rows: Frame) -> Frame:
    """State rows (of events, of earlier state, or both) combined per job."""
    return rows.group_by("id").agg(*_job_merge())


def minute_rows(events: Frame) -> Frame:
    """Events counted per queue, minute (µs, UTC) and event."""
    return (events.group_by("queue", floor_to(col("time"), MINUTE_US).alias("minute"))
            .agg(*[count_if(col("event") == e).alias(e) for e in EVENTS]))


def merge_minutes(rows: Frame) -> Frame:
    """Minute counts combined per queue and minute."""
    return rows.group_by("queue", "minute").agg(*[sum_(col(e)).alias(e) for e in EVENTS])


def merged(new: Frame, old: Optional[Frame], merge: Callable[[Frame], Frame]) -> Frame:
    """``merge`` over the new rows and the earlier state, when there is one."""
    return merge(new if old is None else new.union(old))


def upgraded_jobs(state: Frame) -> Frame:
    """A job state of an earlier version with this version's columns: ``last_back`` (which
    came later) is taken to be the last ``returned``, the one such event that state kept."""
    if "last_back" in state.columns:
        return state
    return state.with_column("last_back", col("last_returned")).conform(JOB_STATE)
