"""Routers and shards live exactly as long as their supervisor, through real
processes: a ``kill -9`` of the supervisor leaves nothing behind (also in
the middle of start-up), a restart right after it serves on the same ports
and data directory, and a shard that stops while its timers are busy logs
no error."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import List

import pytest

from queueserver.placement import shard_for

from serverproc import ServerProcess, alive, wait_for
from wire import Wire, add, new_id, qname

ONLY_WORKQ = ["--no-takeanumber", "--no-goqueue", "--no-queued", "--no-taskflux"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes_mentioning(text: str) -> List[int]:
    """Pids of live processes whose command line contains ``text`` (a runtime
    directory: every router and shard of one server names it)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if text.encode() in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


def test_a_restart_right_after_kill_9_of_the_supervisor_serves(tmp_path):
    data, port, metrics = str(tmp_path / "data"), free_port(), free_port()
    fixed = ["--data-dir", data, "--workq-port", str(port), "--metrics-port", str(metrics), *ONLY_WORKQ]
    first = ServerProcess(shards=2, protocols=["workq"], extra=fixed).start()
    second = ServerProcess(shards=2, protocols=["workq"], extra=fixed)
    try:
        q, id = qname(), new_id()
        wire = Wire(first.connect())
        assert wire.call(add(id, q)) == b"+OK\r\n"
        wire.close()
        children = list(first.child_pids().values())
        assert len(children) == 3
        os.kill(first.pid, signal.SIGKILL)
        first.process.wait()
        second.start()            # at once: no wait for the old processes, no "address in use"
        assert second.port("workq") == port
        wire = Wire(second.connect())
        assert wire.call(f"lease {q} 0\r\n".encode()).startswith(f"+OK 1\r\n{id} {q} 4\r\n".encode())
        wire.close()
        assert not [pid for pid in children if alive(pid)]
    finally:
        first.stop()
        second.stop()


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8, 1.5])
def test_no_process_outlives_a_supervisor_killed_during_start_up(tmp_path, delay):
    """However early the supervisor dies (before, while or after its children
    start), they go with it at once: no port or log is left held."""
    runtime = str(tmp_path / "rt")
    argv = [sys.executable, "-m", "queueserver", "serve", "--runtime-dir", runtime, "--shards", "2",
            "--data-dir", str(tmp_path / "data"), "--workq-port", "0", "--metrics-port", "0", *ONLY_WORKQ]
    supervisor = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
    try:
        time.sleep(delay)
        supervisor.kill()
        supervisor.wait()
        wait_for(lambda: not processes_mentioning(runtime), 2.0,
                 lambda: f"the server's processes to exit: {processes_mentioning(runtime)} left")
    finally:
        for pid in processes_mentioning(runtime):
            os.kill(pid, signal.SIGKILL)


def test_a_shard_stopping_with_busy_timers_logs_no_error(tmp_path):
    """Jobs expiring every millisecond keep the shard's timer busy while it
    stops: the timer stops before the log closes, so nothing fails."""
    proc = ServerProcess(shards=1, protocols=["workq"], extra=["--data-dir", str(tmp_path / "data")]).start()
    try:
        wire = Wire(proc.connect())
        q = qname()
        burst = b"".join(add(new_id(), q, ttl=600 + i) for i in range(3000))
        wire.send(burst)
        for _ in range(3000):
            assert wire.reply() == b"+OK\r\n"
        wire.close()
        time.sleep(0.5)   # the first ones are expiring now
    finally:
        assert proc.stop() == 0
    log = proc.log()
    assert "shard 0 exiting" in log
    assert " ERROR " not in log and "Traceback" not in log, log


def test_a_clean_stop_says_nothing_alarming_and_a_killed_shard_still_does(tmp_path):
    """At SIGTERM the shards and routers stop together: no process logs a
    lost shard (a shard says it stops before it goes). A shard killed with
    SIGKILL is still reported as lost, once, by the others."""
    proc = ServerProcess(shards=3, extra=["--data-dir", str(tmp_path / "data")]).start()
    try:
        wire = Wire(proc.connect())
        for _ in range(30):   # jobs on every shard, their ids' homes asked across shards
            assert wire.call(add(new_id(), qname())) == b"+OK\r\n"
        before = len(proc.log())
        os.kill(proc.child_pids()["shard-1"], signal.SIGKILL)
        wait_for(lambda: "lost shard 1" in proc.log()[before:], 10, "the kill to be noticed")
        # the supervisor's restart is logged before the stop's part of the log begins (an
        # add to any queue could be answered by another shard before the restart)
        wait_for(lambda: "shard-1 exited with status -9" in proc.log()[before:], 10, "the restart")
        on_shard_1 = next(q for q in (qname() for _ in range(1000)) if shard_for(q, 3) == 1)
        wait_for(lambda: wire.call(add(new_id(), on_shard_1)) == b"+OK\r\n", 10, "the restarted shard")
        wire.close()
        stopping = len(proc.log())
    finally:
        assert proc.stop() == 0
    tail = proc.log()[stopping:]
    assert "received SIGTERM" in tail and "shard 2 exiting" in tail
    alarming = [line for line in tail.splitlines() if " WARNING " in line or " ERROR " in line]
    assert not alarming, "\n".join(alarming)
