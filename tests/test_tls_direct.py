"""The direct path over TLS, through real processes and real TLS clients: a
router hands a TLS connection, unread, to a shard, which does the handshake,
admits the client and serves its queues with no router hop; a request that
shard cannot serve alone turns it into a relay of the plaintext (the router,
then the right shard, serve it), with every answer in order and the delivery
rules of a TCP connection kept: a lease whose records the client's kernel
never acknowledged comes back when it resets, one it read stays leased."""
from __future__ import annotations

import json
import re
import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Final, Iterator, List

import pytest

from queueserver.net.tls import TLSSession
from tests.serverproc import ServerProcess, http_get, wait_for
from tests.tls_certs import CA, Issued
from tests.wire import Wire, add, inspect_field, names_on_distinct_shards, new_id, qname, server_stat


class Certificates:
    def __init__(self, base: Path) -> None:
        self.ca = CA(base, "direct-ca")
        self.server: Issued = self.ca.issue("localhost", server=True)

    def flags(self) -> List[str]:
        return ["--tls-certificate", str(self.server.cert), "--tls-key", str(self.server.key),
                "--workq-tls", "both", "--workq-tls-port", "0"]

    def context(self, version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        context.maximum_version = version
        return context

    def connect(self, proc: ServerProcess, rcvbuf: int = 0,
                version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED) -> ssl.SSLSocket:
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(10)
        sock.connect((proc.host, proc.ports["workq_tls"]))
        return self.context(version).wrap_socket(sock, server_hostname="localhost")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("direct-pki"))


@pytest.fixture(scope="module")
def one_shard(certs: Certificates) -> Iterator[ServerProcess]:
    with ServerProcess(shards=1, protocols=["workq"], extra=certs.flags(), log_level="debug") as proc:
        yield proc


@pytest.fixture(scope="module")
def two_shards(certs: Certificates) -> Iterator[ServerProcess]:
    with ServerProcess(shards=2, protocols=["workq"], extra=certs.flags(), log_level="debug") as proc:
        yield proc


def executed_by(proc: ServerProcess, name: str) -> List[str]:
    """The processes (``router``, ``shard-0``, ...) that executed requests naming queue ``name``."""
    return re.findall(rf"^\S+ \S+ (\S+) DEBUG connection \d+: \w+ .*'{re.escape(name)}'", proc.log(), re.M)


def test_a_tls_connection_is_served_by_its_shard_with_no_router_hop(one_shard: ServerProcess,
                                                                    certs: Certificates) -> None:
    q = qname("tls-direct")
    with certs.connect(one_shard) as sock:
        w = Wire(sock)
        id = new_id()
        assert w.call(add(id, q, b"over tls")) == b"+OK\r\n"
        assert w.call(f"lease {q} 1000\r\n".encode()) == f"+OK 1\r\n{id} {q} 8\r\nover tls\r\n".encode()
        assert w.call(f"complete {id} 2\r\nok\r\n".encode()) == b"+OK\r\n"
        assert w.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 1 2\r\nok\r\n".encode()
    wait_for(lambda: len(executed_by(one_shard, q)) >= 2, 10, "the debug lines of the requests")
    assert set(executed_by(one_shard, q)) == {"shard-0"}, executed_by(one_shard, q)
    assert re.search(r"shard-0 DEBUG connection \d+: TLSv1\.[23] handshake done", one_shard.log())


