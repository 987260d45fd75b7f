"""Where a process's memory goes, for a soak: what grows, and where it was allocated.

A leak shows as RSS growing for hours; RSS does not say what grows. With
``QS_MEMWATCH=DIR`` in its environment, each router and shard traces its
allocations (:mod:`tracemalloc`, which slows it: a diagnostic, never for
production) and, every ``QS_MEMWATCH_SECONDS`` (default 60), writes
``DIR/<name>-<pid>.txt``: the allocation sites whose live bytes grew most
since its first snapshot, one line each with their three innermost frames.
Run plain Python (``QS_PURE_PYTHON=1``) to see inside the hot path: compiled
code allocates in frames tracemalloc cannot see. ``loadtests/soak.py
--memwatch DIR`` sets both.
"""
from __future__ import annotations

import os
import time
import tracemalloc
from typing import Optional

import gevent

TOP = 40        # sites written per report
FRAMES = 3      # frames kept per allocation


def start(name: str) -> None:
    """Trace and report in the background if ``QS_MEMWATCH`` names a directory."""
    folder = os.environ.get("QS_MEMWATCH")
    if not folder:
        return
    every = float(os.environ.get("QS_MEMWATCH_SECONDS", "60"))
    tracemalloc.start(FRAMES)
    path = os.path.join(folder, f"{name}-{os.getpid()}.txt")
    gevent.spawn(_report_every, path, every)


def _report_every(path: str, every: float) -> None:
    first: Optional[tracemalloc.Snapshot] = None
    started = time.monotonic()
    while True:
        gevent.sleep(every)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),))
        if first is None:
            first = snapshot   # after a first interval: start-up's allocations are not growth
            continue
        lines = [f"after {time.monotonic() - started:.0f} s, traced {tracemalloc.get_traced_memory()[0]} bytes; "
                 f"grown most since the first snapshot:"]
        for stat in snapshot.compare_to(first, "traceback")[:TOP]:
            where = " <- ".join(f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno}" for frame in stat.traceback)
            lines.append(f"{stat.size_diff:+10d} B {stat.count_diff:+7d} blocks  {where}")
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)
