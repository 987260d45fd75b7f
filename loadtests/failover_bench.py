"""``make bench-failover``: how long a replicated shard is away when its primary's host dies.

Three nodes of one shard each on loopback (127.0.0.1-3), ``replicas = 1``,
durable (``fsync always``), coordinated by a real etcd (Debian's, as the
tests run it) with the default lease TTL. A producer adds jobs to queues of
shard 0 all along, through a node that is not the one about to die, and
records each acknowledged add. Then ``--kills`` times: SIGKILL every process
of the node that is shard 0's primary now, time until an add to shard 0 is
acknowledged again (the failover, as a client sees it), start the dead node
again and wait until it follows shard 0 in sync. At the end the queues are
drained: every acknowledged add must come out (a loss is an error).

    .venv/bin/python loadtests/failover_bench.py [--kills 10] [--ttl 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from cluster_nodes import Nodes, ensure_loopback_aliases  # noqa: E402
from etcd_server import EtcdServer  # noqa: E402
from serverproc import wait_for  # noqa: E402
from queueserver.client import Client  # noqa: E402
from queueserver.client.client import TimedOut, WorkqError  # noqa: E402
from queueserver.placement import initial_owners, slot_of  # noqa: E402


def names_on(ordinal: int, count: int) -> List[str]:
    owners, names = initial_owners(3), []
    while len(names) < count:
        name = f"fb-{uuid.uuid4().hex[:8]}"
        if owners[slot_of(name)] == ordinal:
            names.append(name)
    return names


class Producer:
    """Adds to ``queues`` through whichever node ``via()`` names, recording acknowledged ids."""

    def __init__(self, nodes: Nodes, queues: List[str]) -> None:
        self.nodes, self.queues = nodes, queues
        self.via = "c"
        self.acked: Set[str] = set()
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Producer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        n = 0
        client: Optional[Client] = None
        while not self._stop.is_set():
            try:
                if client is None:
                    client = Client(*self.nodes.address(self.via), timeout=5)
                id = str(uuid.uuid4())
                client.add(id, self.queues[n % len(self.queues)], b"x", 600_000, 3_600_000)
                self.acked.add(id)
                n += 1
            except (WorkqError, OSError):
                self.errors += 1
                if client is not None:
                    client.close()
                client = None
                self._stop.wait(0.05)
        if client is not None:
            client.close()


def primary_of(nodes: Nodes, ordinal: int, via: str) -> Dict[str, Any]:
    result = nodes.cli("status", "--json")
    rows = {row["ordinal"]: row for row in json.loads(result.stdout)}
    return rows[ordinal]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="failover_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--ttl", type=int, default=3, help="etcd lease TTL, seconds (the default's)")
    parser.add_argument("--json", metavar="FILE")
    opts = parser.parse_args(argv)
    ensure_loopback_aliases()
    times: List[float] = []
    with tempfile.TemporaryDirectory(prefix="qs-failover-bench-") as tmp:
        root = Path(tmp)
        etcd = EtcdServer(root).start()
        try:
            nodes = Nodes(root, shards=(1, 1, 1), protocols=["workq"], extra=["--fsync", "always"])
            nodes.file.write_text("replicas = 1\n" + nodes.file.read_text()
                                  + f'[etcd]\nendpoints = ["{etcd.endpoint}"]\nlease_ttl = {opts.ttl}\n')
            with nodes:
                nodes.start()
                queues = names_on(0, 4)
                wait_for(lambda: primary_of(nodes, 0, "c").get("in_sync"), 30, "shard 0's follower in sync")
                producer = Producer(nodes, queues).start()
                try:
                    for kill in range(opts.kills):
                        row = primary_of(nodes, 0, "c")
                        victim = row["primary"]
                        producer.via = next(n for n in nodes.names if n != victim)
                        time.sleep(0.5)
                        nodes.kill(victim)
                        killed = time.monotonic()
                        with Client(*nodes.address(producer.via), timeout=5) as probe:
                            while True:
                                try:
                                    probe.add(str(uuid.uuid4()), queues[0], b"probe", 600_000, 3_600_000)
                                    break
                                except (WorkqError, OSError):
                                    if time.monotonic() - killed > 60:
                                        raise RuntimeError("shard 0 was not served again within 60 s")
                                    time.sleep(0.02)
                        times.append(time.monotonic() - killed)
                        print(f"kill {kill + 1}: node {victim} (primary of shard 0) -> served again in "
                              f"{times[-1]:.2f} s", file=sys.stderr)
                        nodes.start(victim, linked=False)
                        wait_for(lambda: victim in (primary_of(nodes, 0, "c").get("in_sync") or []), 60,
                                 f"node {victim} to follow shard 0 in sync")
                finally:
                    producer.stop()
                drained: Set[str] = set()
                with Client(*nodes.address(producer.via), timeout=10) as client:
                    for name in queues:
                        while True:
                            try:
                                job = client.lease([name], 500)
                            except TimedOut:
                                break
                            drained.add(job.id)
                            client.delete(job.id)
                lost = producer.acked - drained
        finally:
            etcd.kill()
    report = {"kills": opts.kills, "ttl_s": opts.ttl, "failover_s": times,
              "median_s": statistics.median(times), "max_s": max(times),
              "acknowledged": len(producer.acked), "lost": len(lost), "add_errors": producer.errors}
    print(f"failover over {opts.kills} kills (lease TTL {opts.ttl} s): median {report['median_s']:.2f} s, "
          f"max {report['max_s']:.2f} s; {len(producer.acked)} acknowledged adds, {len(lost)} lost")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
