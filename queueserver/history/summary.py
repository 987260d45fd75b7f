"""What a run found, per queue and in total: the value ``run`` returns and the console prints."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Dict, List, Optional, Tuple

from .frame import Frame, col, count, count_if, percentiles
from .timing import Timing
from .tables import FAILED, LEASED, PERCENTILES, READY, stale

OUTCOMES = ("completed", "failed", "dead", "expired", "deleted", "taken")
BAD = ("failed", "dead", "expired")

Quantiles = Tuple[Optional[float], ...]   # p50, p95, p99 in seconds


@dataclass(frozen=True)
class QueueStats:
    """One queue's jobs: outcomes (plus ``unfinished``), stuck ones by their state (ready or
    leased), wait and run percentiles."""
    queue: str
    jobs: int
    outcomes: Dict[str, int]
    stuck_states: Dict[str, int]
    wait: Quantiles
    run: Quantiles

    @property
    def stuck(self) -> int:
        """Unfinished for longer than the threshold."""
        return sum(self.stuck_states.values())

    @property
    def bad(self) -> int:
        return sum(self.outcomes[o] for o in BAD)

    @property
    def bad_share(self) -> float:
        """Failed, dead and expired jobs per finished job."""
        finished = self.jobs - self.outcomes["unfinished"]
        return self.bad / finished if finished else 0.0


def queue_stats(jobs: Frame, now: int, stale_after_us: int) -> List[QueueStats]:
    """Per queue, from the job view (:func:`.tables.job_view`)."""
    outcome, is_stale = col("outcome"), stale(now, stale_after_us)
    rows = (jobs.group_by("queue").agg(
        count().alias("jobs"),
        *[count_if(outcome == o).alias(o) for o in OUTCOMES],
        count_if(outcome.is_null()).alias("unfinished"),
        *[count_if(is_stale & (col("state") == s)).alias(f"stuck_{s}") for s in (READY, LEASED)],
        percentiles(col("wait_seconds"), PERCENTILES).alias("wait"),
        percentiles(col("run_seconds"), PERCENTILES).alias("run"))
        .order_by("queue").collect())
    return [QueueStats(r["queue"], r["jobs"], {o: r[o] for o in OUTCOMES + ("unfinished",)},
                       {s: r[f"stuck_{s}"] for s in (READY, LEASED)},
                       tuple(r["wait"] or (None,) * 3), tuple(r["run"] or (None,) * 3)) for r in rows]


@dataclass(frozen=True)
class Summary:
    """A run's result. Counts of records and rejected lines cover every run so far."""
    out: str
    queues: List[QueueStats]
    stale_after: float
    first_event: Optional[int]          # µs
    last_event: Optional[int]           # µs
    files_listed: int
    new_files: int
    grown_files: int
    bytes_read: int                     # this run
    records_read: int                   # this run
    records: int                        # accepted records, all runs
    malformed: int                      # all runs
    unknown_versions: Dict[int, int] = field(default_factory=dict)   # all runs
    partial_lines: int = 0              # files now ending in an incomplete line
    timing: Optional[Timing] = field(default=None, compare=False)   # how long the run took

    @property
    def jobs(self) -> int:
        return sum(q.jobs for q in self.queues)

    @property
    def outcomes(self) -> Dict[str, int]:
        """Jobs per outcome over all queues, ``unfinished`` included."""
        return {o: sum(q.outcomes[o] for q in self.queues) for o in OUTCOMES + ("unfinished",)}

    @property
    def stuck(self) -> int:
        """Rows of the ``stuck`` table: unfinished for longer than ``stale_after``."""
        return sum(q.stuck for q in self.queues)

    @property
    def stuck_states(self) -> Dict[str, int]:
        """Stuck jobs by the engine's name of their state: ready, leased."""
        return {s: sum(q.stuck_states[s] for q in self.queues) for s in (READY, LEASED)}

    @property
    def failed(self) -> int:
        """Rows of the ``failed`` table: jobs whose engine state became FAILED."""
        return sum(self.outcomes[o] for o in FAILED)

    @property
    def rejected(self) -> int:
        return self.malformed + sum(self.unknown_versions.values())

    def worst(self, n: int = 3) -> List[QueueStats]:
        """Queues with failures, expiries or stuck jobs, the worst share of bad outcomes first."""
        bad = [q for q in self.queues if q.bad or q.stuck]
        return sorted(bad, key=lambda q: (-q.bad_share, -q.stuck, -(q.wait[1] or 0.0), q.queue))[:n]

    def format(self) -> str:
        """The console summary: a few lines."""
        head = f"queueserver history: {_count(self.jobs, 'job')} in {_count(len(self.queues), 'queue')}"
        lines = [head + (f", {_utc(self.first_event)} to {_utc(self.last_event)} UTC"
                         if self.first_event is not None else "")]
        lines.append(f"  read {self.new_files + self.grown_files} of {self.files_listed} files "
                     f"({self.new_files} new, {self.grown_files} grown), {self.bytes_read:,} bytes, "
                     f"{self.records_read:,} records ({self.records:,} in all)")
        lines.append("  outcomes: " + ", ".join(f"{o} {n:,}" for o, n in self.outcomes.items()))
        lines.append(f"  failed: {self.failed:,} ({self.outcomes['failed']:,} failed by their worker, "
                     f"{self.outcomes['dead']:,} dead: out of attempts) in {self.out}/failed")
        states = self.stuck_states
        lines.append(f"  stuck: {self.stuck:,} unfinished for more than {self.stale_after:g} s "
                     f"({states[READY]:,} ready, {states[LEASED]:,} leased) in {self.out}/stuck")
        rejected = [_count(self.malformed, "malformed line")]
        if self.unknown_versions:
            rejected.append(_count(sum(self.unknown_versions.values()), "record")
                            + " of unknown version ("
                            + ", ".join(f"v{v}: {n:,}" for v, n in sorted(self.unknown_versions.items()))
                            + ")")
        if self.partial_lines:
            rejected.append(_count(self.partial_lines, "file") + " ending in a partial line "
                            "(left for the next run)")
        lines.append("  rejected: " + "; ".join(rejected))
        worst = self.worst()
        lines.append("  worst queues: " + ("; ".join(
            f"{q.queue} {q.bad_share:.1%} failed/dead/expired, {q.stuck} stuck, wait p95 "
            + (f"{q.wait[1]:.3g} s" if q.wait[1] is not None else "-") for q in worst) or "none"))
        lines.append(f"  report: {self.out}/report.html")
        if self.timing is not None and self.timing.ended is not None:
            lines.append(f"  {self.timing.format()}")
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _utc(us: Optional[int]) -> str:
    if us is None:
        return "-"
    return datetime.fromtimestamp(us / 1e6, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
