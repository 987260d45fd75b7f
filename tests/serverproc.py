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
from typing import Dict, List, Optional

STARTUP_TIMEOUT = 30.0


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if the test process dies, so none is left behind."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServerProcess:
    def __init__(self, shards: int = 1, extra: Optional[List[str]] = None,
                 protocols: Optional[List[str]] = None) -> None:
        self.shards = shards
        self.extra = extra or []
        self.protocols = protocols
        self.tmp = tempfile.TemporaryDirectory(prefix="qs-test-")
        self.runtime_dir = os.path.join(self.tmp.name, "rt")
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
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=_die_with_parent)
        ports_file = os.path.join(self.runtime_dir, "ports.json")
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            if os.path.exists(ports_file):
                with open(ports_file) as f:
                    self.ports = json.load(f)
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not start:\n{self.log()}")

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
