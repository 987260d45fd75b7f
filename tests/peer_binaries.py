"""Programs the tests run from Debian's packages, unpacked under
``loadtests/.peers`` by ``loadtests/install-peers.sh`` (``make test`` runs
it; :func:`peer_binary` runs it too when a binary is missing): etcd,
stunnel. Nothing is installed on the system, so a test that needs one
fails, naming the package, where the script cannot fetch it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loadtests"))

import peers  # noqa: E402  (loadtests/peers.py: where the script unpacks, and the environment to run in)

peer_env = peers.peer_env


def peer_binary(name: str, package: str) -> str:
    """The path of ``usr/bin/<name>`` from Debian's ``package``, unpacked."""
    path = peers.peer_binary(name)
    if not os.path.exists(path):
        subprocess.run(["bash", peers.INSTALL_SCRIPT], check=False, env={**os.environ, "PEERS_DIR": peers.PEERS_DIR},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    if not os.path.exists(path):
        pytest.fail(f"{name} is not at {path}: loadtests/install-peers.sh could not fetch Debian's "
                    f"{package} (it needs apt and the Debian archive)")
    return path
