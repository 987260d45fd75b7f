"""TLS on the client ports, through real server processes and real TLS
clients (Python's ``ssl``, ``openssl s_client``): every protocol over TLS
beside its plain port, client certificates checked against the client CA,
each wrong client refused with one log line, handshakes bounded by their
timeout, and the delivery rules kept over TLS (wire bytes counted)."""
from __future__ import annotations

import base64
import os
import re
import select
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

from tests.serverproc import ServerProcess, one_line_error, poll, run_cli, wait_for
from tests.test_binary_protocols_server import (ENQUEUED, FluxWire, GoWire, g_delete, g_reserve, reserved_fields,
                                                t_dequeue, t_enqueue, t_record)
from tests.test_text_protocols_server import TextWire, added_id
from queueserver.net.refusals import BURST
from queueserver.protocols import codec_class
from queueserver.net.tls import TLSSession
from tests.tls_certs import CA, Issued
from tests.wire import Wire, add, inspect_field, new_id, qname

PROTOCOLS = ("workq", "takeanumber", "goqueue", "queued", "taskflux")
HANDSHAKE_TIMEOUT = 1.0


class PKI:
    """Two CAs (the client CA file trusts both), the server's certificate,
    and client certificates: good ones of each CA, one of a stranger CA,
    an expired one."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.one = CA(base, "clients-one")
        self.two = CA(base, "clients-two")
        self.stranger = CA(base, "stranger")
        self.server = self.one.issue("queue-server", server=True)
        self.alice = self.one.issue("alice", sans="DNS:alice.example,email:alice@example.com")
        self.bob = self.two.issue("bob")
        self.mallory = self.stranger.issue("mallory")
        self.expired = self.one.issue_expired("old-alice")
        self.client_ca = base / "client-ca.pem"
        self.trust(self.one, self.two)

    def trust(self, *cas: CA) -> None:
        """Write the client CA file: these CAs' certificates."""
        self.client_ca.write_text("".join(ca.cert.read_text() for ca in cas))

    def flags(self, *listeners: str, mode: str = "both") -> List[str]:
        flags = ["--tls-certificate", str(self.server.cert), "--tls-key", str(self.server.key),
                 "--tls-client-ca", str(self.client_ca), "--tls-handshake-timeout", str(HANDSHAKE_TIMEOUT)]
        for name in listeners:
            flags += [f"--{name}-tls", mode] + ([f"--{name}-tls-port", "0"] if mode == "both" else [])
        return flags

    def context(self, client: Optional[Issued]) -> ssl.SSLContext:
        """A client's context: trusts the server's CA, presents ``client``'s certificate."""
        context = ssl.create_default_context(cafile=str(self.one.cert))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(pki: PKI) -> Iterator[ServerProcess]:
    with ServerProcess(shards=2, extra=pki.flags(*PROTOCOLS)) as proc:
        yield proc


