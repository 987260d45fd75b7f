"""The replication and failover benches end to end, so that they do not rot:
``replication_bench.py --quick`` measures both rows (replicas 0 and 1, the
second once its follower is in sync) and writes JSON; ``failover_bench.py
--kills 1`` times one failover and loses nothing. No timing is asserted
(numbers belong in the benches' reports); their nodes are stopped by the
benches themselves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_replication_bench_measures_both_rows(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, os.path.join(REPO, "loadtests", "replication_bench.py"),
                           "--quick", "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    for key in ("replicas_0", "replicas_1"):
        assert report[key]["cycles_per_s"] > 0 and report[key]["p99_ms"] > 0
    assert report["ratio"] > 0
    assert "replicated ÷ single" in done.stdout


def test_the_failover_bench_kills_and_counts(tmp_path: Path) -> None:
    """``loadtests/failover_bench.py --kills 1``: one kill -9 of shard 0's
    primary node with etcd, its failover timed, every acknowledged add drained."""
    out = tmp_path / "f.json"
    done = subprocess.run([sys.executable, os.path.join(REPO, "loadtests", "failover_bench.py"),
                           "--kills", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert len(report["failover_s"]) == 1 and report["lost"] == 0 and report["acknowledged"] > 0
    assert "median" in done.stdout
