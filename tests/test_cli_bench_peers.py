"""``make bench``'s peers come from Debian packages unpacked under a local
directory and run from there; nothing is installed on the system."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "loadtests"))

import peers  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None or shutil.which("dpkg") is None,
                                reason="the peers come from Debian packages")


def _ask(port: int, request: bytes) -> bytes:
    with socket.create_connection((peers.HOST, port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(4096)


def _registered(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", package], capture_output=True, text=True)
    return out.stdout == "installed"


@pytest.mark.timeout(300)
def test_peers_are_unpacked_locally_and_run_from_there(tmp_path, monkeypatch):
    before = {name: _registered(name) for name in ("beanstalkd", "redis-server")}
    dest = tmp_path / "peers"
    result = subprocess.run(["bash", peers.INSTALL_SCRIPT], env={**os.environ, "PEERS_DIR": str(dest)},
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr
    root = dest / "root"
    for name in ("beanstalkd", "redis-server"):
        assert os.access(root / "usr" / "bin" / name, os.X_OK)
        assert os.path.realpath(root / "usr" / "bin" / name).startswith(str(root))
        assert _registered(name) == before[name]   # dpkg knows of no new package
    assert (dest / ".gitignore").read_text().splitlines()[-1] == "*"
    monkeypatch.setattr(peers, "PEERS_ROOT", str(root))
    with peers.Beanstalkd() as beanstalkd:
        assert beanstalkd.version
        assert _ask(beanstalkd.port, b"stats\r\n").startswith(b"OK ")
        exe = os.readlink(f"/proc/{beanstalkd.process.pid}/exe")
        assert exe.startswith(str(root))
    with peers.Redis() as redis:
        assert _ask(redis.port, b"PING\r\n") == b"+PONG\r\n"
        assert os.readlink(f"/proc/{redis.process.pid}/exe").startswith(str(root))
    # A second run finds them and does nothing.
    again = subprocess.run(["bash", peers.INSTALL_SCRIPT], env={**os.environ, "PEERS_DIR": str(dest)},
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stderr == ""
