"""Server CPU per full job cycle (workload (1) of ``bench.py``), alone and repeated.

Why: ``bench.py`` also runs the producer and memory workloads, which take
most of its time; comparing a hot-path change before and after needs only
the cycle's CPU figure, several times over on a noisy machine. Each run gets
a fresh server (as in ``bench.py``) and prints router and shard µs per
cycle, and the share of it spent in the kernel; ``--profile DIR`` also records each shard with py-spy (if installed)
while the load runs, as collapsed stacks (one text file per shard).

    .venv/bin/python loadtests/cycle_cpu.py --shards 1 2 --repeat 3 --duration 5
    .venv/bin/python loadtests/cycle_cpu.py --shards 1 --durable [--no-history]
    .venv/bin/python loadtests/cycle_cpu.py --shards 1 2 --tls   # plain and TLS, side by side
    .venv/bin/python loadtests/cycle_cpu.py --shards 1 2 --tls --forwarded   # both through the router
    .venv/bin/python loadtests/cycle_cpu.py --shards 1 2 --tls --both-paths  # each with and without the direct path
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402
from queueserver import BUILD  # noqa: E402


def _user_system(pid: int) -> tuple:
    """utime and stime of one process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="cycle_cpu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--profile", metavar="DIR", help="py-spy record every shard into DIR")
    parser.add_argument("--durable", action="store_true",
                        help="as bench.py's section (5): --data-dir and --fsync always")
    parser.add_argument("--no-history", action="store_true",
                        help="a durable server without its job history (what the history costs)")
    parser.add_argument("--tls", action="store_true",
                        help="each shard count plain, then with workq's port over TLS (what TLS costs)")
    parser.add_argument("--forwarded", action="store_true",
                        help="serve with --no-direct-path: every connection stays in the router, which "
                             "terminates TLS (the hop's cost apart from the encryption's)")
    parser.add_argument("--both-paths", action="store_true",
                        help="each row with the direct path (shards terminate TLS) and then forwarded")
    args = parser.parse_args(argv)
    opts = bench.parse_args(["--duration", str(args.duration)])
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    print(f"# {BUILD}")   # the servers run the same tree: compiled or not, as this process
    print(f"{'shards':>6} {'tls':>4} {'path':>9} {'cycles/s':>9} {'router µs':>10} {'shards µs':>10} "
          f"{'server µs':>10} {'kernel':>7}")
    paths = [False, True] if args.both_paths else [args.forwarded]
    for run in range(args.repeat):
        for shards, forwarded, tls in [(shards, forwarded, tls) for shards in args.shards for forwarded in paths
                                       for tls in ([False, True] if args.tls else [False])]:
            with bench.OurServer(shards, durable=args.durable, history=not args.no_history, tls=tls,
                                 extra=["--no-direct-path"] if forwarded else []) as server:
                spies = []
                if args.profile:
                    os.makedirs(args.profile, exist_ok=True)
                    for role, pid in server.pids().items():
                        if role.startswith("shard"):
                            out = os.path.join(args.profile, f"{shards}s-{role}-{run}.txt")
                            spies.append(subprocess.Popen(
                                [py_spy, "record", "--nonblocking", "--format", "raw", "-o", out,
                                 "--pid", str(pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                pids = server.pids()
                before = {role: _user_system(pid) for role, pid in pids.items()}
                try:
                    result = bench.measure_cycle(server, opts)
                finally:
                    for spy in spies:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(30)
                after = {role: _user_system(pid) for role, pid in pids.items()}
            per = result["cpu_us_per_cycle"]
            user = sum(after[r][0] - before[r][0] for r in pids)
            system = sum(after[r][1] - before[r][1] for r in pids)
            router = sum(v for k, v in per.items() if not k.startswith("shard"))
            shard = sum(v for k, v in per.items() if k.startswith("shard"))
            print(f"{shards:>6} {'yes' if tls else 'no':>4} {'forwarded' if forwarded else 'direct':>9} "
                  f"{result['ops_per_s']:>9,.0f} {router:>10.1f} {shard:>10.1f} "
                  f"{router + shard:>10.1f} {100 * system / max(user + system, 1e-9):>6.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
