"""The benchmark runs end to end: ``bench.py --quick`` against our server only.

Why: ``make bench`` is run rarely and by hand, so without this it would rot
silently. These runs are tiny and bounded (about 1 s per workload); they
prove the pieces fit and that every server the bench starts is stopped
again, even on Ctrl-C. They never assert timings: this machine is shared
and noisy, and numbers belong in the bench's own report.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List

import pytest

from serverproc import ServerProcess, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "loadtests", "bench.py")
LOADGEN = os.path.join(REPO, "loadtests", "loadgen.py")
PIDS_LINE = re.compile(r"pids (\{.*\})")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def started_pids(stderr: str) -> List[int]:
    """Every server pid the bench announced on stderr."""
    pids: List[int] = []
    for match in PIDS_LINE.finditer(stderr):
        pids += json.loads(match.group(1)).values()
    return pids


def forked(pid: int) -> List[int]:
    """The children of ``pid`` that run its own command line: forked, not started anew."""
    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    own = read(f"/proc/{pid}/cmdline")
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(read(f"/proc/{entry}/stat").rsplit(b")", 1)[1].split()[1])
                if parent == pid and read(f"/proc/{entry}/cmdline") == own:
                    found.append(int(entry))
            except OSError:
                pass   # gone meanwhile
    return found


def assert_all_gone(pids: List[int]) -> None:
    wait_for(lambda: not any(alive(p) for p in pids), 10,
             "the bench to stop every server process it started")


@pytest.mark.timeout(180)
def test_quick_bench_against_our_server(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--only", "ours", "--shards", "2",
                           "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for heading in ("(1) full job cycle", "(2) producer only", "(3) server CPU", "(4) memory",
                    "targets", "command:", "machine:", "ours, 1 shard", "ours, 2 shards"):
        assert heading in text, f"{heading!r} missing from:\n{text}"
    assert "problems:" not in text, text

    report = json.loads(out.read_text())
    results: Dict[str, Dict] = report["results"]
    for label in ("ours, 1 shard", "ours, 2 shards"):
        cycle, produce = results[label]["cycle"], results[label]["produce"]
        assert cycle["ops_per_s"] > 0 and cycle["errors"] == 0
        assert cycle["latency_us"]["p99"] > 0 and cycle["cycle_latency_us"]["p50"] > 0
        assert cycle["cpu_us_per_cycle"]["router"] > 0
        assert sum(v for k, v in cycle["cpu_us_per_cycle"].items() if k.startswith("shard")) > 0
        assert produce["ops_per_s"] > 0 and produce["errors"] == 0
    memory = results["ours, 2 shards"]["memory"]
    assert memory["jobs"] == 20000 and memory["errors"] == 0
    assert memory["rss_after"] > memory["rss_before"] > 0
    assert_all_gone(started_pids(proc.stderr))


@pytest.mark.timeout(120)
def test_ctrl_c_stops_every_server(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, BENCH, "--quick", "--only", "ours", "--duration", "30"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stderr = ""
        deadline = time.monotonic() + 60
        while "pids {" not in stderr and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            stderr += line
        pids = started_pids(stderr)
        assert pids, stderr
        # Interrupt the workload itself (30 s long), once the bench has forked
        # all its load generator's workers (two by default): one forked
        # while the bench is interrupted can outlive it, holding its output.
        wait_for(lambda: len(forked(proc.pid)) >= 2, 60, "the bench's load generator")
        proc.send_signal(signal.SIGINT)
        rest, more = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, more[-3000:]
    assert "(1) full job cycle" in rest       # partial results are still printed
    assert_all_gone(pids)


@pytest.mark.timeout(60)
def test_loadgen_alone_is_bounded() -> None:
    server = ServerProcess(shards=2, protocols=["workq"]).start()
    try:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, LOADGEN, "--protocol", "workq", "--port",
                               str(server.port()), "--procs", "2", "--connections", "4",
                               "--warmup", "0", "--duration", "5", "--max-ops", "300",
                               "--prefill", "100"],
                              capture_output=True, text=True, timeout=50)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["total_ops"] == 300       # the count bound, well before the time bound
        assert result["errors"] == 0
        assert time.monotonic() - started < 45
    finally:
        server.stop()
