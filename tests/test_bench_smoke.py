"""The benchmark runs end to end: ``bench.py --quick`` against our server only
(and against the durable peers too when they are unpacked already).

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

from serverproc import ServerProcess, alive, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "loadtests", "bench.py")
LOADGEN = os.path.join(REPO, "loadtests", "loadgen.py")
PIDS_LINE = re.compile(r"pids (\{.*\})")
DATA_LINE = re.compile(r": data in (\S+)$", re.MULTILINE)
DURABLE_OURS = "ours, 2 shards, fsync always"
DURABLE_QUIET = "ours, 2 shards, fsync always, no history"

sys.path.insert(0, os.path.join(REPO, "loadtests"))
import bench  # noqa: E402
import peers  # noqa: E402


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


def assert_durable_ours(results: Dict[str, Dict], recovery_jobs: int) -> None:
    """Section (5)'s figures for our durable server are there and add up."""
    durable = results[DURABLE_OURS]
    for key in ("cycle", "produce"):
        r = durable[key]
        assert isinstance(r, dict), r            # a string is the error the bench caught
        assert r["ops_per_s"] > 0 and r["errors"] == 0
        log = r["log"]                           # from the shards' shutdown lines
        assert log["fsyncs"] > 0 and log["write_errors"] == 0
        assert log["fsynced_records"] == log["appended_records"]   # fsync always: nothing left unsynced
        assert log["appended_records"] >= r["total_ops"]     # at least a record per job added
        assert log["records_per_fsync"] >= 1
        assert log["fsyncs_per_s"] == pytest.approx(log["fsyncs"] / log["loaded_s"])
    # The cycle's counts cover the run, not the 25,600 jobs prefilled before it
    # (about 3 records per cycle now; room for a few more).
    cycle = durable["cycle"]
    assert cycle["log"]["appended_records"] <= 5 * cycle["total_ops"] + 100
    assert sum(durable["cycle"]["cpu_us_per_cycle"].values()) > 0
    recovery = durable["recovery"]
    assert isinstance(recovery, dict), recovery
    assert recovery["jobs"] == recovery_jobs and recovery["errors"] == 0
    assert recovery["records_written"] >= recovery_jobs
    assert recovery["recovered_jobs"] == recovery_jobs
    assert recovery["recovered_records"] >= recovery_jobs     # the log was read, not skipped
    assert set(recovery["recovery_s_by_shard"]) == {"0", "1"}
    assert 0 <= recovery["recovery_s_max"] < recovery["ready_s"]
    assert recovery["log_bytes"] > recovery_jobs * 100     # every payload is on disk


def assert_data_removed(stderr: str) -> None:
    dirs = DATA_LINE.findall(stderr)
    assert dirs, stderr[-3000:]
    for path in dirs:
        assert not os.path.exists(path), path
        assert not os.path.exists(os.path.dirname(path)), path


@pytest.mark.timeout(180)
def test_quick_bench_against_our_server(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--only", "ours", "--shards", "2",
                           "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for heading in ("(1) full job cycle", "(2) producer only", "(3) server CPU", "(4) memory",
                    "(5) durable", "durable targets", "targets", "command:", "machine:", "ours, 1 shard",
                    "ours, 2 shards", DURABLE_OURS):
        assert heading in text, f"{heading!r} missing from:\n{text}"
    assert "problems:" not in text, text
    # Section (5) comes after the in-memory sections, before their targets.
    assert text.index("(4) memory") < text.index("(5) durable") < text.index("targets (ours, 2 shards)")

    report = json.loads(out.read_text())
    results: Dict[str, Dict] = report["results"]
    for label in ("ours, 1 shard", "ours, 2 shards"):
        cycle, produce = results[label]["cycle"], results[label]["produce"]
        assert cycle["ops_per_s"] > 0 and cycle["errors"] == 0
        assert cycle["latency_us"]["p99"] > 0 and cycle["cycle_latency_us"]["p50"] > 0
        # With the direct path the router hands each connection to its shard and
        # hears of no job: its CPU per cycle may be nothing at all.
        assert cycle["cpu_us_per_cycle"]["router"] >= 0
        assert sum(v for k, v in cycle["cpu_us_per_cycle"].items() if k.startswith("shard")) > 0
        assert produce["ops_per_s"] > 0 and produce["errors"] == 0
    memory = results["ours, 2 shards"]["memory"]
    assert memory["jobs"] == 20000 and memory["errors"] == 0
    assert memory["rss_after"] > memory["rss_before"] > 0
    assert_durable_ours(results, 20000)
    verdicts = {t["what"]: t for t in report["durable_targets"]}
    assert verdicts["every queued job recovered"]["verdict"] == "met"
    assert verdicts["durable full cycle vs redis appendfsync always"]["measured"] == "-"   # not run
    assert [t["what"] for t in report["targets"]] == [
        "full cycle vs beanstalkd", "router + shard CPU per cycle", "bytes per queued job beyond payload",
        "p99 per request, full cycle"]
    assert report["durable_fsync_probe_us"]["p50"] > 0
    assert_all_gone(started_pids(proc.stderr))
    assert_data_removed(proc.stderr)


