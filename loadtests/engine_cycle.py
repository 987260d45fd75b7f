"""The engine alone, in process: µs per full job cycle (add + lease + complete).

A shard's engine holds ``--prefill`` jobs (256 queues, a TTL, so every job
is in its queue's ready line and in a TTL line), then runs ``--cycles``
cycles: add a job to a queue, lease that queue's first job, complete it.
No sockets, no codecs: what the engine's sorted lines and timers cost per
cycle, for comparing one engine with another (``PYTHONPATH`` picks the tree).

    .venv/bin/python loadtests/engine_cycle.py --prefill 100000 1000000
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

from queueserver.engine import Engine
from queueserver.engine.status import OK

NOW = 1_767_225_600_000_000
QUEUES = 256


def _add(engine: Engine, i: int, names: list, pad: bytes, now: int) -> None:
    id = "%08x-0000-4000-8000-%012x" % (i * 7919 % 2**32, i)
    reply = engine.execute("add", [id, names[i % QUEUES], id.encode() + pad, 0, 30_000, 3_600_000,
                                   0, 0, None, False, i + 1], now).reply
    assert reply is not None and reply[0] == OK


def run(prefill: int, cycles: int) -> float:
    engine = Engine()
    names = [f"queue-{i}" for i in range(QUEUES)]
    for name in names:
        engine.execute("create_queue", [name], NOW)
    pad = b"." * 64
    for i in range(prefill):
        _add(engine, i, names, pad, NOW + i)
    gc.collect()
    now = NOW + prefill
    execute = engine.execute
    started = time.process_time()   # CPU time: the machine is shared
    for c in range(cycles):
        i = prefill + c
        now += 1
        _add(engine, i, names, pad, now)
        reply = execute("lease", [[names[i % QUEUES]], 0], now).reply
        assert reply is not None and reply[0] == OK
        done = execute("complete", [reply[1][0], b"ok"], now).reply
        assert done is not None and done[0] == OK
    return (time.process_time() - started) / cycles * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--cycles", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3, help="the best of this many runs")
    args = parser.parse_args()
    for prefill in args.prefill:
        best = min(run(prefill, args.cycles) for _ in range(args.repeat))
        print(f"prefill {prefill:>9,}: {best:.2f} µs per cycle (add + lease + complete), "
              f"best of {args.repeat}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
