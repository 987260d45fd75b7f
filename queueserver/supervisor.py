"""The supervisor: binds the client ports, starts the shard and router
processes, restarts any that dies, and stops them all on SIGTERM/SIGINT.

It runs no event loop and touches no client traffic. It owns the listening
sockets and hands them to every router, so several routers share the ports
(the kernel gives each new connection to one of them) and a restarted router
serves the very same ports. Routers and shards talk over Unix sockets in a
private runtime directory (mode 0700, sockets 0600).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from .config import Config

log = logging.getLogger("queueserver.supervisor")

STOP_GRACE = 5.0
MAX_BACKOFF = 5.0


class Child:
    """One supervised process and its restart bookkeeping."""

    def __init__(self, name: str, argv: List[str], pass_fds: tuple = ()) -> None:
        self.name = name
        self.argv = argv
        self.pass_fds = pass_fds
        self.process: Optional[subprocess.Popen] = None
        self.backoff = 0.1
        self.restart_at = 0.0
        self.started_at = 0.0

    def start(self) -> None:
        # Its own process group: a terminal's Ctrl-C reaches only the
        # supervisor, which then stops the children in order.
        self.process = subprocess.Popen(self.argv, process_group=0, pass_fds=self.pass_fds)
        self.started_at = time.monotonic()
        log.info("%s started (pid %d)", self.name, self.process.pid)


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.children: List[Child] = []
        self._stopping = False
        self._own_dir = False
        self.runtime_dir = ""
        self.listeners: Dict[str, socket.socket] = {}

    def _prepare_runtime_dir(self) -> str:
        if self.config.runtime_dir:
            path = self.config.runtime_dir
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.chmod(path, 0o700)
        else:
            path = tempfile.mkdtemp(prefix="queueserver-")  # created 0700
            self._own_dir = True
        for name in os.listdir(path):  # readiness of an earlier run means nothing now
            if name.endswith(".ready") or name == "ports.json":
                os.unlink(os.path.join(path, name))
        return path

    def _children(self) -> List[Child]:
        config = self.config
        python = sys.executable
        level = config.log_level
        sockets = [os.path.join(self.runtime_dir, f"shard-{i}.sock") for i in range(config.shards)]
        children = [Child(f"shard-{i}", [python, "-m", "queueserver.server.shard", "--index", str(i),
                                         "--socket", path, "--log-level", level])
                    for i, path in enumerate(sockets)]
        fds = {name: sock.fileno() for name, sock in self.listeners.items()}
        for i in range(config.routers):
            router_config = {
                "sockets": sockets,
                "listen_fds": fds,
                "options": {name: l.options for name, l in config.listeners.items()},
                "index": i,
                "routers": config.routers,
                "ready_file": os.path.join(self.runtime_dir, f"router-{i}.ready"),
            }
            name = "router" if config.routers == 1 else f"router-{i}"
            children.append(Child(name, [python, "-m", "queueserver.server.router",
                                         "--config", json.dumps(router_config), "--log-level", level],
                                  pass_fds=tuple(fds.values())))
        return children

    def _bind(self) -> None:
        """Bind and listen on every enabled protocol's port."""
        for name, listener in self.config.listeners.items():
            if not listener.enabled:
                continue
            host = listener.bind or self.config.bind
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, listener.port))
            sock.listen(1024)
            sock.set_inheritable(True)
            self.listeners[name] = sock
            log.info("%s listening on %s:%d", name, host, sock.getsockname()[1])

    def _write_ports(self) -> None:
        """``ports.json``, once every router serves: the port each protocol got
        (useful with port 0), and a sign that the server is ready."""
        ports = {name: sock.getsockname()[1] for name, sock in self.listeners.items()}
        path = os.path.join(self.runtime_dir, "ports.json")
        with open(path + ".tmp", "w") as f:
            json.dump(ports, f)
        os.replace(path + ".tmp", path)

    def run(self) -> int:
        self.runtime_dir = self._prepare_runtime_dir()
        log.info("runtime directory %s, %d shards", self.runtime_dir, self.config.shards)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self._bind()
            self.children = self._children()
            for child in self.children:
                child.start()
            ready = [os.path.join(self.runtime_dir, f"router-{i}.ready") for i in range(self.config.routers)]
            published = False
            while not self._stopping:
                self._watch()
                if not published and all(os.path.exists(path) for path in ready):
                    self._write_ports()  # every router serves: clients may come
                    published = True
                time.sleep(0.05)
        finally:
            self._stop_all()
            for sock in self.listeners.values():
                sock.close()
            if self._own_dir:
                shutil.rmtree(self.runtime_dir, ignore_errors=True)
        log.info("stopped")
        return 0

    def _on_signal(self, signum, frame) -> None:
        if not self._stopping:
            log.info("received %s, shutting down", signal.Signals(signum).name)
        self._stopping = True

    def _watch(self) -> None:
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if process is not None and process.poll() is not None:
                log.warning("%s exited with status %s; restarting", child.name, process.returncode)
                child.process = None
                if now - child.started_at > 10:
                    child.backoff = 0.1   # it ran a good while: restart at once
                child.restart_at = now + child.backoff
                child.backoff = min(child.backoff * 2, MAX_BACKOFF)
            if child.process is None and now >= child.restart_at and not self._stopping:
                child.start()

    def _stop_all(self) -> None:
        """Routers first (no new requests reach a stopping shard), then shards."""
        routers = [c for c in self.children if c.name.startswith("router")]
        shards = [c for c in self.children if not c.name.startswith("router")]
        deadline = time.monotonic() + STOP_GRACE
        for group in (routers, shards):
            for child in group:
                if child.process is not None and child.process.poll() is None:
                    child.process.terminate()
            for child in group:
                self._reap(child, deadline)

    @staticmethod
    def _reap(child: Child, deadline: float) -> None:
        process = child.process
        if process is None:
            return
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", child.name)
            process.kill()
            process.wait()
        log.info("%s exited with status %s", child.name, process.returncode)
