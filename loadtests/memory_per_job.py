"""RSS per queued job of a real server, alone: ``make bench``'s section (4).

Starts our server (``--shards``, default the CPU count, as the bench's "ours,
N shards" row), queues ``--jobs`` jobs of ``--payload`` bytes with a TTL over
workq with the bench's load generator, and prints the RSS growth of the
router and each shard per job (``bench.measure_memory``, reused as is).

    .venv/bin/python loadtests/memory_per_job.py --jobs 1000000
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=bench.CORES)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--queues", type=int, default=256)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--loadgen-procs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    opts = argparse.Namespace(memory_jobs=args.jobs, payload=args.payload, queues=args.queues,
                              connections=args.connections, loadgen_procs=args.loadgen_procs,
                              batch=args.batch, warmup=0.0, duration=600.0)
    server = bench.OurServer(args.shards)
    try:
        server.start()
        r = bench.measure_memory(server, opts)
    finally:
        server.stop()
    by_process = " + ".join(f"{role} {b:.0f}" for role, b in sorted(r["bytes_per_job_by_process"].items()))
    print(f"{r['jobs']:,} jobs ({r['errors']} errors), {args.shards} shard(s): "
          f"{r['bytes_per_job']:.1f} B/job RSS, {r['bytes_beyond_payload']:.1f} beyond the "
          f"{args.payload} B payload ({by_process})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
