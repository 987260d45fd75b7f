"""What naming each lease's holder costs a shard: add, lease, complete and
delete cycles through ``Shard.execute`` in-process, with the client's
record passed along the lease (as routers and the direct path do, so that
the console can say who holds a job) and without it (as before), taking
turns; CPU time per cycle, the least of several runs of each.

Why in-process: the difference is a dict entry per lease, far below what a
whole server's cycle (``cycle_cpu.py``) can tell apart on a busy machine.

    .venv/bin/python loadtests/lease_holder_cost.py --cycles 30000 --repeat 8
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import uuid
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from queueserver.links.clients import VIA_DIRECT, ClientRecord  # noqa: E402
from queueserver.shard.shard import Shard  # noqa: E402


def cycles(count: int, client: Optional[ClientRecord], directory: str) -> float:
    """µs of CPU per cycle of ``count`` cycles on a fresh shard."""
    shard = Shard(0, os.path.join(directory, "shard-0.sock"))
    ids = [str(uuid.uuid4()) for _ in range(count)]
    execute = shard.execute
    gc.collect()
    started = time.process_time()
    for i, id in enumerate(ids):
        execute("add", (id, "q", b"payload", 0, 60_000, 0), (-1, i))
        execute("lease", (("q",), 0), (-1, i), client)
        execute("complete", (id, b"ok"), (-1, i))
        execute("delete", (id,), (-1, i))
    return (time.process_time() - started) / count * 1e6


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="lease_holder_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=8)
    args = parser.parse_args(argv)
    record = ClientRecord("workq", "127.0.0.1:5000", 0, 0, 1, VIA_DIRECT)
    runs: Dict[str, List[float]] = {"without a holder": [], "with its holder": []}
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(args.repeat):
            runs["without a holder"].append(cycles(args.cycles, None, directory))
            runs["with its holder"].append(cycles(args.cycles, record, directory))
    for name, values in runs.items():
        values.sort()
        print(f"{name:>17}: least {values[0]:6.2f} µs/cycle, median {values[len(values) // 2]:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