@pytest.mark.timeout(180)
@pytest.mark.skipif(not peers.installed(), reason="beanstalkd and redis-server are not unpacked under "
                    "loadtests/.peers (install-peers.sh needs the network); the test above covers ours")
def test_only_durable_against_the_peers(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--only-durable", "--shards", "2",
                           "--recovery-jobs", "5000", "--durable-dir", str(tmp_path), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "(5) durable" in text and "problems:" not in text, text
    for heading in ("(1) full job cycle", "(2) producer only", "(3) server CPU", "(4) memory",
                    "\ntargets (ours"):
        assert heading not in text, f"{heading!r} in an --only-durable run:\n{text}"
    report = json.loads(out.read_text())
    results = report["results"]
    assert set(results) == {DURABLE_OURS, DURABLE_QUIET, "beanstalkd -b -f 0", "redis appendfsync always"}
    assert_durable_ours(results, 5000)
    # Measured, with no figure asserted: beanstalkd -f 0 fsyncs each of the
    # 2,048 puts in flight in the producer run, which on a busy disk can
    # outlast the quick run and its grace (errors, or no batch in the window).
    for label in ("beanstalkd -b -f 0", "redis appendfsync always"):
        for key in ("cycle", "produce"):
            r = results[label][key]
            assert isinstance(r, dict), r
            assert r["total_ops"] > 0
        assert "recovery" not in results[label]
    # The peers were durable as asked, by their own account.
    assert results["beanstalkd -b -f 0"]["cycle"]["durability"]["binlog_records_written"] > 0
    redis = results["redis appendfsync always"]["produce"]["durability"]
    assert redis["appendfsync"] == "always" and redis["aof_current_size"] > 0
    ratios = {t["what"]: t["measured"] for t in report["durable_targets"]}
    assert ratios["durable full cycle vs redis appendfsync always"].endswith("x")
    assert ratios["durable full cycle vs beanstalkd -b -f 0"].endswith("x")
    assert report["durable_filesystem"]["type"] != "?"
    assert_all_gone(started_pids(proc.stderr))
    assert_data_removed(proc.stderr)
    assert os.listdir(tmp_path) == ["bench.json"]     # every durable data directory went


def test_durable_flags() -> None:
    quick = bench.parse_args(["--quick"])
    assert quick.recovery_jobs == 20_000 and not quick.only_durable and not quick.no_durable
    assert bench.parse_args([]).recovery_jobs == 1_000_000
    with pytest.raises(SystemExit):
        bench.parse_args(["--only-durable", "--no-durable"])
    assert bench.plan_durable(bench.parse_args(["--no-durable"])) == []
    labels = [label for label, _, _ in bench.plan_durable(bench.parse_args(["--only", "redis", "--shards", "3"]))]
    assert labels == ["redis appendfsync always"]
    labels = [label for label, _, _ in bench.plan_durable(bench.parse_args(["--shards", "3"]))]
    assert labels == ["ours, 3 shards, fsync always", "ours, 3 shards, fsync always, no history",
                      "beanstalkd -b -f 0", "redis appendfsync always"]


@pytest.mark.skipif(bench.filesystem_of("/dev/shm")[0] != "tmpfs", reason="no tmpfs at /dev/shm")
def test_durable_data_on_tmpfs_is_a_problem() -> None:
    opts = bench.parse_args(["--quick", "--only-durable", "--durable-dir", "/dev/shm"])
    report = bench.Report(opts, [], [(label, kind) for label, kind, _ in bench.plan_durable(opts)])
    assert any("tmpfs" in p and "--durable-dir" in p for p in report.problems())
    text = report.render()
    assert "(5) durable" in text and "(1) full job cycle" not in text and "problems:" in text


@pytest.mark.timeout(120)
def _ctrl_c_as_in_a_terminal() -> None:
    """The bench gets SIGINT as a terminal's user gives it: not blocked and
    not ignored, whatever the test process inherited from what ran before it
    in the same worker (a Python started with SIGINT ignored never raises
    KeyboardInterrupt)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_every_server(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, BENCH, "--quick", "--only", "ours", "--duration", "30"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
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
