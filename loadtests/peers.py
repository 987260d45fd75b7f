"""Servers under test that the bench starts itself: beanstalkd and redis-server.

Why private instances: the bench compares our server with its peers in one
run on one machine, so each peer gets a fresh process on a free loopback
port, in memory only (beanstalkd without a binlog, Redis without RDB or
AOF), in a temporary directory, and is always stopped again. The peers are
installed from Debian's packages by ``install-peers.sh`` when missing.

:class:`ServerUnderTest` is the shape the bench needs from every server,
ours included: a wire protocol and port, the pids whose CPU and memory to
read, and a ``stop`` that always works.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Callable, Dict, List, Optional

HOST = "127.0.0.1"
HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL_SCRIPT = os.path.join(HERE, "install-peers.sh")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A loopback port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that asks the kernel to signal the child if the bench dies.

    The bench stops its servers in ``finally`` blocks; this also covers a
    bench killed with SIGKILL, which runs no ``finally``.
    """
    def arm() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    return arm


def wait_listening(port: int, process: subprocess.Popen, what: str,
                   timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited early with status {process.returncode}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on {HOST}:{port} within {timeout:.0f} s")


class ServerUnderTest:
    """One server process tree started by the bench; a context manager that always stops it."""

    label = ""          # as printed in the table
    protocol = ""       # the load generator's protocol name

    def __init__(self) -> None:
        self.process: Optional[subprocess.Popen] = None
        self.port = 0
        self.version = ""
        self.tmp = tempfile.mkdtemp(prefix="qs-bench-")

    def start(self) -> "ServerUnderTest":
        raise NotImplementedError

    def pids(self) -> Dict[str, int]:
        """Role -> pid of every process whose CPU and memory count for this server."""
        assert self.process is not None
        return {self.protocol: self.process.pid}

    def _spawn(self, argv: List[str], log_name: str) -> subprocess.Popen:
        log = open(os.path.join(self.tmp, log_name), "wb")
        try:
            # A session of its own: a Ctrl-C in the terminal reaches only the
            # bench, which then stops this server in order.
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=die_with_parent(), cwd=self.tmp)
        finally:
            log.close()
        return self.process

    def log(self, log_name: str) -> str:
        try:
            with open(os.path.join(self.tmp, log_name), "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "ServerUnderTest":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


class Beanstalkd(ServerUnderTest):
    label = "beanstalkd"
    protocol = "beanstalkd"

    def start(self) -> "Beanstalkd":
        self.version = _version(["beanstalkd", "-v"]).replace("beanstalkd", "").strip()
        self.port = free_port()
        # No -b: jobs live in memory only, like ours and Redis here.
        process = self._spawn(["beanstalkd", "-l", HOST, "-p", str(self.port)], "beanstalkd.log")
        wait_listening(self.port, process, "beanstalkd")
        return self


class Redis(ServerUnderTest):
    label = "redis"
    protocol = "redis"

    def start(self) -> "Redis":
        version = _version(["redis-server", "--version"])   # "Redis server v=7.0.15 sha=..."
        self.version = version.split("v=", 1)[1].split()[0] if "v=" in version else version
        self.port = free_port()
        argv = ["redis-server", "--bind", HOST, "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
                "--dir", self.tmp, "--logfile", "", "--databases", "1"]
        process = self._spawn(argv, "redis.log")
        wait_listening(self.port, process, "redis-server")
        return self


PEERS = {"beanstalkd": Beanstalkd, "redis": Redis}


def _version(argv: List[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


def ensure_installed() -> None:
    """Install the peers from Debian packages if their binaries are missing."""
    if shutil.which("beanstalkd") and shutil.which("redis-server"):
        return
    subprocess.run(["bash", INSTALL_SCRIPT], check=True)
    if not (shutil.which("beanstalkd") and shutil.which("redis-server")):
        raise RuntimeError("beanstalkd/redis-server still missing after install-peers.sh")
