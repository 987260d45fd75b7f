"""``loadtests/cluster_bench.py --quick`` end to end.

Why: ``make bench-cluster`` is run rarely and by hand, so without this it
would rot silently. The quick run (about 20 s) proves the pieces fit: every
row of the report is measured, and every node it started is stopped again.
No timing is asserted: this machine is shared and noisy, and numbers belong
in the bench's own report.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import List

import pytest

from serverproc import alive, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "loadtests", "cluster_bench.py")
PIDS_LINE = re.compile(r"pids (\{.*\})")
TMP_LINE = re.compile(r"temporary directory (\S+)")

sys.path.insert(0, os.path.join(REPO, "loadtests"))
import cluster_bench  # noqa: E402


def running_in(path: str) -> List[int]:
    """Live processes whose command line names ``path`` (every node's does: its cluster file)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if path.encode() in f.read() and alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                pass   # gone meanwhile
    return found


@pytest.mark.timeout(180)
def test_quick_cluster_bench(tmp_path) -> None:
    out = tmp_path / "cluster.json"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "problems:" not in text, text
    for heading in ("(1) the cross-node hop", "(2) aggregate", "hop cost = remote − local",
                    "--no-direct-path split", "projected = N hosts", "--fsync never"):
        assert heading in text, f"{heading!r} missing from:\n{text}"
    for _, label, _, _ in cluster_bench.HOP_CASES:
        row = next(line for line in text.splitlines() if line.startswith(label))
        assert float(row[len(label):].split()[0].replace(",", "")) > 0, row
    for _, nodes, queues in cluster_bench.SCALE_CASES:
        row = re.search(rf"^{nodes}\s+{re.escape(queues)}\s+\d+%\s+([\d,]+)\s", text, re.MULTILINE)
        assert row and int(row.group(1).replace(",", "")) > 0, text

    report = json.loads(out.read_text())
    rows = [report["hop"][key] for key, _, _, _ in cluster_bench.HOP_CASES]
    rows += [report["scale"][key] for key, _, _ in cluster_bench.SCALE_CASES]
    for r in rows:
        assert isinstance(r, dict), r          # a string is the error the bench caught
        assert r["ops_per_s"] > 0 and r["errors"] == 0
        assert r["latency_us"]["p50"] > 0
        assert r["server_us_per_cycle"] > 0 and r["shard_us_per_cycle"] > 0
        assert all(v > 0 for v in r["per_node_ops_per_s"].values())
    for key, nodes, queues in cluster_bench.SCALE_CASES:
        r = report["scale"][key]
        assert len(r["per_node_ops_per_s"]) == nodes
        assert r["projected_ops_per_s"] > 0
        assert r["remote_share"] > 0.5 if queues == "all slots" else r["remote_share"] == 0
        assert r["link_frames"] >= 0 and r["link_frames_per_cycle"] >= 0
    assert report["hop"]["local"]["remote_share"] == 0 and report["hop"]["remote"]["remote_share"] == 1
    assert all(isinstance(v, float) for v in report["hop_costs"].values()), report["hop_costs"]

    pids = [pid for match in PIDS_LINE.finditer(proc.stderr) for pid in json.loads(match.group(1)).values()]
    assert len(pids) == 3 * sum(nodes for nodes, _, _ in cluster_bench.PLAN), proc.stderr   # 3 per node
    wait_for(lambda: not any(alive(p) for p in pids), 10, "every server process the bench started to stop")
    tmp = TMP_LINE.search(proc.stderr).group(1)
    assert running_in(tmp) == []
    assert not os.path.exists(tmp)
