"""A plain-TCP workq client through a stunnel sidecar, against a server
whose workq port speaks TLS only and requires a client certificate.

The original client cannot be run here: the Go client (and the original
server's suite that drives it) is on no package registry that the project's
machines reach, and its suite is not ours to carry. So the client's side is
what it puts on the wire: the original workq server's smoke suite
(``TestSmoke``: run/lease/complete, schedule/lease, add/complete/result,
add/lease, add/fail/result, add/delete), each request byte for byte as the
Go client writes it, over the same two connections, sent in plain TCP to
Debian's stunnel, configured as docs/security.md tells (the page's own
section, addresses and files changed). Every answer must be the one the
original server gives; the server must see two TLS connections whose
certificate names the access file's identity, and refuse a queue outside
that identity's patterns in the identity's name."""
from __future__ import annotations

import http.client
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from stunnel_sidecar import StunnelClient
from tests.serverproc import ServerProcess, wait_for
from tests.test_tls_server import PKI
from tests.tls_certs import Issued
from tests.wire import Wire, add, new_id

#: docs/security.md's access file for the sidecar's client: its certificate's CN, nothing by address.
ACL = """
[identities.billing]
certificates = ["billing-worker"]
produce = ["ping*"]
consume = ["ping*"]
inspect = ["ping*"]
admin = ["ping*"]

[identities.scraper]                 # the test's own /metrics scrape, from 127.0.0.2
networks = ["127.0.0.2/32"]
inspect = ["*"]
"""
#: The Go client's optional flags, as the suite sets them (priority 10, 3 attempts, 1 fail).
FLAGS = "-priority=10 -max-attempts=3 -max-fails=1"
HANDSHAKE = re.compile(r"connection \d+: TLSv1\.[23] handshake done, names (.*)$")


def scrape(server: ServerProcess) -> str:
    """``/metrics`` as the scraper identity (from 127.0.0.2): with an access
    file, the HTTP port serves only identities that may inspect every queue."""
    connection = http.client.HTTPConnection(server.host, server.ports["metrics"], timeout=15,
                                            source_address=("127.0.0.2", 0))
    try:
        connection.request("GET", "/metrics")
        answer = connection.getresponse()
        assert answer.status == 200, answer.status
        return answer.read().decode()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def billing(pki: PKI) -> Issued:
    """The client's certificate, as docs/security.md issues it."""
    return pki.one.issue("billing-worker", sans="DNS:billing.internal")


