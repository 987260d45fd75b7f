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

With ``--preload N`` it measures instead what a follower's first sync costs
the primary's clients: node a's shard holds N jobs (ready, leased, finished
with results) when its follower is killed and restarted, so that it takes
the whole live state again; meanwhile one client cycles jobs (add, lease,
complete) on that shard, and the longest of its requests (max and p99.9)
from the kill until the follower is in sync again is reported, beside the
same client's figures before the kill.

    .venv/bin/python loadtests/replication_bench.py --preload 200000
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import signal
import tempfile
import threading
import time
import uuid
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
from queueserver.client import Client  # noqa: E402
from serverproc import poll, wait_for  # noqa: E402


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


class Probe(threading.Thread):
    """One client cycling jobs on a queue, every request's latency kept."""

    def __init__(self, address: Any, queue: str) -> None:
        super().__init__(daemon=True)
        self.address, self.queue = address, queue
        self.latencies: List[float] = []   # seconds, in order
        self.stopping = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            with Client(*self.address, timeout=120) as client:
                timed = self._timed
                while not self.stopping.is_set():
                    timed(client.add, str(uuid.uuid4()), self.queue, b"probe", 60_000, 600_000)
                    job = timed(client.lease, self.queue, 5000)
                    timed(client.complete, job.id, b"done")
        except BaseException as err:   # reported by the main thread
            self.error = err

    def _timed(self, call: Any, *args: Any) -> Any:
        started = time.perf_counter()
        answer = call(*args)
        self.latencies.append(time.perf_counter() - started)
        return answer


def worst(latencies: List[float]) -> Dict[str, Any]:
    ordered = sorted(latencies)
    return {"requests": len(ordered), "max_ms": ordered[-1] * 1000,
            "p99.9_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.999))] * 1000}


def preload(address: Any, queues: List[str], total: int) -> None:
    """``total`` jobs on ``queues``, added 1,000 to a write: of each thousand,
    50 leased and 25 of those finished with a result (kept: TTL 10 min)."""
    batch = 1000
    with Client(*address, timeout=120) as client:
        for start in range(0, total, batch):
            queue = queues[(start // batch) % len(queues)]
            adds = client.pipeline()
            for _ in range(start, min(total, start + batch)):
                adds.add(str(uuid.uuid4()), queue, b"p" * 100, 600_000, 600_000)
            count = len(adds)
            failed = [answer for answer in adds.execute() if answer is not None]
            if failed:
                raise RuntimeError(f"preloading failed: {failed[0]!r}")
            completes = client.pipeline()
            for i in range(min(50, count)):
                job = client.lease(queue, 5000)
                if i % 2:
                    completes.complete(job.id, b"result of " + job.id.encode())
            failed = [answer for answer in completes.execute() if answer is not None]
            if failed:
                raise RuntimeError(f"preloading failed: {failed[0]!r}")


def first_sync(opts: argparse.Namespace, root: Path) -> Dict[str, Any]:
    nodes = start(root, 1)
    try:
        queues = [name.decode() for name in names_on([0], 8, 2, "preload")]
        address = ("127.0.0.1", nodes.procs["a"].port("workq"))
        started = time.monotonic()
        preload(address, queues, opts.preload)
        print(f"preloaded {opts.preload} jobs in {time.monotonic() - started:.0f} s", file=sys.stderr)
        probe = Probe(address, names_on([0], 1, 2, "probe")[0].decode())
        probe.start()
        time.sleep(opts.seconds)   # the probe's figures with the follower in sync
        calm = len(probe.latencies)
        synced = nodes.log("a").count("is in sync at position")
        attached = nodes.log("a").count("follower on node b attached")
        os.kill(nodes.follower_pid(0), signal.SIGKILL)   # its supervisor starts it again
        killed = time.monotonic()
        in_sync = poll(lambda: nodes.log("a").count("is in sync at position") > synced or probe.error,
                       opts.sync_timeout)
        took = time.monotonic() - killed
        probe.stopping.set()
        probe.join()
        if probe.error is not None:
            raise RuntimeError(f"the probe client failed: {probe.error!r}")
        attempts = nodes.log("a").count("follower on node b attached") - attached
        return {"preload": opts.preload, "sync_s": took if in_sync else None, "attempts": attempts,
                "in_sync": worst(probe.latencies[:calm]), "during_sync": worst(probe.latencies[calm:])}
    finally:
        nodes.stop()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="replication_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="one short run of each (a smoke test)")
    parser.add_argument("--json", metavar="FILE", help="write the figures here too")
    parser.add_argument("--preload", type=int, default=0, metavar="N",
                        help="measure a follower's first sync of N jobs instead (client latency)")
    parser.add_argument("--sync-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="with --preload: how long the sync may take before it is reported as never done")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.seconds, opts.warmup, opts.repeat = 1.0, 0.3, 1
    ensure_loopback_aliases()
    if opts.preload:
        with tempfile.TemporaryDirectory(prefix="qs-repl-sync-") as tmp:
            report = first_sync(opts, Path(tmp) / "sync")
        took = "never ended" if report["sync_s"] is None else f"took {report['sync_s']:.1f} s"
        print(f"a follower's first sync of {opts.preload:,} jobs {took} ({report['attempts']} attempts)")
        print(f"{'primary: one client':<28}{'requests':>10}{'max ms':>10}{'p99.9 ms':>10}")
        for key, label in (("in_sync", "follower in sync"), ("during_sync", "during its first sync")):
            row = report[key]
            print(f"{label:<28}{row['requests']:>10}{row['max_ms']:>10.1f}{row['p99.9_ms']:>10.1f}")
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump(report, f, indent=2)
        return 0
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
