"""``make bench-cores`` runs end to end: ``bench_cores.py --quick`` at 1 and
2 shards, 2 shards as plain Python and durable (with beanstalkd and Redis,
in memory and durable, when they are unpacked already).

Why: the bench is run by hand and rarely; this proves its pieces fit, that
its figures come out where they should, and that every server it starts is
stopped again. No timing is asserted (a shared, noisy machine): only what
must hold whatever the speed: one shard has nobody to send a frame to, and
two shards of one host claim random ids in the table they share
(:mod:`queueserver.shard.hostids`), so no job costs a frame between them
either (tests/test_loop_counters.py counts frames where they do cross); a
turn that is counted ran at least one request.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_bench_smoke import assert_all_gone, started_pids

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_CORES = os.path.join(REPO, "loadtests", "bench_cores.py")
COLUMNS = ("cycles/s", "÷ 1 shard", "server µs/cycle", "CPU ÷ 1 shard", "cores busy", "loadgen cores",
           "shard frames/cycle",
           "router frames/cycle", "requests/turn", "req p99 ms", "cycle p99 ms")

sys.path.insert(0, os.path.join(REPO, "loadtests"))
import peers  # noqa: E402


@pytest.mark.timeout(150)
def test_quick_bench_cores(tmp_path) -> None:
    out = tmp_path / "cores.json"
    with_peers = peers.installed()
    proc = subprocess.run([sys.executable, BENCH_CORES, "--quick", "--shards", "1", "2", "--plain", "--durable",
                           "--json", str(out)]
                          + ([] if with_peers else ["--no-peers"]),
                          cwd=REPO, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    header = next(line for line in text.splitlines() if line.startswith("server "))
    for column in COLUMNS:
        assert column in header, f"{column!r} missing from:\n{text}"
    assert "problems:" not in text, text
    assert "load average" in text and "targets (issue 27" in text

    report = json.loads(out.read_text())
    rows = report["rows"]
    expected = (["ours, 1 shard", "ours, 2 shards", "ours, 2 shards, plain Python"]
                + (["beanstalkd", "redis"] if with_peers else []) + ["ours durable (fsync always), 2 shards"]
                + (["redis appendfsync always", "beanstalkd -b -f 0"] if with_peers else []))
    assert list(rows) == expected
    for label in expected:
        row = rows[label]
        assert row["runs"] == 1 and row["failures"] == [] and row["errors"] == 0, row
        assert row["cycles_per_s"] > 0 and row["server_cpu_us_per_cycle"] > 0 and row["cores_busy"] > 0
        assert row["request_p99_us"] > 0 and row["cycle_p99_us"] > 0 and row["loadgen_cores"] > 0
    assert "durable rows' data on " in text and "fdatasync there" in text
    # the plain row ran plain and the durable one wrote its log (its server's /status said so)
    assert report["runs"]["ours, 2 shards, plain Python"][0]["compiled"] is False
    assert report["runs"]["ours durable (fsync always), 2 shards"][0]["fsyncs"] > 0
    for label in ("ours, 1 shard", "ours, 2 shards", "ours, 2 shards, plain Python",
                  "ours durable (fsync always), 2 shards"):
        row, run = rows[label], report["runs"][label][0]
        assert row["shard_frames_per_cycle"] == 0 == run["counted"]["shard_frames"]
        assert row["router_frames_per_cycle"] >= 0
        assert row["requests_per_turn"] >= 1
        # 3 requests per cycle done (and the requests of cycles cut short at the window's end)
        assert run["counted"]["requests"] >= 3 * run["total_ops"] > 0
        assert row["requests_per_turn"] == run["counted"]["requests"] / run["counted"]["turns"]
    if with_peers:
        assert rows["beanstalkd"]["requests_per_turn"] is None   # counted by ours only
    assert [t["what"] for t in report["targets"]][0] == "server CPU per cycle, ours, 2 shards ÷ ours, 1 shard"
    assert_all_gone(started_pids(proc.stderr))