def test_a_request_for_every_shard_relays_the_connection_and_all_is_answered(one_shard: ServerProcess,
                                                                              certs: Certificates) -> None:
    """``inspect server`` needs the router: the shard hands back the
    plaintext and relays it; the router then hands the connection on to the
    shard (a plain one now), and its answers still come over TLS, in order."""
    q = qname("tls-relay")
    with certs.connect(one_shard) as sock:
        w = Wire(sock)
        ids = [new_id() for _ in range(3)]
        stream = b"inspect server\r\n" + b"".join(add(id, q, f"p{i}".encode()) for i, id in enumerate(ids))
        stream += f"lease {q} 1000\r\n".encode() + b"inspect server\r\n" + f"inspect queue {q}\r\n".encode()
        w.send(stream)
        assert w.reply().startswith(b"+OK 1\r\n")
        assert [w.reply() for _ in ids] == [b"+OK\r\n"] * 3
        assert w.reply() == f"+OK 1\r\n{ids[0]} {q} 2\r\np0\r\n".encode()
        assert w.reply().startswith(b"+OK 1\r\n")
        assert w.reply() == f"+OK 1\r\n{q} 2\r\nready-len 2\r\nscheduled-len 0\r\n".encode()
        assert w.call(f"complete {ids[0]} 0\r\n\r\n".encode()) == b"+OK\r\n"
    log = one_shard.log()
    assert re.search(r"shard-0 DEBUG connection \d+ moves at inspect_server", log)   # the relay's start
    assert "router DEBUG connection" in log


def test_two_shards_serve_tls_connections_wherever_they_land(two_shards: ServerProcess,
                                                             certs: Certificates) -> None:
    """Connections are handed to the shards in turn: whichever shard did the
    handshake, requests for either shard's queue, pipelined, are answered
    once each and in order."""
    a, b = names_on_distinct_shards(2, 2)
    for round in range(4):
        with certs.connect(two_shards) as sock:
            w = Wire(sock)
            ids = [new_id() for _ in range(4)]
            w.send(b"".join(add(id, (a, b)[i % 2], f"r{round}-{i}".encode()) for i, id in enumerate(ids)))
            assert [w.reply() for _ in ids] == [b"+OK\r\n"] * 4
            for i, id in enumerate(ids):
                payload = f"r{round}-{i}".encode()
                queue = (a, b)[i % 2]
                assert w.call(f"lease {queue} 1000\r\n".encode()) == \
                    f"+OK 1\r\n{id} {queue} {len(payload)}\r\n".encode() + payload + b"\r\n"
                assert w.call(f"complete {id} 0\r\n\r\n".encode()) == b"+OK\r\n"
    log = two_shards.log()
    assert re.search(r"shard-0 DEBUG connection \d+: TLSv1\.[23] handshake done", log)
    assert re.search(r"shard-1 DEBUG connection \d+: TLSv1\.[23] handshake done", log)


#: TLS 1.2 sessions cannot move between processes: their connections are relayed
RELAYED: Final = ssl.TLSVersion.TLSv1_2
#: TLS 1.3 sessions move with their connections (:mod:`queueserver.net.tlscontinued`)
MOVED: Final = ssl.TLSVersion.TLSv1_3


def relayed_connection(proc: ServerProcess, certs: Certificates, rcvbuf: int = 0,
                       version: ssl.TLSVersion = RELAYED) -> ssl.SSLSocket:
    """A TLS connection that left the shard that did its handshake (a request
    for every shard came first): relayed by it over TLS 1.2, moved with its
    TLS over TLS 1.3."""
    sock = certs.connect(proc, rcvbuf, version)
    assert Wire(sock).call(b"inspect server\r\n").startswith(b"+OK 1\r\n")   # (nothing more is buffered)
    return sock


