"""Servers under test that the bench starts itself: beanstalkd and redis-server.

Why private instances: the bench compares our server with its peers in one
run on one machine, so each peer gets a fresh process on a free loopback
port, in a temporary directory, and is always stopped again. By default in
memory only (beanstalkd without a binlog, Redis without RDB or AOF); with
``durable=True`` every acknowledged change is on disk first, as ours with
``--fsync always``: beanstalkd with a binlog fsynced on every write
(``-b DIR -f 0``), Redis with an append-only file fsynced before it answers
(``--appendonly yes --appendfsync always``). The peers'
Debian packages are fetched and unpacked under ``loadtests/.peers/`` by
``install-peers.sh`` when missing (nothing is installed on the system), and
run from there.

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
from typing import Callable, Dict, List, Optional, Tuple

HOST = "127.0.0.1"
HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL_SCRIPT = os.path.join(HERE, "install-peers.sh")
#: Where install-peers.sh unpacks the peers' packages (QS_PEERS_DIR overrides it).
PEERS_DIR = os.environ.get("QS_PEERS_DIR") or os.path.join(HERE, ".peers")
PEERS_ROOT = os.path.join(PEERS_DIR, "root")
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


def peer_binary(name: str) -> str:
    """The unpacked binary of peer ``name`` (beanstalkd, redis-server)."""
    return os.path.join(PEERS_ROOT, "usr", "bin", name)


def peer_env() -> Dict[str, str]:
    """The environment a peer runs in: its unpacked libraries found first."""
    tops = (os.path.join(PEERS_ROOT, "usr", "lib"), os.path.join(PEERS_ROOT, "lib"))
    libs = sorted({path for top in tops for path, _, files in os.walk(top)
                   if any(f.endswith(".so") or ".so." in f for f in files)})
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    return env


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

    def __init__(self, parent: Optional[str] = None) -> None:
        """``parent``: where the private temporary directory goes (default the system's)."""
        self.process: Optional[subprocess.Popen] = None
        self.port = 0
        self.version = ""
        self.tmp = tempfile.mkdtemp(prefix="qs-bench-", dir=parent)

    def start(self) -> "ServerUnderTest":
        raise NotImplementedError

    def pids(self) -> Dict[str, int]:
        """Role -> pid of every process whose CPU and memory count for this server."""
        assert self.process is not None
        return {self.protocol: self.process.pid}

    def _spawn(self, argv: List[str], log_name: str, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        log = open(os.path.join(self.tmp, log_name), "wb")
        try:
            # A session of its own: a Ctrl-C in the terminal reaches only the
            # bench, which then stops this server in order.
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=die_with_parent(), cwd=self.tmp, env=env)
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

    def durability(self) -> Dict[str, object]:
        """What the running server says about its persistence (for the report,
        and to refuse figures from a server that was not durable as asked)."""
        return {}


class Beanstalkd(ServerUnderTest):
    label = "beanstalkd"
    protocol = "beanstalkd"

    def __init__(self, durable: bool = False, parent: Optional[str] = None) -> None:
        """``durable``: a binlog in the temporary directory, fsynced after
        every write (``-b DIR -f 0``; beanstalkd(1): "A ms value of 0 will
        cause beanstalkd to call fsync every time it writes to the binlog")."""
        super().__init__(parent)
        self.durable = durable
        if durable:
            self.label = "beanstalkd -b -f 0"

    def start(self) -> "Beanstalkd":
        binary = peer_binary("beanstalkd")
        self.version = _version([binary, "-v"]).replace("beanstalkd", "").strip()
        self.port = free_port()
        argv = [binary, "-l", HOST, "-p", str(self.port)]
        if self.durable:
            binlog = os.path.join(self.tmp, "binlog")
            os.makedirs(binlog, exist_ok=True)
            argv += ["-b", binlog, "-f", "0"]
        # Without -b: jobs live in memory only, like ours and Redis here.
        process = self._spawn(argv, "beanstalkd.log", peer_env())
        wait_listening(self.port, process, "beanstalkd")
        return self

    def stats(self) -> Dict[str, str]:
        """The server's ``stats`` (a YAML mapping, read as flat key: value lines)."""
        def whole(buf: bytes) -> bool:   # "OK <bytes>\r\n<data>\r\n", or an error line
            first, crlf, rest = buf.partition(b"\r\n")
            return bool(crlf) and (not first.startswith(b"OK ") or len(rest) >= int(first[3:]) + 2)

        reply = _ask(self.port, b"stats\r\n", whole)
        first, _, rest = reply.partition(b"\r\n")
        if not first.startswith(b"OK "):
            raise RuntimeError(f"beanstalkd stats: {first[:100]!r}")
        text = rest[:int(first[3:])].decode()
        return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())
                if k.strip() and k.strip() != "---"}

    def durability(self) -> Dict[str, object]:
        if not self.durable:
            return {}
        stats = self.stats()
        written = int(stats.get("binlog-records-written", "0"))
        if written <= 0:
            raise RuntimeError(f"beanstalkd wrote no binlog records (-b {self.tmp}/binlog): not durable")
        return {"binlog_records_written": written, "binlog_max_size": int(stats.get("binlog-max-size", "0")),
                "options": "-b DIR -f 0"}


