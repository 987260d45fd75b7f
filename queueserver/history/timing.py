"""Where a history run's time goes: each stage timed, logged, and kept for the summary and the report.

A run on Spark pays for the JVM and the SparkSession before any work
(``starting Spark``) and for stopping them after; on a small history that
is most of the run. The breakdown says so in figures: the log has a line
per stage, the console summary a line of start / work / stop, and the
report a table of every stage.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

log = logging.getLogger("queueserver.history")

SPARK_START = "starting Spark"
SPARK_STOP = "stopping Spark"


@dataclass
class Timing:
    """The stages of one run, in order, each with its seconds; ``engine`` is ``spark`` or
    ``python``, ``reason`` why that one was used."""
    engine: str = "spark"
    reason: str = ""
    stages: List[Tuple[str, float]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ended: Optional[float] = None

    @contextmanager
    def stage(self, what: str) -> Iterator[None]:
        """Log a stage's start and how long it took, and keep the figure."""
        log.info("%s ...", what)
        began = time.monotonic()
        yield
        took = time.monotonic() - began
        self.stages.append((what, took))
        log.info("%s: done in %.1f s", what, took)

    def finish(self) -> None:
        self.ended = time.monotonic()
        log.info("%s", self.format())

    @property
    def total(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    def seconds(self, what: str) -> float:
        return sum(took for name, took in self.stages if name == what)

    @property
    def work(self) -> float:
        """Everything but starting and stopping Spark."""
        return self.total - self.seconds(SPARK_START) - self.seconds(SPARK_STOP)

    def format(self) -> str:
        """One line: the total, and on Spark how much of it was Spark's start and stop."""
        if self.engine == "spark":
            return (f"took {self.total:.1f} s on Spark: {SPARK_START} {self.seconds(SPARK_START):.1f} s, "
                    f"work {self.work:.1f} s, {SPARK_STOP} {self.seconds(SPARK_STOP):.1f} s"
                    + (f" ({self.reason})" if self.reason else ""))
        return f"took {self.total:.1f} s in Python, without Spark ({self.reason})"

    def breakdown(self) -> List[Tuple[str, float]]:
        """Every stage so far, and what the stages do not account for (``other``: the driver's
        own code between them)."""
        accounted = sum(took for _, took in self.stages)
        return self.stages + [("other", max(0.0, self.total - accounted))]
