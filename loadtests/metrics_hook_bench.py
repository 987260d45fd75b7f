"""What the /metrics counting costs a shard per engine event (a micro-benchmark).

Runs full job cycles (add, lease, complete: three events each) on a bare
engine, without and with :class:`queueserver.shard.stats.ShardStats`
attached, best of several rounds each, and prints the difference per
event. Also times the per-recv/per-reply traffic counting of a client
connection. Usage: ``python loadtests/metrics_hook_bench.py [--cycles N] [--rounds R]``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from queueserver.engine import Engine  # noqa: E402
from queueserver.metrics.traffic import COUNTS, RECEIVED  # noqa: E402
from queueserver.shard.stats import ShardStats  # noqa: E402

T0 = 1_700_000_000_000_000


def cycles(n: int, counted: bool) -> float:
    """Seconds for ``n`` add/lease/complete cycles over 10 queues."""
    engine = Engine()
    if counted:
        ShardStats().attach(engine)
    names = [f"q{i}" for i in range(10)]
    ids = [f"job-{i}" for i in range(n)]
    started = time.perf_counter()
    now = T0
    for i in range(n):
        name = names[i % 10]
        engine.execute("add", (ids[i], name, b"x", 0, 60000), now)
        engine.execute("lease", ([name], 0), now + 5)
        engine.execute("complete", (ids[i], b""), now + 9)
        now += 10
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    best = {False: float("inf"), True: float("inf")}
    for _ in range(args.rounds):
        for counted in (False, True):
            best[counted] = min(best[counted], cycles(args.cycles, counted))
    events = 3 * args.cycles
    plain, counted = best[False] / events * 1e9, best[True] / events * 1e9
    print(f"engine events: {plain:.0f} ns each without stats, {counted:.0f} ns with: "
          f"+{counted - plain:.0f} ns per event (+{(counted - plain) * 3 / 1000:.2f} µs per job cycle, "
          f"{(best[True] / best[False] - 1) * 100:.0f}% of the bare engine)")
    names = {"COUNTS": COUNTS, "RECEIVED": RECEIVED, "data": b"x" * 200}
    per = min(timeit.repeat("COUNTS[RECEIVED] += len(data)", globals=names, number=1_000_000,
                            repeat=3)) * 1000
    print(f"traffic counting: ~{per:.0f} ns per recv or reply (an addition into a list)")


if __name__ == "__main__":
    main()
