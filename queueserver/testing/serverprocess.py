"""Run ``queueserver serve`` as a child process: for the tests, the bench and
the load test, which all need a real server started and stopped the same
careful way.

Every enabled listener binds port 0 and the supervisor reports the ports it
got in ``ports.json`` once every router serves, so runs on one machine never
collide and nobody guesses when the server is ready. The server gets a
private directory (its log, and its runtime directory unless one is given),
its own session (a terminal's Ctrl-C reaches only its owner, which stops it
in order) and dies with its owner. :meth:`ServerProcess.stop` always works:
SIGTERM, SIGKILL after a grace period, then SIGKILL for any router or shard
still there. :meth:`ServerProcess.kill` and :meth:`ServerProcess.restart` keep
the files, for tests of what a server finds when it starts again.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..protocols import DEFAULT_PORTS

HOST = "127.0.0.1"
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
LOG_TAIL_LINES = 40
PR_SET_PDEATHSIG = 1
#: The supervisor's line for every child it starts (logged at level info).
STARTED = re.compile(r" INFO (\S+) started \(pid (\d+)\)$", re.MULTILINE)


class ServerStartError(RuntimeError):
    """The server exited or was not ready in time; the message ends with its log's tail."""


class ServerProcess:
    """One ``queueserver serve`` process tree; a context manager that always stops it.

    The options are read at every :meth:`start`, so a test may change
    ``extra`` (say, add ``--data-dir``) between runs.
    """

    def __init__(self, shards: Optional[int] = 1, protocols: Optional[Iterable[str]] = None,
                 extra: Optional[Iterable[str]] = None, runtime_dir: Optional[str] = None,
                 log_level: str = "info", preexec: Optional[Callable[[], None]] = None,
                 startup_timeout: float = STARTUP_TIMEOUT, host: str = HOST) -> None:
        """``shards``: None lets the server choose. ``protocols``: the listeners to enable (default all), each on a port
        the kernel picks. ``extra``: more ``serve`` arguments, after ours.
        ``runtime_dir``: one the caller owns (it outlives :meth:`stop`); by
        default a private one removed with the server. ``log_level`` info or
        debug lets :meth:`child_pids` name the children. ``preexec`` runs in
        the server's process before it starts (e.g. to lower a resource limit)."""
        self.shards = shards
        self.host = host           # where its listeners are (a cluster node's own address)
        self.protocols = None if protocols is None else list(protocols)
        self.extra = list(extra or [])
        self.log_level = log_level
        self.preexec = preexec
        self.startup_timeout = startup_timeout
        self.runtime_dir = runtime_dir
        self._private_runtime_dir = runtime_dir is None
        self._home: Optional[str] = None     # private directory: the log, the default runtime dir
        self._run_offset = 0                 # where this run's lines start in the log
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.ports: Dict[str, int] = {}
        self.returncode: Optional[int] = None
        self._final_log: Optional[bytes] = None   # the log, kept when the directory goes

    # ------------------------------------------------------------ life cycle
    def argv(self) -> List[str]:
        """The command line that starts the server."""
        argv = [sys.executable, "-m", "queueserver", "serve",
                *(["--shards", str(self.shards)] if self.shards is not None else []),
                "--runtime-dir", str(self.runtime_dir), "--log-level", self.log_level]
        for name in DEFAULT_PORTS:
            enabled = self.protocols is None or name in self.protocols
            argv += [f"--{name}-port", "0"] if enabled else [f"--no-{name}"]
        # The metrics port too is the kernel's pick (ports.json names it), so
        # that servers of tests running at once never collide on the default.
        return argv + ["--metrics-port", "0"] + self.extra

    def start(self) -> "ServerProcess":
        """Start the server and wait until it serves; :class:`ServerStartError`
        (with everything stopped and removed) if it exits or a timeout passes."""
        if self.process is not None:
            raise RuntimeError("the server is already running")
        if self._home is None:
            self._home = tempfile.mkdtemp(prefix="qs-server-")
        if self._private_runtime_dir:
            self.runtime_dir = os.path.join(self._home, "rt")
        ports_file = os.path.join(str(self.runtime_dir), "ports.json")
        earlier = _file_identity(ports_file)   # an earlier run's, if it was killed
        self._final_log = None
        with open(self.log_path, "ab") as log:
            self._run_offset = log.tell()
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=self._before_exec)
        try:
            self.ports = self._await_ports(ports_file, earlier)
        except BaseException:
            self.stop()
            raise
        return self

    def _before_exec(self) -> None:
        _die_with_parent()
        if self.preexec is not None:
            self.preexec()

    def _await_ports(self, ports_file: str, earlier: Optional[Tuple[int, int]]) -> Dict[str, int]:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.process.poll() is not None:
                raise ServerStartError(f"the server exited with status {self.process.returncode} "
                                       f"before it was ready:\n{self.log_tail()}")
            current = _file_identity(ports_file)
            if current is not None and current != earlier:
                with open(ports_file) as f:
                    ports: Dict[str, int] = json.load(f)   # the supervisor's {listener: port}
                return ports
            if time.monotonic() > deadline:
                raise ServerStartError(f"the server was not ready within {self.startup_timeout:g} s:\n"
                                       f"{self.log_tail()}")
            time.sleep(0.02)

    def stop(self, timeout: float = STOP_TIMEOUT) -> Optional[int]:
        """Stop the server for good (SIGTERM; SIGKILL after ``timeout`` s; then
        any child left) and remove its private directory. The supervisor's
        exit status (0 after a clean shutdown); None if it never ran."""
        self._end(graceful=True, timeout=timeout)
        if self._home is not None:
            self._final_log = self._log_bytes()
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the supervisor and every child, as a crash would; the
        runtime directory and the log stay for the next :meth:`start`."""
        self._end(graceful=False)

    def restart(self, graceful: bool = True) -> "ServerProcess":
        """Stop (SIGTERM, or SIGKILL if not ``graceful``) and start again with
        the same directories and the current options."""
        self._end(graceful=graceful)
        return self.start()

    def _end(self, graceful: bool, timeout: float = STOP_TIMEOUT) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        children = _children(process.pid, self.child_pids().values())
        if process.poll() is None and graceful:
            process.send_signal(signal.SIGTERM)   # the supervisor stops routers, then shards
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        if process.poll() is None:
            children.update(_children(process.pid, self.child_pids().values()))  # restarted meanwhile
            process.kill()
            process.wait()
        for pid, started in children.items():    # never leave a child behind
            if _start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.returncode = process.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ looking at it
    @property
    def pid(self) -> int:
        """The supervisor's pid."""
        assert self.process is not None, "the server is not running"
        return self.process.pid

    @property
    def log_path(self) -> str:
        assert self._home is not None, "the server has not been started"
        return os.path.join(self._home, "server.log")

    def port(self, protocol: str = "workq") -> int:
        return self.ports[protocol]

    def connect(self, protocol: str = "workq", timeout: float = 10.0) -> socket.socket:
        """A TCP connection (no Nagle delay) to ``protocol``'s listener."""
        sock = socket.create_connection((self.host, self.port(protocol)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def log(self) -> str:
        """Everything the server wrote, every run (after :meth:`stop` too)."""
        return self._log_bytes().decode(errors="replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def _log_bytes(self, offset: int = 0) -> bytes:
        if self._final_log is not None:
            return self._final_log[offset:]
        if self._home is None:
            return b""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return b""

    def child_pids(self) -> Dict[str, int]:
        """Router and shard name (``router``, ``shard-0``, …) -> pid in this run,
        from the supervisor's "started" lines: a restarted child's newest pid."""
        text = self._log_bytes(self._run_offset).decode(errors="replace")
        return {name: int(pid) for name, pid in STARTED.findall(text)}

    def child_argv(self, name: str) -> List[str]:
        """The command line the supervisor gave child ``name``."""
        return [arg.decode() for arg in _read(f"/proc/{self.child_pids()[name]}/cmdline").split(b"\0")[:-1]]


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if its owner dies, which then runs no ``finally``."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _file_identity(path: str) -> Optional[Tuple[int, int]]:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _stat_fields(pid: int) -> List[str]:
    """``/proc/<pid>/stat`` after the command name; empty if the process is gone."""
    text = _read(f"/proc/{pid}/stat").decode(errors="replace")
    return text.rsplit(")", 1)[1].split() if ")" in text else []


def _start_time(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks since boot); None if it is gone or a zombie."""
    fields = _stat_fields(pid)
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


def _children(supervisor: int, logged: Iterable[int]) -> Dict[int, int]:
    """Pid -> start time of every router and shard alive now: the
    supervisor's children, and those its log names (an orphan's too). The
    start time tells a child from a later process given its pid."""
    found: Dict[int, int] = {}
    for pid in [*logged, *_children_of(supervisor)]:
        started = _start_time(pid)
        if started is not None and b"queueserver" in _read(f"/proc/{pid}/cmdline"):
            found[pid] = started
    return found


def _children_of(parent: int) -> List[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if len(fields) > 1 and fields[1] == str(parent):
                found.append(int(entry))
    return found
