"""``queueserver --version``, the usage line, and ``queueserver worker`` as a
real process against a real server."""
from __future__ import annotations

import os
import re

import pytest

from queueserver import BUILD, __version__
from queueserver.client import Client
from serverproc import ServerProcess, one_line_error, run_cli
from wire import new_id, qname

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_version_and_usage():
    version = run_cli("--version")
    assert version.returncode == 0
    # the version, then what runs: compiled, or plain Python and why (this process decided alike)
    assert version.stdout == f"queueserver {__version__}\n{BUILD}\n"
    assert BUILD.startswith(("compiled (mypyc): ", "plain Python: "))
    usage = run_cli("--help")
    assert usage.stdout.startswith("usage: queueserver [-h] [--version] {serve,worker,history,cluster} ...\n")
    line = one_line_error(run_cli())
    assert line.startswith("queueserver: error: ") and "{serve,worker,history,cluster}" in line \
        and "--help" in line
    assert "invalid choice: 'srve'" in one_line_error(run_cli("srve"))


@pytest.mark.parametrize("spec, fragment", [
    ("no_such_module_here:run", "cannot import module 'no_such_module_here' for no_such_module_here:run"),
    ("worker_jobs:no_such_function", "module 'worker_jobs' has no function 'no_such_function'"),
    ("worker_jobs:time", "worker_jobs:time is not a function"),
    ("worker_jobs", "expected module:function"),
])
def test_worker_with_a_function_it_cannot_load_is_one_line(spec, fragment):
    line = one_line_error(run_cli("worker", spec, "--queue", "q", "--port", "1", cwd=TESTS))
    assert line.startswith("queueserver worker: error: ") and fragment in line


def _work(server: ServerProcess, function: str, queue: str):
    result = run_cli("worker", function, "--queue", queue, "--port", str(server.port()),
                     "--max-jobs", "1", "--wait-timeout", "200", cwd=TESTS)
    assert result.returncode == 0, result.stderr
    assert result.stderr.rstrip().endswith("stopped after 1 jobs")
    lines = [line for line in result.stderr.splitlines() if " job " in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_worker_process_logs_one_line_per_job():
    server = ServerProcess(protocols=["workq"]).start()
    try:
        good, bad = qname("shout"), qname("boom")
        ok, failing = new_id(), new_id()
        with Client("127.0.0.1", server.port()) as client:
            client.add(ok, good, b"hello", ttr=10000, ttl=60000)
            client.add(failing, bad, b"oops", ttr=10000, ttl=60000)
            line = _work(server, "worker_jobs:shout", good)
            assert re.search(rf" worker INFO queue {good} job {ok} completed in \d+\.\d ms$", line), line
            assert client.result(ok).result == b"HELLO"
            line = _work(server, "worker_jobs:boom", bad)
            assert re.search(rf" worker INFO queue {bad} job {failing} failed in \d+\.\d ms$", line), line
            failed = client.result(failing)
            assert not failed.success and b"ValueError" in failed.result
    finally:
        server.stop()
