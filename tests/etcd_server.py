"""A real etcd for the tests: Debian's etcd-server package, unpacked under
``loadtests/.peers`` by ``loadtests/install-peers.sh`` (``make test`` runs it;
:mod:`peer_binaries` runs it too when the binary is missing), started on free
loopback ports with its own data directory and stopped by the test."""
from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest

from peer_binaries import peer_binary


def etcd_binary() -> str:
    return peer_binary("etcd", "etcd-server")


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EtcdServer:
    """One etcd member on loopback; ``endpoint`` is its client URL."""

    def __init__(self, directory: Path, name: str = "default", options: Sequence[str] = ()) -> None:
        """``options``: more of etcd's flags (e.g. ``--auth-token-ttl 2``)."""
        self.directory = directory
        self.name = name
        self.options = list(options)
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        self.peer = f"http://127.0.0.1:{self.peer_port}"
        self.process: Optional[subprocess.Popen] = None
        self.log_path = directory / f"etcd-{name}.log"
        #: the members of its etcd cluster, itself included (one: itself)
        self.members: List["EtcdServer"] = [self]

    def argv(self) -> List[str]:
        cluster = ",".join(f"{m.name}={m.peer}" for m in self.members)
        return [etcd_binary(), "--name", self.name, "--data-dir", str(self.directory / f"etcd-{self.name}"),
                "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                "--listen-peer-urls", self.peer, "--initial-advertise-peer-urls", self.peer,
                "--initial-cluster", cluster, "--initial-cluster-token", f"qs-{self.directory.name}",
                "--log-level", "warn", *self.options]

    def start(self, timeout: float = 20.0, wait: bool = True) -> "EtcdServer":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        if not wait:   # a member of several: healthy only once a quorum runs
            return self
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as answer:
                    if b'"true"' in answer.read():
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"etcd did not become healthy in {timeout} s: {self.log_path.read_text()[-2000:]}")

    def start_wait(self, timeout: float = 30.0) -> None:
        """Until the member answers healthy (a cluster's: once a quorum runs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as answer:
                    if b'"true"' in answer.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"etcd member {self.name} is not healthy: {self.log_path.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def wipe(self) -> None:
        """Its data gone (a member rebuilt from nothing): stop it first."""
        shutil.rmtree(self.directory / f"etcd-{self.name}", ignore_errors=True)


@pytest.fixture
def etcd(tmp_path: Path):   # type: ignore[no-untyped-def]
    server = EtcdServer(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()


def etcd_cluster(directory: Path, size: int = 3) -> List[EtcdServer]:
    """``size`` etcd members forming one cluster, started and healthy."""
    members = [EtcdServer(directory, f"m{i}") for i in range(size)]
    for member in members:
        member.members = members
    for member in members:
        member.start(wait=False)
    for member in members:
        member.start_wait()
    return members


def gateway(server: EtcdServer, path: str, body: Dict[str, Any], token: Optional[str] = None) -> Dict[str, Any]:
    """One request to ``server``'s v3 JSON gateway (``path`` after ``/v3``), as
    etcdctl would make it; its answer, or HTTPError (its body: etcd's reason)."""
    request = urllib.request.Request(server.endpoint + "/v3" + path, json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": token} if token else {})
    with urllib.request.urlopen(request, timeout=5) as answer:
        result: Dict[str, Any] = json.loads(answer.read())
        return result


def enable_auth(server: EtcdServer, user: str, password: str, prefix: str) -> str:
    """Turn authentication on in ``server`` as an operator would: a root user
    (etcd 3.4 wants one first), and ``user`` with a role that may read and
    write the keys under ``prefix``; root's password."""
    root = secrets.token_hex(8)

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)   # the range of every key starting with prefix
    for path, body in [("/auth/user/add", {"name": "root", "password": root}),
                       ("/auth/user/grant", {"user": "root", "role": "root"}),
                       ("/auth/user/add", {"name": user, "password": password}),
                       ("/auth/role/add", {"name": f"{user}-rw"}),
                       ("/auth/role/grant", {"name": f"{user}-rw", "perm": {
                           "permType": "READWRITE", "key": b64(prefix), "range_end": b64(end)}}),
                       ("/auth/user/grant", {"user": user, "role": f"{user}-rw"}),
                       ("/auth/enable", {})]:
        gateway(server, path, body)
    return root


def root_token(server: EtcdServer, root_password: str) -> str:
    """A token of etcd's root user (to act on the cluster's keys behind its back)."""
    return str(gateway(server, "/auth/authenticate", {"name": "root", "password": root_password})["token"])
