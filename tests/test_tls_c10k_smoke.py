"""``loadtests/tls_c10k.py`` runs end to end, tiny: a crowd of idle TLS
connections (client certificates required) held beside the cycle load,
every one still answering at the end, the server stopped after.

Why: the C10K figures in docs/benchmarks.md come from this script, run
rarely and by hand; this proves its pieces fit. It never asserts timings
(this machine is shared), only what the run must hold: nothing refused."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C10K = os.path.join(REPO, "loadtests", "tls_c10k.py")


@pytest.mark.timeout(150)
def test_an_idle_tls_crowd_is_held_beside_the_load() -> None:
    proc = subprocess.run([sys.executable, C10K, "--idle", "120", "--holders", "2", "--duration", "0.5",
                           "--client-ca"], cwd=REPO, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "120 of 120 idle TLS connections opened" in out and "; 0 failed" in out
    assert "120 of 120 idle connections answered one request at the end" in out
    assert "server log: 0 refusal lines" in out and "nothing refused: yes" in out
    rows = re.findall(r"^(none|120 idle TLS)\s+(TLS|plain)\s+[\d,]+\s.*\s(\d+)$", out, re.MULTILINE)
    assert [(crowd, port) for crowd, port, _ in rows] == [
        ("none", "TLS"), ("none", "plain"), ("120 idle TLS", "TLS"), ("120 idle TLS", "plain")]
    assert all(errors == "0" for _, _, errors in rows)
    per_connection = re.search(r"([\d.]+) KiB per idle TLS connection", out)
    assert per_connection is not None and float(per_connection.group(1)) > 0