@pytest.mark.parametrize("version", [RELAYED, MOVED], ids=["relayed", "moved"])
def test_a_lease_over_a_relayed_connection_comes_back_when_its_client_resets_unread(
        one_shard: ServerProcess, certs: Certificates, version: ssl.TLSVersion) -> None:
    """The answer is bigger than what the client's kernel takes unread: its
    records are never all acknowledged, the relay (or the process it moved
    to, from its socket) says so, and the job goes back when the client
    resets. One read whole stays leased."""
    q = qname("relay-reset")
    plain = Wire(socket.create_connection((one_shard.host, one_shard.ports["workq"]), timeout=10))
    id = new_id()
    assert plain.call(add(id, q, b"k" * 262144)) == b"+OK\r\n"
    tls = relayed_connection(one_shard, certs, rcvbuf=4096, version=version)
    tls.sendall(f"lease {q} 5000\r\n".encode())
    wait_for(lambda: inspect_field(plain, id, "state") != b"0", 10, "the lease")
    time.sleep(0.2)
    assert inspect_field(plain, id, "state") != b"0"
    tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    tls.close()   # a reset, unread
    wait_for(lambda: inspect_field(plain, id, "state") == b"0", 10, "the job to come back")
    assert inspect_field(plain, id, "attempts") == b"0"
    # at once: the relay said the client reset (not after waiting as for a FIN)
    assert "were not acknowledged in" not in one_shard.log()
    tls = relayed_connection(one_shard, certs, version=version)
    reader = Wire(tls)
    assert reader.call(f"lease {q} 5000\r\n".encode()).endswith(b"k" * 1000 + b"\r\n")
    time.sleep(0.3)   # the client's kernel acknowledges what it read; the relay looks
    tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    tls.close()
    time.sleep(0.5)
    assert inspect_field(plain, id, "state") != b"0" and inspect_field(plain, id, "attempts") == b"1"
    plain.close()


@pytest.mark.parametrize("version", [RELAYED, MOVED], ids=["relayed", "moved"])
def test_a_relayed_connection_that_sends_its_fin_gets_every_answer_then_close_notify(
        one_shard: ServerProcess, certs: Certificates, version: ssl.TLSVersion) -> None:
    """A client that sends its requests, then its FIN, then reads: every
    answer comes over the relay, then TLS's close_notify and the end of the
    stream; the jobs it read stay leased."""
    q = qname("relay-fin")
    plain = Wire(socket.create_connection((one_shard.host, one_shard.ports["workq"]), timeout=10))
    ids = [new_id() for _ in range(5)]
    for id in ids:
        assert plain.call(add(id, q, b"x")) == b"+OK\r\n"
    raw = socket.create_connection((one_shard.host, one_shard.ports["workq_tls"]), timeout=10)
    session = TLSSession(certs.context(version), server_side=False, server_hostname="localhost")
    session.start()
    while not session.handshake_done:   # a sans-I/O client: TLS over a socket it can half-close
        raw.sendall(session.outgoing())
        session.receive(raw.recv(65536))
    raw.sendall(session.outgoing() + session.encrypt(b"inspect server\r\n" + f"lease {q} 5000\r\n".encode() * 5))
    raw.shutdown(socket.SHUT_WR)
    got = b""
    while not session.peer_closed:
        chunk = raw.recv(65536)
        if not chunk:
            break
        got += session.receive(chunk)
    assert session.peer_closed, got   # the close_notify came before the end of the stream
    assert raw.recv(10) == b""
    raw.close()
    assert got.startswith(b"+OK 1\r\n")
    assert got.count(f" {q} 1\r\nx\r\n".encode()) == 5, got
    time.sleep(0.3)
    assert all(inspect_field(plain, id, "state") != b"0" for id in ids)
    plain.close()


def test_status_and_metrics_count_the_relays(one_shard: ServerProcess, certs: Certificates) -> None:
    def relays() -> int:
        shards = json.loads(http_get(one_shard, "/status"))["shards"]
        return int(shards[0]["tls_relays"])
    wait_for(lambda: relays() == 0, 10, "earlier tests' relays to end")
    with relayed_connection(one_shard, certs):
        wait_for(lambda: relays() == 1, 10, "the relay to be counted")
        assert re.search(rb'^queueserver_tls_relays\{node="[^"]*",shard="0"\} 1\.0$', http_get(one_shard, "/metrics"),
                         re.M)
    wait_for(lambda: relays() == 0, 10, "the relay to end with its client")


