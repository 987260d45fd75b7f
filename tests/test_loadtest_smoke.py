"""The locust load test runs end to end (a tiny bounded run; no timings checked)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_make_loadtest_runs_a_bounded_headless_run(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "..", "loadtests", "loadtest.py"), "-u", "4", "-r", "4",
         "-t", "3s", "--shards", "2", "--csv", str(tmp_path / "smoke")],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout + result.stderr
    for command in ("add", "lease", "complete", "Aggregated"):
        assert command in summary
    assert (tmp_path / "smoke_stats.csv").exists()
