"""``make bench-replication``: what a follower costs a durable shard.

Why: with ``replicas = 1`` an answer waits for the primary's log *and* the
follower's (each fsynced under ``--fsync always``), one more network round
trip and one more fsync on another process's path. Two nodes of one shard
each, durable with ``fsync always``, full job cycles (add + lease + complete
over workq, as ``bench.py`` workload (1)) through node a's router on
queues node a's shard serves; once without replicas and once with
``replicas = 1`` (node b keeps the copy), taking turns ``--repeat`` times;
the median run of each is reported with its p99 and the ratio.

    .venv/bin/python loadtests/replication_bench.py [--seconds 5] [--repeat 3] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import bench  # noqa: E402
import loadgen  # noqa: E402
from cluster_bench import NamedSpec, names_on  # noqa: E402
from cluster_nodes import Nodes, ensure_loopback_aliases  # noqa: E402
from loadgen import CYCLE  # noqa: E402
from serverproc import wait_for  # noqa: E402


def start(root: Path, replicas: int) -> Nodes:
    root.mkdir()
    nodes = Nodes(root, shards=(1, 1), protocols=["workq"],
                  extra=["--fsync", "always", "--bind", "127.0.0.1"])
    if replicas:
        nodes.file.write_text(f"replicas = {replicas}\n" + nodes.file.read_text())
    nodes.start()
    if replicas:
        wait_for(lambda: all(row.get("followers") and row["followers"][0]["state"] == "in-sync"
                             for row in nodes.status()), 30, "the followers to be in sync")
    return nodes


def run_once(nodes: Nodes, opts: argparse.Namespace, tag: str) -> Dict[str, Any]:
    names = names_on([0], opts.connections, 2, f"repl-{tag}")
    spec = NamedSpec(protocol="workq", port=nodes.procs["a"].port("workq"), workload=CYCLE,
                     connections=opts.connections, procs=2, warmup=opts.warmup, duration=opts.seconds,
                     payload=100, names=names, node="a")
    loadgen.prefill(spec, 20 * len(names))
    result = bench._result_dict(loadgen.run(spec))
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} requests failed")
    return {"cycles_per_s": result["ops_per_s"], "p99_ms": result["latency_us"]["p99"] / 1000}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="replication_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="one short run of each (a smoke test)")
    parser.add_argument("--json", metavar="FILE", help="write the figures here too")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.seconds, opts.warmup, opts.repeat = 1.0, 0.3, 1
    ensure_loopback_aliases()
    runs: Dict[int, List[Dict[str, Any]]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="qs-repl-bench-") as tmp:
        for turn in range(opts.repeat):
            for replicas in (0, 1):
                nodes = start(Path(tmp) / f"r{replicas}-{turn}", replicas)
                try:
                    runs[replicas].append(run_once(nodes, opts, f"{replicas}-{turn}"))
                finally:
                    nodes.stop()
                print(f"run {turn + 1}, replicas = {replicas}: {runs[replicas][-1]}", file=sys.stderr)
    report: Dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "seconds": opts.seconds, "repeat": opts.repeat}
    for replicas, results in runs.items():
        median = statistics.median(r["cycles_per_s"] for r in results)
        p99 = statistics.median(r["p99_ms"] for r in results)
        report[f"replicas_{replicas}"] = {"cycles_per_s": median, "p99_ms": p99, "runs": results}
    ratio = report["replicas_1"]["cycles_per_s"] / max(1e-9, report["replicas_0"]["cycles_per_s"])
    report["ratio"] = ratio
    print(f"{'':<28}{'cycles/s':>10}{'req p99 ms':>11}")
    for replicas, label in ((0, "durable, no replicas"), (1, "durable, replicas = 1")):
        row = report[f"replicas_{replicas}"]
        print(f"{label:<28}{row['cycles_per_s']:>10,.0f}{row['p99_ms']:>11.2f}")
    print(f"replicated ÷ single: {ratio:.2f}×")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
