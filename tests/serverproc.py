"""Run ``queueserver serve`` as a real subprocess for integration tests.

Every listener binds port 0 and the router reports the ports it got in
``ports.json``, so two test runs on one machine never collide. The server is
always stopped (SIGTERM, then SIGKILL) by the test that started it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

STARTUP_TIMEOUT = 30.0
#: The suite runs twice: with the direct path (the default) and, with
#: QS_DIRECT_PATH=0, with every request forwarded through the router.
DIRECT_PATH = os.environ.get("QS_DIRECT_PATH", "1") != "0"


def poll(condition: Callable[[], object], timeout: float) -> bool:
    """Ask ``condition`` every 20 ms until it is true (True) or ``timeout``
    seconds have passed (False): for a wait whose thing may rightly not happen."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_for(condition: Callable[[], object], timeout: float = 10.0,
             what: Union[str, Callable[[], str]] = "condition") -> None:
    """Poll ``condition`` until it is true; fail the test after ``timeout`` seconds.
    ``what`` names the wait in the failure; a callable is asked only then
    (e.g. to add a server's log)."""
    if not poll(condition, timeout):
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for "
                             f"{what() if callable(what) else what}")


def replies_across_shard_restart(proc: "ServerProcess", shard: int, ask: Callable[[], bytes],
                                 normal: Callable[[bytes], bool], timeout: float = 20.0) -> List[bytes]:
    """SIGKILL ``shard-<shard>`` of ``proc``, then ``ask`` again and again
    until a reply is ``normal`` and the supervisor has started the shard
    anew: every reply, in order."""
    name = f"shard-{shard}"
    pid = proc.child_pids()[name]
    os.kill(pid, signal.SIGKILL)
    replies: List[bytes] = []

    def served_again() -> bool:
        replies.append(ask())
        return normal(replies[-1]) and proc.child_pids()[name] != pid

    wait_for(served_again, timeout, lambda: f"{name} to serve again:\n{proc.log()}")
    return replies


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if the test process dies, so none is left behind."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServerProcess:
    def __init__(self, shards: int = 1, extra: Optional[List[str]] = None,
                 protocols: Optional[List[str]] = None, runtime_dir: Optional[str] = None,
                 preexec: Optional[Callable[[], None]] = None) -> None:
        """``runtime_dir``: one the test owns (it outlives :meth:`stop`); by
        default a private one removed with the server. ``preexec`` runs in the
        server's process before it starts (e.g. to lower a resource limit)."""
        self.preexec = preexec
        self.shards = shards
        self.extra = extra or []
        self.protocols = protocols
        self.tmp = tempfile.TemporaryDirectory(prefix="qs-test-")
        self.runtime_dir = runtime_dir or os.path.join(self.tmp.name, "rt")
        self.log_path = os.path.join(self.tmp.name, "server.log")
        self.process: Optional[subprocess.Popen] = None
        self.ports: Dict[str, int] = {}
        self.final_log: Optional[str] = None

    def start(self) -> "ServerProcess":
        from queueserver.protocols import DEFAULT_PORTS
        argv = [sys.executable, "-m", "queueserver", "serve", "--shards", str(self.shards),
                "--runtime-dir", self.runtime_dir, "--log-level", "info"]
        for name in DEFAULT_PORTS:
            if self.protocols is None or name in self.protocols:
                argv += [f"--{name}-port", "0"]
            else:
                argv.append(f"--no-{name}")
        argv += self.extra
        if not DIRECT_PATH and not any("direct-path" in arg for arg in self.extra):
            argv.append("--no-direct-path")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=self._before_exec)
        ports_file = os.path.join(self.runtime_dir, "ports.json")
        poll(lambda: self.process.poll() is not None or os.path.exists(ports_file), STARTUP_TIMEOUT)
        if self.process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{self.log()}")
        if os.path.exists(ports_file):
            with open(ports_file) as f:
                self.ports = json.load(f)
            return self
        self.stop()
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def _before_exec(self) -> None:
        _die_with_parent()
        if self.preexec is not None:
            self.preexec()

    def port(self, protocol: str = "workq") -> int:
        return self.ports[protocol]

    def connect(self, protocol: str = "workq", timeout: float = 10.0) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port(protocol)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def log(self) -> str:
        if self.final_log is not None:
            return self.final_log
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def child_pids(self) -> Dict[str, int]:
        """Shard and router pids, read from the supervisor's log."""
        pids: Dict[str, int] = {}
        for line in self.log().splitlines():
            if " started (pid " in line:
                name = line.split(" INFO ")[1].split(" started")[0]
                pids[name] = int(line.rsplit("pid ", 1)[1].rstrip(")"))
        return pids

    def child_argv(self, name: str) -> List[str]:
        """The command line the supervisor gave child ``name`` (e.g. ``router``, ``shard-0``)."""
        with open(f"/proc/{self.child_pids()[name]}/cmdline", "rb") as f:
            return [arg.decode() for arg in f.read().split(b"\0")[:-1]]

    def stop(self, timeout: float = 15.0) -> int:
        process = self.process
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in self.child_pids().values():  # never leave a child behind
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self._log.close()
        self.final_log = self.log()
        self.tmp.cleanup()
        self.process = None
        return process.returncode


def run_cli(*args: str, timeout: float = 30, prefix: Sequence[str] = (),
            **kwargs: Any) -> subprocess.CompletedProcess:
    """``queueserver ARGS...`` as a real process (after ``prefix``, e.g. a
    privilege wrapper), its output captured as text."""
    return subprocess.run([*prefix, sys.executable, "-m", "queueserver", *args], capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def one_line_error(result: subprocess.CompletedProcess, status: int = 2) -> str:
    """The single stderr line of a command that must fail with ``status`` and no traceback."""
    err = result.stderr.strip()
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in err and "\n" not in err, err
    assert err, "no message on stderr"
    return err