class Redis(ServerUnderTest):
    label = "redis"
    protocol = "redis"

    def __init__(self, durable: bool = False, parent: Optional[str] = None) -> None:
        """``durable``: an append-only file in the temporary directory, fsynced
        after every write before the replies go out (``--appendonly yes
        --appendfsync always``); no RDB snapshots either way."""
        super().__init__(parent)
        self.durable = durable
        if durable:
            self.label = "redis appendfsync always"

    def start(self) -> "Redis":
        binary = peer_binary("redis-server")
        version = _version([binary, "--version"])   # "Redis server v=7.0.15 sha=..."
        self.version = version.split("v=", 1)[1].split()[0] if "v=" in version else version
        self.port = free_port()
        aof = ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else ["--appendonly", "no"]
        argv = [binary, "--bind", HOST, "--port", str(self.port), "--save", ""] + aof + [
                "--daemonize", "no", "--protected-mode", "yes",
                "--dir", self.tmp, "--logfile", "", "--databases", "1"]
        process = self._spawn(argv, "redis.log", peer_env())
        wait_listening(self.port, process, "redis-server")
        return self

    def command(self, *parts: str) -> List[str]:
        """One command's reply: a bulk string's text, or an array of bulk strings' texts."""
        request = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p.encode()) for p in parts)
        reply = _ask(self.port, request, lambda buf: _resp_bulks(buf) is not None)
        bulks = _resp_bulks(reply)
        assert bulks is not None
        return bulks

    def durability(self) -> Dict[str, object]:
        if not self.durable:
            return {}
        info = dict(line.split(":", 1) for line in self.command("INFO", "persistence")[0].splitlines()
                    if ":" in line)
        fsync = self.command("CONFIG", "GET", "appendfsync")    # [name, value]
        policy = fsync[1] if len(fsync) == 2 else "?"
        if info.get("aof_enabled") != "1" or policy != "always":
            raise RuntimeError(f"redis is not durable as asked: aof_enabled={info.get('aof_enabled')}, "
                               f"appendfsync={policy}")
        return {"aof_enabled": 1, "appendfsync": policy, "aof_current_size": int(info.get("aof_current_size", 0)),
                "aof_rewrites": int(info.get("aof_rewrites", 0)),
                "aof_last_write_status": info.get("aof_last_write_status", "?")}


PEERS = {"beanstalkd": Beanstalkd, "redis": Redis}


def _version(argv: List[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=peer_env())
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


def _ask(port: int, request: bytes, whole: Callable[[bytes], bool], timeout: float = 10.0) -> bytes:
    """Send ``request`` on a fresh connection and read until ``whole(reply)``."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(request)
        buf = b""
        while not whole(buf):
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"the server closed the connection mid-reply: {buf[:200]!r}")
            buf += chunk
        return buf


def _resp_bulks(buf: bytes) -> Optional[List[str]]:
    """A whole RESP bulk string or array of bulk strings as texts; None while incomplete.
    An error reply raises."""
    def bulk(at: int) -> Optional[Tuple[str, int]]:
        end = buf.find(b"\r\n", at)
        if end < 0:
            return None
        if buf[at:at + 1] != b"$":
            raise RuntimeError(f"unexpected RESP reply {buf[:200]!r}")
        size = int(buf[at + 1:end])
        if size < 0:
            return "", end + 2
        if len(buf) < end + 2 + size + 2:
            return None
        return buf[end + 2:end + 2 + size].decode(), end + 2 + size + 2

    if buf[:1] == b"-" and buf.endswith(b"\r\n"):
        raise RuntimeError(f"redis: {buf.decode(errors='replace').strip()}")
    if buf[:1] != b"*":
        one = bulk(0)
        return None if one is None else [one[0]]
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    out, at = [], end + 2
    for _ in range(int(buf[1:end])):
        item = bulk(at)
        if item is None:
            return None
        out.append(item[0])
        at = item[1]
    return out


def _unpacked() -> bool:
    return all(os.access(peer_binary(name), os.X_OK) for name in ("beanstalkd", "redis-server"))


def installed() -> bool:
    """Whether both peers are unpacked under :data:`PEERS_DIR` already."""
    return _unpacked()


def ensure_installed() -> None:
    """Fetch and unpack the peers under :data:`PEERS_DIR` if they are not there yet."""
    if _unpacked():
        return
    subprocess.run(["bash", INSTALL_SCRIPT], check=True, env={**os.environ, "PEERS_DIR": PEERS_DIR})
    if not _unpacked():
        raise RuntimeError(f"beanstalkd/redis-server still missing under {PEERS_ROOT} after install-peers.sh")
