"""The client ports are bound before anything slow: a client that connects
right after ``queueserver serve`` was started (as the original workq suite's
TestCmdLog does, 100 ms after exec) waits in the backlog while the server
imports, starts its shards and replays its logs, and is served once ready,
no request lost; a kill -9 and a restart on the same data too. Real
processes, real sockets."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from serverproc import wait_for
from wire import Wire, add, new_id, qname

ONLY_WORKQ = ["--no-takeanumber", "--no-goqueue", "--no-queued", "--no-taskflux"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stat(pid: int) -> list:
    """The fields of /proc/PID/stat after the command's name ([] if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _family(pid: int) -> list:
    """``pid`` and every process it started, and theirs."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else []
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


class Server:
    """``queueserver serve`` on fixed ports, started and stopped by the test."""

    def __init__(self, tmp_path, shards: int) -> None:
        self.port = free_port()
        self.runtime = tmp_path / "rt"
        self.argv = [sys.executable, "-m", "queueserver", "serve", "--shards", str(shards),
                     "--workq-port", str(self.port), "--metrics-port", "0", *ONLY_WORKQ,
                     "--data-dir", str(tmp_path / "data"), "--runtime-dir", str(self.runtime)]
        self.log = tmp_path / "server.log"
        self.proc = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log)

    def ready(self) -> bool:
        """Every router serves (the supervisor wrote ports.json)."""
        return (self.runtime / "ports.json").exists()

    def connect_at_once(self) -> socket.socket:
        """Connect as soon as the port listens (retrying every millisecond)."""
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return socket.create_connection(("127.0.0.1", self.port), timeout=30)
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "never listened"
                time.sleep(0.001)

    def kill9(self) -> None:
        """SIGKILL the supervisor and every router and shard at once (each in
        a process group of its own), and wait until they are all gone: a
        router still dying would hold the old listening socket."""
        family = _family(self.proc.pid)
        for pid in family:
            os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        wait_for(lambda: not any(_alive(pid) for pid in family), 10, "the killed processes to be gone")
        (self.runtime / "ports.json").unlink(missing_ok=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()


@pytest.mark.parametrize("shards", [1, 3])
def test_a_client_connecting_during_the_start_is_served_and_a_kill_9_replays(tmp_path, shards):
    server = Server(tmp_path, shards)
    try:
        server.start()
        sock = server.connect_at_once()
        assert not server.ready(), "the port listened only once the routers served"
        w = Wire(sock)
        q, ids = qname(), [new_id() for _ in range(20)]
        w.send(b"".join(add(id, q) for id in ids))   # sent while the server starts: none is lost
        assert [w.reply() for _ in ids] == [b"+OK\r\n"] * len(ids)
        w.close()

        server.kill9()
        server.start()
        sock = server.connect_at_once()
        assert not server.ready(), "the port listened only once the routers served"
        w = Wire(sock)
        w.send(f"inspect queue {q}\r\n".encode() + f"lease {q} 1000\r\n".encode())
        assert w.reply() == f"+OK 1\r\n{q} 2\r\nready-len {len(ids)}\r\nscheduled-len 0\r\n".encode()
        assert w.reply().startswith(f"+OK 1\r\n{ids[0]} {q} ".encode())   # replayed, in order
        w.close()
        wait_for(server.ready, 30, "the server to say it is ready")
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_a_port_in_use_is_refused_in_one_line_before_the_start(tmp_path):
    """The port is bound first, so a busy one stops the start at once, in one
    line, having made nothing (no runtime or data directory)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "queueserver", "serve", "--workq-port", str(port),
                                 *ONLY_WORKQ, "--metrics-port", "0", "--data-dir", str(tmp_path / "data"),
                                 "--runtime-dir", str(tmp_path / "rt")], capture_output=True, text=True,
                                timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"queueserver serve: error: cannot listen for workq on 127.0.0.1:{port}: address already in use "
        f"(another server running? pick another port with --workq-port)"]
    assert not (tmp_path / "data").exists() and not (tmp_path / "rt").exists()


def test_nothing_slow_is_loaded_before_the_ports_are_bound(tmp_path):
    """What runs before the bind decides how soon a client may connect: only
    the command line and the configuration, not the supervisor, gevent, the
    engine or the cluster code. (A busy port ends the start at the bind, so
    the modules it loaded are those loaded before it.)"""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", "queueserver", "serve",
                                 "--workq-port", str(busy.getsockname()[1]), *ONLY_WORKQ,
                                 "--metrics-port", "0"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "address already in use" in result.stderr
    loaded = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
              if line.startswith("import time:") and "|" in line}
    assert "queueserver.listening" in loaded
    slow = sorted(name for name in loaded if name.split(".")[0] in ("gevent", "msgpack", "sortedcontainers")
                  or name.startswith(("queueserver.supervisor", "queueserver.engine", "queueserver.cluster.",
                                      "queueserver.store", "queueserver.net")))
    assert slow == ["queueserver.cluster.arguments"], slow