@pytest.fixture
def server(pki: PKI, tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh server (the suite's queue names are fixed): workq over TLS only, a client CA, the access file."""
    acl = tmp_path / "access.toml"
    acl.write_text(ACL)
    with ServerProcess(shards=2, protocols=["workq"], log_level="debug",
                       extra=[*pki.flags("workq", mode="true"), "--acl", str(acl)]) as proc:
        assert "workq" not in proc.ports   # no plain port: TLS is the only way in
        yield proc


def sidecar(pki: PKI, server: ServerProcess, client: Issued, directory: Path) -> StunnelClient:
    return StunnelClient(directory, server.ports["workq_tls"], ca=pki.one.cert, server_name="localhost",
                         cert=client.cert, key=client.key)


def handshakes(server: ServerProcess) -> List[str]:
    """The certificate names of every TLS connection the server's log shows."""
    return [m.group(1) for m in map(HANDSHAKE.search, server.log().splitlines()) if m]


def job_block(id: str, second: str, body: bytes) -> bytes:
    """A one-job reply as the Go client parses it: ``+OK 1``, ``<id> <name|success> <size>``, the body."""
    return f"+OK 1\r\n{id} {second} {len(body)}\r\n".encode() + body + b"\r\n"


def the_original_smoke_suite(client: Wire, connect: Callable[[], Wire]) -> None:
    """The original workq server's TestSmoke, step by step: each request as
    the Go client writes it, each reply as the original server answers."""
    # Run,Lease,Complete: a worker on its own connection leases and completes what run waits for.
    id = new_id()
    client.send(f"run {id} ping-run 5000 60000 5 -priority=10\r\nPing!\r\n".encode())
    worker_failed: List[BaseException] = []

    def worker() -> None:
        try:
            w = connect()
            try:
                assert w.call(b"lease ping-run 1000\r\n") == job_block(id, "ping-run", b"Ping!")
                assert w.call(f"complete {id} 5\r\nPong!\r\n".encode()) == b"+OK\r\n"
            finally:
                w.close()
        except BaseException as exc:   # re-raised by the test's thread
            worker_failed.append(exc)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not worker_failed, worker_failed
    assert client.reply() == job_block(id, "1", b"Pong!")

    # Schedule,Lease: not before its time (whole seconds, 1 to 2 s away), then leased. Sent
    # half a second into a second, so that the job is due 1.5 s later: the 0.1 s lease is
    # answered well before, and the 1.9 s one half a second after it was due, margins on a
    # loaded machine either side (the bytes are the suite's).
    id = new_id()
    time.sleep((1.5 - time.time() % 1) % 1)
    at = (datetime.now(timezone.utc) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert client.call(f"schedule {id} ping-schedule 5000 60000 {at} 5 {FLAGS}\r\nPing!\r\n".encode()) == \
        b"+OK\r\n"
    assert client.call(b"lease ping-schedule 100\r\n") == b"-TIMEOUT\r\n"
    assert client.call(b"lease ping-schedule 1900\r\n") == job_block(id, "ping-schedule", b"Ping!")

    # Add,Complete,Result
    id = new_id()
    assert client.call(f"result {id} 1000\r\n".encode()) == b"-NOT-FOUND\r\n"
    assert client.call(add(id, "ping", b"Ping!", ttr=5000, ttl=60000, flags=FLAGS)) == b"+OK\r\n"
    assert client.call(f"complete {id} 5\r\nPong!\r\n".encode()) == b"+OK\r\n"
    assert client.call(f"result {id} 1000\r\n".encode()) == job_block(id, "1", b"Pong!")

    # Add,Lease
    assert client.call(b"lease ping1 ping2 ping3 100\r\n") == b"-TIMEOUT\r\n"
    id = new_id()
    assert client.call(add(id, "ping1", b"Ping!", ttr=5000, ttl=60000, flags=FLAGS)) == b"+OK\r\n"
    assert client.call(b"lease ping1 100\r\n") == job_block(id, "ping1", b"Ping!")

    # Add,Fail,Result
    id = new_id()
    assert client.call(add(id, "ping", b"Ping!", ttr=5000, ttl=60000, flags=FLAGS)) == b"+OK\r\n"
    assert client.call(f"fail {id} 12\r\nFailed-Pong!\r\n".encode()) == b"+OK\r\n"
    assert client.call(f"result {id} 1000\r\n".encode()) == job_block(id, "0", b"Failed-Pong!")

    # Add,Delete
    id = new_id()
    assert client.call(add(id, "ping", b"Ping!", ttr=5000, ttl=60000, flags=FLAGS)) == b"+OK\r\n"
    assert client.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"


def test_the_original_suite_through_stunnel_as_its_certificates_identity(
        pki: PKI, billing: Issued, server: ServerProcess, tmp_path: Path) -> None:
    with sidecar(pki, server, billing, tmp_path) as stunnel:
        client = Wire(stunnel.connect())
        try:
            the_original_smoke_suite(client, lambda: Wire(stunnel.connect()))
            # The identity travelled: a queue outside billing's patterns is refused in its name.
            assert client.call(add(new_id(), "orders", b"x")) == \
                b"-CLIENT-ERROR Permission denied: billing may not produce queue orders\r\n"
            assert client.call(b"inspect queue ping1\r\n").startswith(b"+OK 1\r\nping1 ")   # and still served
        finally:
            client.close()
        # Both of the suite's connections reached the server over TLS with the client's certificate.
        assert handshakes(server) == ["billing-worker, billing.internal"] * 2, server.log()
        # stunnel checked the server's certificate (chain and name) before it sent a byte.
        assert "Certificate accepted at depth=0: CN=queue-server" in stunnel.log(), stunnel.log()
    assert "refused: Permission denied: billing may not produce queue orders" in server.log()

    def refusals() -> List[str]:
        return re.findall(r'queueserver_access_refusals_total\{[^}]*identity="billing"[^}]*\} [0-9.e+]+',
                          scrape(server))
    wait_for(lambda: any('verb="produce"' in line and float(line.rsplit(" ", 1)[1]) == 1 for line in refusals()),
             timeout=10, what=lambda: str(refusals()))


def test_a_certificate_the_access_file_does_not_name_is_refused_through_stunnel(
        pki: PKI, server: ServerProcess, tmp_path: Path) -> None:
    """The same sidecar with alice's certificate (trusted, but no identity of
    the access file names her): the client's first read is the refusal."""
    with sidecar(pki, server, pki.alice, tmp_path) as stunnel:
        client = Wire(stunnel.connect())
        try:
            assert client.call(add(new_id(), "ping", b"Ping!")) == \
                b"-SERVER-ERROR Unknown client: not allowed to connect\r\n"
        finally:
            client.close()
    assert handshakes(server) == ["alice, alice.example, alice@example.com"]
    assert "(alice, alice.example, alice@example.com): no identity of" in server.log()
