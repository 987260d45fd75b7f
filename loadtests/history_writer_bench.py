"""What the job history costs: bytes per job cycle on disk and the writer's CPU per cycle.

Why: the history is the bulk of a durable server's disk writes (issue 16,
item 18: 720 B per cycle in the soak), so a change of its encoding must be
measured in bytes and in shard CPU before and after. Two measurements:

- ``micro``: :class:`queueserver.shard.history.HistoryWriter` alone, fed
  full cycles (added, leased, completed) shaped like the soak's (UUID ids,
  a workq client's connection, 100-byte payloads); CPU of ``record`` (on
  the shard's event loop) and of the flushes (encoding and writing), best
  of several rounds;
- ``server``: a real 1-shard durable server driven through workq for N
  cycles; the history directory's bytes divided by N.

Runs against the ``queueserver`` that ``PYTHONPATH`` names (else this
checkout's), the server included, so the figures of an older tree come from
``PYTHONPATH=/path/to/old python loadtests/history_writer_bench.py``.

    .venv/bin/python loadtests/history_writer_bench.py --cycles 50000 --server-cycles 3000
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Tuple

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # after PYTHONPATH

import queueserver  # noqa: E402
from queueserver.engine.job import COMPLETED, LEASED, PENDING  # noqa: E402
from queueserver.shard.history import HistoryWriter  # noqa: E402

T0 = 1_764_000_000_000_000
CONTEXT = ("workq", "0-12")


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def micro(cycles: int) -> Tuple[float, float, float]:
    """(µs of ``record`` per cycle, µs of flushing per cycle, bytes per cycle)."""
    ids = [str(uuid.uuid4()) for _ in range(cycles)]
    names = [f"emails-{i % 10}" for i in range(10)]
    tmp = tempfile.mkdtemp(prefix="qs-hbench-")
    try:
        writer = HistoryWriter(os.path.join(tmp, "h"), 0)
        lessee = lambda token: CONTEXT   # noqa: E731
        recorded = 0.0
        now = T0
        for i, id in enumerate(ids):
            name = names[i % 10]
            steps = ((("add", id, name, i + 1, 0, 0, 100, PENDING, None),),
                     (("lease", id, name, i + 1, 1, 0, 100, LEASED, 1),),
                     (("complete", id, name, i + 1, 1, 0, 100, COMPLETED, None),))
            started = time.process_time()
            for entries in steps:
                writer.record(entries, now, CONTEXT, lessee)
                now += 100
            recorded += time.process_time() - started
        started = time.process_time()
        writer.close()   # every flush the loop did not run yet: encoding and writing
        flushed = time.process_time() - started
        return recorded / cycles * 1e6, flushed / cycles * 1e6, _dir_bytes(tmp) / cycles
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def server(cycles: int) -> float:
    """Bytes of history per workq cycle through a real durable server."""
    from queueserver.client import Client
    from queueserver.testing.serverprocess import ServerProcess
    tmp = tempfile.mkdtemp(prefix="qs-hbench-")
    data = os.path.join(tmp, "data")
    # The server runs the same tree: `python -m` looks in its working directory first.
    os.environ["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(queueserver.__file__)))
    here = os.getcwd()
    os.chdir(tmp)
    try:
        with ServerProcess(shards=1, protocols=["workq"],
                           extra=["--data-dir", data, "--fsync", "never"]) as proc:
            with Client(port=proc.ports["workq"]) as client:
                for _ in range(cycles):
                    client.add(str(uuid.uuid4()), "emails", b"x" * 100, 60_000, 3_600_000)
                    job = client.lease(["emails"], 1000)
                    client.complete(job.id, b"")
        return _dir_bytes(os.path.join(data, "history")) / cycles
    finally:
        os.chdir(here)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server-cycles", type=int, default=3000, help="0: skip the server run")
    args = parser.parse_args()
    print(f"queueserver from {os.path.dirname(queueserver.__file__)}")
    runs = [micro(args.cycles) for _ in range(args.rounds)]
    record, flush, size = min(runs, key=lambda r: r[0] + r[1])
    print(f"writer alone: {record:.2f} µs record + {flush:.2f} µs flush = {record + flush:.2f} µs "
          f"CPU per cycle (best of {args.rounds}); {size:.0f} B per cycle")
    if args.server_cycles:
        print(f"real server: {server(args.server_cycles):.0f} B of history per workq cycle "
              f"({args.server_cycles} cycles)")


if __name__ == "__main__":
    main()