def test_without_the_direct_path_the_router_terminates_tls(certs: Certificates) -> None:
    with ServerProcess(shards=2, protocols=["workq"], extra=[*certs.flags(), "--no-direct-path"],
                       log_level="debug") as proc:
        a, b = names_on_distinct_shards(2, 2)
        with certs.connect(proc) as sock:
            w = Wire(sock)
            for queue in (a, b):
                id = new_id()
                assert w.call(add(id, queue, b"r")) == b"+OK\r\n"
                assert w.call(f"lease {queue} 1000\r\n".encode()) == f"+OK 1\r\n{id} {queue} 1\r\nr\r\n".encode()
                assert w.call(f"complete {id} 0\r\n\r\n".encode()) == b"+OK\r\n"
        wait_for(lambda: executed_by(proc, a) and executed_by(proc, b), 10, "the debug lines")
        assert set(executed_by(proc, a) + executed_by(proc, b)) == {"router"}
        assert re.search(r"router DEBUG connection \d+: TLSv1\.[23] handshake done", proc.log())


def test_a_relayed_connection_keeps_the_identity_its_shard_gave_it(certs: Certificates, tmp_path: Path) -> None:
    """Admitted by the shard after its handshake (by its address here: no
    client certificate), the client is the same identity wherever its
    requests go once relayed: refused where it may not produce, still served."""
    acl = tmp_path / "access.toml"
    acl.write_text('[identities.local]\nnetworks = ["127.0.0.1/32"]\nproduce = ["mine.*"]\nconsume = ["mine.*"]\n'
                   'inspect = ["*"]\n')
    with ServerProcess(shards=1, protocols=["workq"], extra=[*certs.flags(), "--acl", str(acl)],
                       log_level="debug") as proc:
        mine, theirs = qname("mine."), qname("theirs.")
        with relayed_connection(proc, certs) as sock:
            w = Wire(sock)
            id = new_id()
            assert w.call(add(id, mine, b"m")) == b"+OK\r\n"
            assert w.call(add(new_id(), theirs, b"t")) == \
                f"-CLIENT-ERROR Permission denied: local may not produce queue {theirs}\r\n".encode()
            assert w.call(f"lease {mine} 1000\r\n".encode()) == f"+OK 1\r\n{id} {mine} 1\r\nm\r\n".encode()
        assert re.search(r"shard-0 DEBUG connection \d+ moves at inspect_server", proc.log())


def _few_descriptors() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))


def test_out_of_descriptors_a_connection_to_relay_is_closed_and_counted_out(certs: Certificates) -> None:
    """With descriptors for a few relays only, 220 TLS connections all ask
    for a relay at once: each is answered or closed at once (none left
    unserved), the log says so in a few lines, and once they are gone the
    server counts none of them as a client any more."""
    with ServerProcess(shards=1, protocols=["workq"], extra=certs.flags(), preexec=_few_descriptors) as proc:
        counter = Wire(socket.create_connection((proc.host, proc.ports["workq"]), timeout=10))
        socks = [certs.connect(proc, version=RELAYED) for _ in range(220)]
        for sock in socks:
            sock.sendall(b"inspect server\r\n")
        answered = closed = 0
        for sock in socks:
            try:
                got = sock.recv(100)
            except (ssl.SSLError, ConnectionError):
                got = b""
            if got.startswith(b"+OK 1\r\n"):
                answered += 1
            else:
                assert got == b"", got
                closed += 1
        assert answered > 0 and closed > 0, (answered, closed)   # (else the limit did not bite)
        for sock in socks:
            sock.close()
        assert len(re.findall(r"relaying a TLS connection failed|handing a TLS connection back failed",
                              proc.log())) <= 10
        wait_for(lambda: server_stat(counter, "active-clients") == 1, 10,
                 lambda: f"the clients to be counted out: {server_stat(counter, 'active-clients')} active")
        counter.close()
