"""``make bench-spark`` end to end: ``history_bench.py --quick``.

Why: the Spark bench is run rarely and by hand, so without this it would rot
silently. The quick run (200,000 events, 10,000 rows) proves the pieces fit:
the generated history is read by a full and an incremental run whose counts
match what was generated (the bench checks them and exits 1 on a mismatch),
and the DataFrame writer enqueues into a real server. No timing is asserted:
this machine is shared and noisy, and numbers belong in the bench's report.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "loadtests", "history_bench.py")
QUICK_EVENTS, QUICK_ROWS = 200_000, 10_000


@pytest.mark.timeout(420)
def test_quick_history_bench(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--dir", str(tmp_path),
                           "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    text = proc.stdout
    assert proc.returncode == 0, f"{text}\n--- stderr:\n{proc.stderr[-4000:]}"
    assert "problems:" not in text, text
    for heading in ("events/s", "rows/s", "full", "incremental (+10%)", "DataFrame writer",
                    "machine:", "command:"):
        assert heading in text, f"{heading!r} missing from:\n{text}"

    report = json.loads(out.read_text())
    assert report["problems"] == []
    full, incremental = report["runs"]
    assert (full["events"], incremental["events"]) == (QUICK_EVENTS, QUICK_EVENTS // 10)
    for run in (full, incremental):
        assert not run["failed"] and run["bytes"] > 0 and run["events_per_second"] > 0
        assert [what for what, _ in run["stages"]][:2] == ["listing", "reading"]
    assert incremental["bytes"] < full["bytes"]          # only the appended bytes were read
    new, again = report["writes"]
    assert (new["rows"], new["added"], new["duplicates"]) == (QUICK_ROWS, QUICK_ROWS, 0)
    assert (again["rows"], again["added"], again["duplicates"]) == (QUICK_ROWS, 0, QUICK_ROWS)
    assert new["rows_per_second"] > 0 and again["rows_per_second"] > 0
    assert os.listdir(tmp_path) == ["bench.json"]         # the generated history was removed


SMALL_BENCH = os.path.join(REPO, "loadtests", "history_small_bench.py")


def test_small_history_bench_splits_the_time_of_a_real_run(tmp_path) -> None:
    """``history_small_bench.py`` (Python engine only here: the engines' agreement is
    tests/test_history_engines.py's) runs the command as a process and splits its time."""
    out = tmp_path / "small.json"
    proc = subprocess.run([sys.executable, SMALL_BENCH, "--engines", "python", "--events", "3000",
                           "--dir", str(tmp_path), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n--- stderr:\n{proc.stderr[-4000:]}"
    for heading in ("wall s", "Spark start s", "work s", "python stages (s): listing", "machine:"):
        assert heading in proc.stdout, f"{heading!r} missing from:\n{proc.stdout}"
    [run] = json.loads(out.read_text())["runs"]
    assert run["engine"] == "python" and 0 < run["took"] <= run["wall"]
    assert [what for what, _ in run["stages"]][-1] == "writing report.html"
    assert "queueserver history: " in run["summary"] and "3,000 records" in run["summary"]
    assert os.listdir(tmp_path) == ["small.json"]         # the generated history was removed
