"""TLS and the access file together, through a real server: a TLS client
is the identity its certificate names (before any network rule matches its
address), a certificate no identity names is the identity of its source network, or
refused once its handshake is done if none, and the plain port beside the TLS one still goes by source network."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from tests.serverproc import ServerProcess
from tests.test_access_server import Client, workq_add
from tests.test_tls_server import PKI, tls_connect
from tests.wire import Wire, add, new_id, qname

ACL = """
[identities.alice]
certificates = ["alice.example"]     # a SAN of alice's certificate
produce = ["mine.*"]
consume = ["mine.*"]
inspect = ["mine.*"]

[identities.local]
networks = ["127.0.0.1/32"]
inspect = ["*"]
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    acl: Path = tmp_path_factory.mktemp("acl") / "access.toml"
    acl.write_text(ACL)
    with ServerProcess(shards=2, extra=[*pki.flags("workq"), "--acl", str(acl)]) as proc:
        yield proc


def test_a_tls_client_is_the_identity_its_certificate_names(server: ServerProcess, pki: PKI) -> None:
    mine, theirs = qname("mine."), qname("theirs.")
    with tls_connect(server, pki, "workq", pki.alice) as sock:   # from 127.0.0.1, yet alice, not local
        wire = Wire(sock)
        assert wire.call(add(new_id(), mine, b"x")) == b"+OK\r\n"
        assert wire.call(add(new_id(), theirs, b"x")) == \
            f"-CLIENT-ERROR Permission denied: alice may not produce queue {theirs}\r\n".encode()
        assert wire.call(b"lease " + mine.encode() + b" 0\r\n").startswith(b"+OK 1\r\n")   # still served


def test_a_certificate_no_identity_names_is_refused_after_its_handshake(server: ServerProcess, pki: PKI) -> None:
    raw = socket.socket()
    raw.bind(("127.0.0.3", 0))   # no network rule names this address either
    raw.settimeout(10)
    raw.connect((server.host, server.ports["workq_tls"]))
    with pki.context(pki.bob).wrap_socket(raw, server_hostname="localhost") as sock:   # bob's CA is trusted
        got = b""
        while not got.endswith(b"\r\n"):
            chunk = sock.recv(200)
            if not chunk:
                break
            got += chunk
        assert got == b"-SERVER-ERROR Unknown client: not allowed to connect\r\n"
        assert sock.recv(10) == b""   # and closed
    assert "(bob): no identity of" in server.log()


def test_a_certificate_no_identity_names_falls_back_to_its_network(server: ServerProcess, pki: PKI) -> None:
    queue = qname("mine.")
    with tls_connect(server, pki, "workq", pki.bob) as sock:   # from 127.0.0.1: local, who may only inspect
        assert Wire(sock).call(add(new_id(), queue, b"x")) == \
            f"-CLIENT-ERROR Permission denied: local may not produce queue {queue}\r\n".encode()


def test_the_plain_port_beside_goes_by_source_network(server: ServerProcess) -> None:
    local = Client(server, "workq", "127.0.0.1")
    try:
        queue = qname("mine.")
        assert workq_add(local, queue) == \
            f"-CLIENT-ERROR Permission denied: local may not produce queue {queue}\r\n".encode()
        assert local.ask(b"inspect queue " + queue.encode() + b"\r\n") == b"-NOT-FOUND\r\n"   # allowed: no such queue
    finally:
        local.close()
