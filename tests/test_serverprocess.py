"""The server starter the tests, the bench and the load test share: it
reports why a server did not start, leaves no process behind even when the
server does not stop on SIGTERM, and starts a server again on the same
runtime directory after a crash or a restart."""
from __future__ import annotations

import json
import os
import signal
from typing import Iterable

import pytest

from queueserver.testing.serverprocess import ServerProcess, ServerStartError
from serverproc import alive, wait_for
from wire import Wire, add, new_id


def assert_all_gone(pids: Iterable[int]) -> None:
    pids = list(pids)
    wait_for(lambda: not any(alive(pid) for pid in pids), 10, f"processes {pids} to end")


def serves(proc: ServerProcess) -> bool:
    w = Wire(proc.connect())
    try:
        return w.call(add(new_id(), "starter")) == b"+OK\r\n"
    finally:
        w.close()


def test_a_server_that_cannot_start_fails_with_its_log_and_leaves_nothing():
    proc = ServerProcess(protocols=["workq"], extra=["--max-payload", "bogus"])
    with pytest.raises(ServerStartError) as failure:
        proc.start()
    assert "exited with status 2 before it was ready" in str(failure.value)
    assert "argument --max-payload: invalid int value: 'bogus'" in str(failure.value)
    assert proc.process is None
    assert not os.path.exists(proc.runtime_dir)       # the private directory went too
    assert "invalid int value" in proc.log()           # the log is kept


def test_stop_kills_a_server_that_does_not_stop_and_leaves_none_of_its_processes():
    proc = ServerProcess(shards=2, protocols=["workq"]).start()
    children = proc.child_pids()
    assert set(children) == {"router", "shard-0", "shard-1"}
    supervisor = proc.pid
    try:
        # A stopped process does not obey SIGTERM: only SIGKILL ends it.
        for pid in [supervisor, *children.values()]:
            os.kill(pid, signal.SIGSTOP)
    finally:
        status = proc.stop(timeout=0.5)
    assert status == -signal.SIGKILL
    assert_all_gone([supervisor, *children.values()])


def test_after_a_crash_a_server_starts_again_on_the_same_runtime_directory(tmp_path):
    runtime_dir = str(tmp_path / "rt")
    proc = ServerProcess(protocols=["workq"], runtime_dir=runtime_dir).start()
    try:
        first = proc.child_pids()
        assert serves(proc)
        proc.kill()
        assert_all_gone(first.values())
        # A crashed server leaves its ports.json: the starter waits for the new one.
        assert os.path.exists(os.path.join(runtime_dir, "ports.json"))
        proc.start()
        second = proc.child_pids()
        assert set(second) == {"router", "shard-0"}
        assert not set(second.values()) & set(first.values())
        with open(os.path.join(runtime_dir, "ports.json")) as f:
            assert json.load(f) == proc.ports
        assert serves(proc)
        assert proc.log().count("router started (pid") == 2   # one log for both runs
    finally:
        assert proc.stop() == 0
    assert_all_gone(second.values())
    assert os.path.isdir(runtime_dir)                  # the caller's directory stays


def test_restart_applies_changed_options():
    proc = ServerProcess(protocols=["workq"]).start()
    try:
        before = proc.child_pids()
        proc.extra = ["--max-payload", "2048"]
        proc.restart()
        assert_all_gone(before.values())
        argv = proc.child_argv("router")
        router_config = json.loads(argv[argv.index("--config") + 1])
        assert router_config["options"]["workq"]["max_payload"] == 2048
        assert serves(proc)
    finally:
        assert proc.stop() == 0