def tls_connect(proc: ServerProcess, pki: PKI, protocol: str, client: Optional[Issued] = None,
                **wrap: object) -> ssl.SSLSocket:
    """A TLS connection to ``protocol``'s TLS port, handshake done (as ``client``: alice by default)."""
    sock = socket.create_connection((proc.host, proc.ports[f"{protocol}_tls"]), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return pki.context(pki.alice if client is None else client).wrap_socket(
        sock, server_hostname="localhost", **wrap)   # type: ignore[arg-type]


def handshake_refused(proc: ServerProcess, pki: PKI, client: Optional[Issued], protocol: str = "workq") -> str:
    """How a TLS client whose handshake the server refuses learns of it."""
    try:
        with tls_connect(proc, pki, protocol, client) as sock:
            # TLS 1.3: the client's certificate is judged after its side is done: the alert comes on read
            sock.sendall(b"inspect server\r\n")
            got = sock.recv(100)
    except (ssl.SSLError, ConnectionError) as exc:
        return str(exc)
    raise AssertionError(f"the server answered a client it should refuse: {got!r}")


def log_lines(proc: ServerProcess, pattern: str) -> List[str]:
    return [line for line in proc.log().splitlines() if re.search(pattern, line)]


# ------------------------------------------------------------ every protocol
def test_ports_file_names_the_tls_ports(server: ServerProcess) -> None:
    for protocol in PROTOCOLS:
        assert server.ports[protocol] != server.ports[f"{protocol}_tls"]
    assert all(f"serving {protocol} over TLS on" in server.log() for protocol in PROTOCOLS)


def test_workq_over_tls_then_taken_plain(server: ServerProcess, pki: PKI) -> None:
    q = qname()
    with tls_connect(server, pki, "workq") as sock:
        tls = Wire(sock)
        id = new_id()
        assert tls.call(add(id, q, b"secret")) == b"+OK\r\n"
        assert tls.call(f"lease {q} 1000\r\n".encode()) == f"+OK 1\r\n{id} {q} 6\r\nsecret\r\n".encode()
        assert tls.call(f"complete {id} 2\r\nok\r\n".encode()) == b"+OK\r\n"
    plain = Wire(server.connect("workq"))
    assert plain.call(add(new_id(), q, b"in clear")) == b"+OK\r\n"
    assert plain.call(f"lease {q} 1000\r\n".encode()).endswith(b"in clear\r\n")
    plain.close()


def test_takeanumber_and_queued_over_tls(server: ServerProcess, pki: PKI) -> None:
    q = qname()
    with tls_connect(server, pki, "takeanumber") as sock:
        t = TextWire(sock, b"\r\n")
        id = added_id(t.call(f"ADD {q} 1 hello\r\n".encode()))
        assert t.call(f"RESERVE {q}\r\n".encode()) == f"+{id} hello\r\n".encode()
        assert t.call(f"DONE {q} {id}\r\n".encode()) == b"+OK\r\n"
    with tls_connect(server, pki, "queued") as sock:
        d = TextWire(sock, b"\n")
        assert d.call(f"USE {q}\n".encode()).startswith(b"OK")
        assert d.call(b"ENQUE " + base64.b64encode(b"item") + b"\n") == b"OK\n"
        assert d.call(b"DEQUE\n") == b"ITEM " + base64.b64encode(b"item") + b"\n"


def test_goqueue_and_taskflux_over_tls_and_across_protocols(server: ServerProcess, pki: PKI) -> None:
    q = qname()
    with tls_connect(server, pki, "taskflux") as sock:
        f = FluxWire(sock)
        assert f.call(t_enqueue(q, 0, b"flux")) == ENQUEUED
        assert f.call(t_dequeue(q)) == t_record(0, b"flux")
        assert f.call(t_enqueue(q, 0, b"to goqueue")) == ENQUEUED
    # added over TLS on TaskFlux, taken over goqueue, over TLS and then plain
    with tls_connect(server, pki, "goqueue") as sock:
        g = GoWire(sock)
        assert g.call(b"CONNECT\0") == b"OK\0"
        id, _, _, _, data = reserved_fields(g.call(g_reserve(q, 1)))
        assert data == b"to goqueue"
        g.add(q, data=b"to plain")
        assert g.call(g_delete(id)) == b"OK\0"   # (a job still reserved would go back at the close)
    plain = GoWire(server.connect("goqueue"))
    assert reserved_fields(plain.call(g_reserve(q, 1)))[4] == b"to plain"
    plain.close()


def test_openssl_s_client_speaks_workq(server: ServerProcess, pki: PKI) -> None:
    q = qname()
    id = new_id()
    request = add(id, q, b"from s_client") + f"lease {q} 1000\r\n".encode()
    expected = f"+OK\r\n+OK 1\r\n{id} {q} 13\r\nfrom s_client\r\n".encode()
    client = subprocess.Popen(
        ["openssl", "s_client", "-quiet", "-connect", f"{server.host}:{server.ports['workq_tls']}",
         "-CAfile", str(pki.one.cert), "-cert", str(pki.bob.cert), "-key", str(pki.bob.key),
         "-verify_return_error", "-servername", "localhost"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write(request)
        client.stdin.flush()
        got = b""
        while len(got) < len(expected) and select.select([client.stdout], [], [], 20)[0]:
            chunk = os.read(client.stdout.fileno(), 4096)
            if not chunk:
                break
            got += chunk
    finally:
        client.kill()
        client.wait()
    assert got == expected


# ------------------------------------------------------------ refusals
def test_a_client_of_another_ca_is_refused_with_one_line(server: ServerProcess, pki: PKI) -> None:
    handshake_refused(server, pki, pki.mallory)
    wait_for(lambda: log_lines(server, r"TLS handshake with workq client 127\.0\.0\.1:\d+ failed: .*"
                                       r"(certificate|unknown ca)"), 10, "the refusal's line")


def test_an_expired_client_certificate_is_refused(server: ServerProcess, pki: PKI) -> None:
    handshake_refused(server, pki, pki.expired, "queued")
    wait_for(lambda: log_lines(server, r"TLS handshake with queued client .* failed: .*expired"), 10,
             lambda: f"the expired certificate's line:\n{server.log_tail()}")


def test_no_client_certificate_is_refused_when_one_is_required(server: ServerProcess, pki: PKI) -> None:
    sock = socket.create_connection((server.host, server.ports["takeanumber_tls"]), timeout=10)
    context = ssl.create_default_context(cafile=str(pki.one.cert))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with context.wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(b"LEN q\r\n")
            tls.recv(100)
    wait_for(lambda: log_lines(server, r"TLS handshake with takeanumber client .* failed: .*certificate"), 10,
             "the refusal's line")


@pytest.mark.parametrize("protocol, refusal", [
    ("workq", b"-SERVER-ERROR this port speaks TLS\r\n"),
    ("takeanumber", b"-ERR this port speaks TLS\r\n"),
    ("queued", b"ERROR " + base64.b64encode(b"this port speaks TLS") + b"\n"),
    ("goqueue", b"ERROR\0this port speaks TLS\0"),
])
def test_a_plain_hello_on_a_tls_port_gets_the_protocols_refusal(server: ServerProcess, protocol: str,
                                                                 refusal: bytes) -> None:
    with socket.create_connection((server.host, server.ports[f"{protocol}_tls"]), timeout=10) as sock:
        sock.sendall({"goqueue": b"CONNECT\0", "queued": b"SIZE\n"}.get(protocol, b"LEN q\r\n"))
        got = b""
        while True:
            chunk = sock.recv(1000)
            if not chunk:
                break
            got += chunk
    assert got == refusal
    wait_for(lambda: log_lines(server, f"a plain-text client on a TLS port: {protocol} connection from"), 10,
             "the line")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_tls_hello_on_a_plain_port_is_refused_not_parsed(server: ServerProcess, pki: PKI,
                                                           protocol: str) -> None:
    hello = TLSSession(pki.context(pki.alice), server_side=False, server_hostname="localhost")
    hello.start()
    with socket.create_connection((server.host, server.ports[protocol]), timeout=10) as sock:
        sock.sendall(hello.outgoing())
        # the protocol's refusal in plain text, then closed: nothing of the hello was taken for a
        # command (each would have its own error)
        got = b""
        while True:
            try:
                chunk = sock.recv(1000)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    assert got == codec_class(protocol).refusal("this port speaks plain TCP, not TLS")
    wait_for(lambda: log_lines(server, f"a TLS client on a plain port: {protocol} connection from"), 10,
             "the line")


def test_a_tls_port_at_max_connections_closes_new_clients_without_plain_text(pki: PKI) -> None:
    """No readable refusal can reach a TLS client before a handshake, and an
    overloaded server spends no handshake on it: it is closed, and the plain
    refusal that would read as a broken TLS record is not sent."""
    with ServerProcess(shards=1, extra=[*pki.flags("workq", mode="true"), "--max-connections", "1"]) as proc:
        with tls_connect(proc, pki, "workq") as held:
            assert Wire(held).call(b"inspect queue nothing\r\n") == b"-NOT-FOUND\r\n"   # the one slot
            raw = socket.create_connection((proc.host, proc.ports["workq_tls"]), timeout=10)
            try:
                raw.sendall(b"\x16\x03\x01\x00\x05hello")   # the start of a hello
                try:
                    assert raw.recv(100) == b""   # closed with nothing written
                except ConnectionResetError:
                    pass
            finally:
                raw.close()
            wait_for(lambda: log_lines(proc, "clients connected \\(max_connections\\): refusing new workq"),
                     10, "the line")
            assert Wire(held).call(b"inspect queue nothing\r\n") == b"-NOT-FOUND\r\n"   # still served


def test_a_slow_handshake_is_closed_by_the_timeout(server: ServerProcess, pki: PKI) -> None:
    with socket.create_connection((server.host, server.ports["workq_tls"]), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01")   # the start of a hello, and no more
        started = time.monotonic()
        assert sock.recv(100) == b""    # closed
        waited = time.monotonic() - started
    assert HANDSHAKE_TIMEOUT * 0.8 < waited < HANDSHAKE_TIMEOUT + 3
    assert log_lines(server, rf"TLS handshake with workq client .* not done within {HANDSHAKE_TIMEOUT:g} s")


# ------------------------------------------------------------ deliveries over TLS
def test_a_lease_answered_over_tls_to_a_client_that_resets_unread_comes_back(server: ServerProcess,
                                                                             pki: PKI) -> None:
    """The lease's answer is bigger than what the client's kernel takes
    unread: its wire bytes are never all acknowledged, so the job goes back
    when the client resets."""
    q = qname()
    plain = Wire(server.connect("workq"))
    id = new_id()
    assert plain.call(add(id, q, b"k" * 262144)) == b"+OK\r\n"
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect((server.host, server.ports["workq_tls"]))
    tls = pki.context(pki.alice).wrap_socket(raw, server_hostname="localhost")
    tls.sendall(f"lease {q} 5000\r\n".encode())
    wait_for(lambda: inspect_field(plain, id, "state") != b"0", 10, "the lease")
    tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    tls.close()   # a reset, unread
    wait_for(lambda: inspect_field(plain, id, "state") == b"0", 10, "the job to come back")
    assert inspect_field(plain, id, "attempts") == b"0"
    # a lease read whole over TLS stays leased when its client then resets
    raw = socket.create_connection((server.host, server.ports["workq_tls"]), timeout=10)
    tls = pki.context(pki.alice).wrap_socket(raw, server_hostname="localhost")
    reader = Wire(tls)
    assert reader.call(f"lease {q} 5000\r\n".encode()).endswith(b"k" * 1000 + b"\r\n")
    time.sleep(0.2)   # the client's kernel acknowledges what it read
    tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    tls.close()
    time.sleep(0.5)
    assert inspect_field(plain, id, "state") != b"0" and inspect_field(plain, id, "attempts") == b"1"
    plain.close()


def test_many_small_leases_to_a_client_that_resets_come_back_by_their_wire_bytes(server: ServerProcess,
                                                                                 pki: PKI) -> None:
    """Each small answer is its own TLS record, about twice its plaintext:
    only the leases whose records the client's kernel took (and so
    acknowledged) stay leased when it resets; the rest come back. Offsets
    counted in plaintext (or without the handshake) would call some
    unreceived answers acknowledged, and those jobs would be lost to their
    leases."""
    q, count = qname(), 400
    plain = Wire(server.connect("workq"))
    ids = [new_id() for _ in range(count)]
    plain.send(b"".join(add(id, q, b"p") for id in ids))
    assert [plain.reply() for _ in ids] == [b"+OK\r\n"] * count
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # holds a fraction of the answers
    raw.connect((server.host, server.ports["workq_tls"]))
    raw.settimeout(10)
    session = TLSSession(pki.context(pki.alice), server_side=False, server_hostname="localhost")
    session.start()
    while not session.handshake_done:   # byte by byte through a sans-I/O client: every wire byte is ours to count
        raw.sendall(session.outgoing())
        session.receive(raw.recv(65536))
    raw.sendall(session.outgoing() + session.encrypt(f"lease {q} 5000\r\n".encode() * count))
    held, steady = -1, 0
    while steady < 5:   # the server writes until the client's window closes
        time.sleep(0.1)
        now = len(raw.recv(1 << 20, socket.MSG_PEEK))
        held, steady = now, steady + 1 if now == held else 0
    got = session.receive(raw.recv(1 << 20, socket.MSG_PEEK))   # what the client's kernel took
    received = re.findall(rb"\+OK 1\r\n(\S+) \S+ 1\r\np\r\n", got)
    assert 0 < len(received) < count // 2, "the client's buffer should hold a fraction of the answers"
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()   # a reset, unread
    leased = {id.decode() for id in received}

    def states() -> List[bool]:
        return [inspect_field(plain, id, "state") != b"0" for id in ids]
    wait_for(lambda: sum(states()) <= len(leased), 10,
             lambda: f"the unreceived leases to come back: {sum(states())} leased, {len(leased)} received")
    time.sleep(0.3)
    assert {id for id, out in zip(ids, states()) if out} == leased
    plain.close()


# ------------------------------------------------------------ settings
def test_tls_settings_are_checked_in_one_line(tmp_path: Path, pki: PKI) -> None:
    err = one_line_error(run_cli("serve", "--workq-tls", "true", "--runtime-dir", str(tmp_path / "a")))
    assert "workq speaks TLS but tls.certificate (--tls-certificate) and tls.key (--tls-key) are not set" in err
    err = one_line_error(run_cli("serve", "--workq-tls", "both", "--tls-certificate", "c", "--tls-key", "k"))
    assert 'workq.tls = "both" needs workq.tls_port (--workq-tls-port)' in err
    err = one_line_error(run_cli("serve", "--workq-tls", "sometimes"))
    assert "--workq-tls: invalid choice" in err
    config = tmp_path / "bad.toml"
    config.write_text('[queued]\ntls = "maybe"\n')
    err = one_line_error(run_cli("serve", "--config", str(config)))
    assert 'queued.tls must be one of "false", "true" or "both", got "maybe"' in err
    os.chmod(pki.server.key, 0o640)
    try:
        err = one_line_error(run_cli("serve", *pki.flags("workq", mode="true"), "--shards", "1",
                                     "--runtime-dir", str(tmp_path / "b"), "--workq-port", "0",
                                     "--no-takeanumber", "--no-goqueue", "--no-queued", "--no-taskflux"))
    finally:
        os.chmod(pki.server.key, 0o600)
    assert f"TLS key {pki.server.key} is accessible by group or others (mode 0640): chmod 600 it" in err


# ------------------------------------------------------------ reload
def test_sighup_reads_the_client_ca_again_and_open_connections_stay(tmp_path: Path, pki: PKI) -> None:
    """Bob's CA is dropped from the client CA file: after SIGHUP, new
    connections with his certificate are refused; his open one still works."""
    pki.trust(pki.one, pki.two)
    try:
        with ServerProcess(shards=1, protocols=["workq"], extra=pki.flags("workq", mode="true"),
                           log_level="debug") as proc:
            before = Wire(tls_connect(proc, pki, "workq", pki.bob))
            assert before.call(b"inspect server\r\n").startswith(b"+OK")
            with tls_connect(proc, pki, "workq", pki.alice) as sock:
                assert Wire(sock).call(b"inspect server\r\n").startswith(b"+OK")
            # what admission is given: the CN, then the SAN names
            assert re.search(r"TLS.* handshake done, names bob\n", proc.log())
            assert "handshake done, names alice, alice.example, alice@example.com\n" in proc.log()
            pki.trust(pki.one)
            # who terminates TLS: the shard (the direct path), else the router
            readers = ["router", "shard-0"] if log_lines(proc, r"^\S+ \S+ shard-0 .*handshake done") else ["router"]
            os.kill(proc.pid, 1)   # SIGHUP
            # the router and a shard that terminates TLS connections handed to it both read it again
            wait_for(lambda: all(log_lines(proc, rf"^\S+ \S+ {reader} .*new TLS connections use the certificate")
                                 for reader in readers), 10, "the reload")
            handshake_refused(proc, pki, pki.bob)
            assert before.call(b"inspect server\r\n").startswith(b"+OK")   # not dropped
            with tls_connect(proc, pki, "workq", pki.alice) as sock:
                assert Wire(sock).call(b"inspect server\r\n").startswith(b"+OK")
            # a file that cannot be used keeps the context in use, in one line
            pki.client_ca.write_text("not a certificate\n")
            os.kill(proc.pid, 1)
            wait_for(lambda: len(log_lines(proc, "keeping the TLS certificate in use: TLS client CA file"))
                     == len(readers), 10, "the bad reload's line, from each process that reads the files")
            with tls_connect(proc, pki, "workq", pki.alice) as sock:
                assert Wire(sock).call(b"inspect server\r\n").startswith(b"+OK")
            handshake_refused(proc, pki, pki.bob)
            before.close()
    finally:
        pki.trust(pki.one, pki.two)


# ------------------------------------------------------------ a flood of half-open handshakes
def test_a_thousand_half_open_handshakes_hold_nobody_up(pki: PKI) -> None:
    """1,000 connections that never finish a handshake (half of them send
    part of a hello): a client's round trips are answered all along; every
    one is closed by the timeout, in a bounded number of log lines."""
    with ServerProcess(shards=1, protocols=["workq"], extra=pki.flags("workq")) as proc:
        q = qname()
        client = Wire(tls_connect(proc, pki, "workq"))
        idle: List[socket.socket] = []
        slowest = 0.0
        for i in range(1000):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                sock.connect((proc.host, proc.ports["workq_tls"]))
            except BlockingIOError:
                pass
            idle.append(sock)
            if i % 100 == 0:
                started = time.monotonic()
                assert client.call(add(new_id(), q)) == b"+OK\r\n"
                assert client.call(f"lease {q} 1000\r\n".encode()).startswith(b"+OK 1\r\n")
                slowest = max(slowest, time.monotonic() - started)
        for i, sock in enumerate(idle):
            if i % 2:
                try:
                    sock.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")   # a hello begun
                except OSError:
                    pass
        started = time.monotonic()
        while time.monotonic() - started < HANDSHAKE_TIMEOUT + 1:
            assert client.call(f"inspect queue {q}\r\n".encode()).startswith(b"+OK")
            time.sleep(0.05)
        assert slowest < 2.0, slowest

        def all_closed() -> bool:
            for sock in idle:
                try:
                    if sock.recv(10) != b"":
                        return False
                except BlockingIOError:
                    return False
                except OSError:
                    pass   # reset: closed too
            return True

        wait_for(all_closed, 20, "every half-open connection to be closed")
        assert client.call(f"inspect queue {q}\r\n".encode()).startswith(b"+OK")
        lines = log_lines(proc, r"TLS handshake with workq client .* not done within")
        assert 1 <= len(lines) <= 2 * BURST, lines   # a window's burst, then only counted
        for sock in idle:
            sock.close()
        client.close()
