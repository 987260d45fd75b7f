"""``loadtests/replication_bench.py --quick`` end to end: both rows are
measured (replicas 0 and 1, the second only once its follower is in sync)
and written as JSON. No timing is asserted (numbers belong in the bench's
report); its temporary nodes are stopped by the bench itself."""
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
