"""Memory and time of the engine's sorted lines of jobs (issue 18).

A queue's ready jobs and the shard's TTL lines are sorted lines of jobs by
``job.key`` (one int: priority, schedule, creation, number). Two ways to
keep one with sortedcontainers, measured here side by side (and the
hand-written ``JobLine`` they replaced, when this runs on a tree that still
has it):

* ``SortedList`` of jobs, ordered by ``Job.__lt__`` (``self.key < other.key``):
  no stored key, but every comparison of a bisect is a Python call;
* ``SortedKeyList(key=attrgetter("key"))``: a stored key beside each job (one
  more pointer; the int is the job's own), bisects compare ints in C.

Per variant and line size N: bytes per job the line itself holds
(tracemalloc, jobs made beforehand), and time per operation: ``add`` in
order (a queue's adds), ``add`` at a random place (other priorities),
``pop(0)``, ``remove`` of the first job (a lease), ``remove`` of a random
job (a delete, a TTL line's complete), ``line[0]``.

    .venv/bin/python loadtests/sorted_line_bench.py --sizes 100000 1000000
"""
from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from operator import attrgetter
from typing import Any, Callable, Dict, List

from sortedcontainers import SortedKeyList, SortedList

from queueserver.engine.job import Job

#: Jobs with a Python ``__lt__`` on their key, if Job has none of its own (the
#: subclass adds no slot: the same 80-byte object).
if "__lt__" in Job.__dict__:
    LtJob = Job
else:
    class LtJob(Job):  # type: ignore[no-redef]
        __slots__ = ()

        def __lt__(self, other: "Job") -> bool:
            return self.key < other.key  # type: ignore[no-any-return]


def variants() -> Dict[str, Callable[[], Any]]:
    out: Dict[str, Callable[[], Any]] = {
        "SortedList (Job.__lt__)": SortedList,
        "SortedList, load 250": lambda: _loaded(SortedList(), 250),
        "SortedKeyList (key attr)": lambda: SortedKeyList(key=attrgetter("key")),
    }
    try:
        from queueserver.engine.timers import JobLine  # type: ignore[attr-defined]
        out = {"hand-written JobLine": JobLine, **out}
    except ImportError:
        pass
    return out


def _loaded(line: Any, load: int) -> Any:
    """``line`` with sublists of ``load`` to ``2 * load`` (the default is 1000)."""
    line._reset(load)
    return line


def make_jobs(n: int) -> List[Job]:
    """Jobs of one queue, in add order (increasing keys), sharing id and payload."""
    return [LtJob("j", i + 1, "q", b"", created=1_767_225_600_000_000 + i) for i in range(n)]


def bytes_per_job(factory: Callable[[], Any], jobs: List[Job]) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        line = factory()
        for job in jobs:
            line.add(job)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(line) == len(jobs)
    return (after - before) / len(jobs)


def per_op(fn: Callable[[], None], ops: int) -> float:
    """µs per operation of ``fn``, which does ``ops`` of them."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) / ops * 1e6


def timings(factory: Callable[[], Any], jobs: List[Job], sample: int, seed: int) -> Dict[str, float]:
    rnd = random.Random(seed)
    n = len(jobs)
    out: Dict[str, float] = {}
    line = factory()
    add = line.add

    def add_in_order() -> None:
        for job in jobs:
            add(job)
    out["add in order"] = per_op(add_in_order, n)

    first = line.__getitem__
    out["line[0]"] = per_op(lambda: [first(0) for _ in range(sample)] and None, sample)

    # Jobs of other priorities land anywhere in the line.
    extra = [LtJob("x", n + 1 + i, "q", b"", priority=0, created=0,
                   sched=1_767_225_600_000_000 + rnd.randrange(n)) for i in range(sample)]
    out["add at random"] = per_op(lambda: [add(j) for j in extra] and None, sample)
    remove = line.remove
    out["remove random"] = per_op(lambda: [remove(j) for j in extra] and None, sample)
    victims = rnd.sample(jobs, sample)
    out["remove random (2)"] = per_op(lambda: [remove(j) for j in victims] and None, sample)
    for job in victims:
        add(job)

    def lease() -> None:
        for _ in range(sample):
            remove(first(0))
    out["remove first"] = per_op(lease, sample)

    pop = line.pop
    out["pop(0)"] = per_op(lambda: [pop(0) for _ in range(sample)] and None, sample)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--sample", type=int, default=20_000, help="operations timed per kind")
    parser.add_argument("--repeat", type=int, default=3, help="timings: the best of this many runs")
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}; µs per operation (best of {args.repeat}), "
          f"bytes per job the line holds (tracemalloc)")
    gc.disable()   # timings of the line, not of the cyclic GC walking the jobs
    for n in args.sizes:
        jobs = make_jobs(n)
        for name, factory in variants().items():
            mem = bytes_per_job(factory, jobs)
            runs = [timings(factory, jobs, args.sample, seed) for seed in range(args.repeat)]
            best = {k: min(r[k] for r in runs) for k in runs[0]}
            cells = "  ".join(f"{k} {v:.3f}" for k, v in best.items())
            print(f"N={n:>9,}  {name:<26} {mem:6.2f} B/job  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
