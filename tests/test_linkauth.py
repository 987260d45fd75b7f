"""Shard links are opened only to holders of the shared secret: the HMAC
handshake's messages, the handshake over real TCP sockets (right secret,
wrong secret, silence, a stray text client), the same inside TLS, and the
frames that follow it.

Every socket is gevent's, on 127.0.0.1 with a port the kernel picks; the
``leaks`` fixture fails a test that leaves a socket or greenlet behind.
Timeouts here are generous and only keep a broken build from hanging.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket as stdsocket
import subprocess
import threading
from typing import List, Optional

import gevent
import gevent.event
import gevent.ssl
import pytest
from gevent import socket

from inprocess import leaks  # noqa: F401 (fixture)
from queueserver.net.channel import FrameChannel
from queueserver.net.linkauth import (CLIENT_MESSAGE_SIZE, GREETING_SIZE, REFUSAL, SERVER_PROOF_SIZE,
                                      LinkAuthError, SecretError, TLSConfigError, accept_link,
                                      client_context, client_handshake, client_message, connect_link,
                                      greeting, load_secret, parse_greeting, peer_name, serve_handshake,
                                      server_context, server_proof, verify_client_message,
                                      verify_server_proof, wrap_client, wrap_server)

pytestmark = pytest.mark.usefixtures("leaks")

WAIT = 10.0          # only against hangs
SHORT = 0.5          # the server's deadline where a test waits it out
LOGGER = "queueserver.net.linkauth"
SECRET = secrets.token_bytes(32)


# ------------------------------------------------------------------ helpers
@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()


def connect(listener) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.connect(listener.getsockname())   # an address, not a name: no resolver thread
    return sock


def serve_one(listener, secret: bytes = SECRET, ctx=None, timeout: float = WAIT) -> gevent.Greenlet:
    """A greenlet accepting one link; its value is the link's socket or None."""
    def serve():
        sock, address = listener.accept()
        return accept_link(sock, secret, peer_name(address), ctx, timeout)
    return gevent.spawn(serve)


def finish(server: gevent.Greenlet):
    """What the server greenlet returned (it must end)."""
    server.join(WAIT)
    assert server.ready(), "the shard side did not finish"
    return server.get()


def read_to_eof(sock) -> bytes:
    sock.settimeout(WAIT)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except stdsocket.timeout:
            pytest.fail(f"no EOF within {WAIT} s; got {data!r}")
        except OSError:   # reset or TLS alert: the link is gone all the same
            return data
        if not chunk:
            return data
        data += chunk


def refusals(caplog) -> List[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING]


def echo(sock) -> None:
    """The shard side of a round trip: every frame sent back."""
    channel = FrameChannel(sock)
    try:
        channel.receive(channel.send)
    finally:
        channel.close()


def round_trip(sock, frames: list) -> list:
    """Send ``frames`` over a FrameChannel, return what comes back; closes ``sock``."""
    channel = FrameChannel(sock)
    got: list = []
    done = gevent.event.Event()

    def handle(frame):
        got.append(frame)
        if len(got) == len(frames):
            done.set()

    reader = gevent.spawn(channel.receive, handle)
    try:
        for frame in frames:
            channel.send(frame)
        assert done.wait(WAIT), f"{len(got)} of {len(frames)} frames came back"
    finally:
        channel.close()
        reader.join(WAIT)
    return got


FRAMES = [[1, "add", "q", b"payload\x00\xff", {"ttr": 30}], [2, "lease", ["q", "r"], None], [0, "cancel", 1]]


# ------------------------------------------------------------------ messages (pure)
def test_message_sizes_are_fixed():
    nonce = secrets.token_bytes(32)
    assert len(greeting(nonce)) == GREETING_SIZE == 73
    assert len(client_message(SECRET, nonce, nonce)) == CLIENT_MESSAGE_SIZE == 64
    assert len(server_proof(SECRET, nonce, nonce)) == SERVER_PROOF_SIZE == 32
    assert len(REFUSAL) == 33 and REFUSAL.endswith(b"\r\n")


def test_a_right_proof_verifies_both_ways():
    nonce_s, nonce_c = secrets.token_bytes(32), secrets.token_bytes(32)
    assert parse_greeting(greeting(nonce_s)) == nonce_s
    message = client_message(SECRET, nonce_s, nonce_c)
    assert verify_client_message(SECRET, nonce_s, message) == nonce_c
    assert verify_server_proof(SECRET, nonce_s, nonce_c, server_proof(SECRET, nonce_s, nonce_c))


def test_a_wrong_secret_an_altered_nonce_or_a_truncated_message_does_not_verify():
    nonce_s, nonce_c = secrets.token_bytes(32), secrets.token_bytes(32)
    other = secrets.token_bytes(32)
    message = client_message(SECRET, nonce_s, nonce_c)
    proof = server_proof(SECRET, nonce_s, nonce_c)
    altered_s = bytes([nonce_s[0] ^ 1]) + nonce_s[1:]
    altered_c = bytes([message[0] ^ 1]) + message[1:]

    assert verify_client_message(other, nonce_s, message) is None
    assert verify_client_message(SECRET, altered_s, message) is None
    assert verify_client_message(SECRET, nonce_s, altered_c) is None
    assert verify_client_message(SECRET, nonce_s, message[:-1]) is None
    assert verify_client_message(SECRET, nonce_s, message + b"x") is None

    assert not verify_server_proof(other, nonce_s, nonce_c, proof)
    assert not verify_server_proof(SECRET, altered_s, nonce_c, proof)
    assert not verify_server_proof(SECRET, nonce_s, nonce_c, proof[:-1])
    # The router's own proof, reflected back, is no shard's proof.
    assert not verify_server_proof(SECRET, nonce_s, nonce_c, message[32:])


@pytest.mark.parametrize("bad", [b"", b"+OK hello\r\n", greeting(bytes(32))[:-1] + b"\r",
                                 greeting(b"\xab" * 32).upper(), b"QSLINK1 " + b"zz" * 32 + b"\n"])
def test_what_is_not_a_greeting_is_refused(bad):
    with pytest.raises(LinkAuthError, match="not a shard link"):
        parse_greeting(bad)


# ------------------------------------------------------------------ handshake over TCP
def test_right_secret_links_both_ways_and_frames_follow(listener):
    server = serve_one(listener)
    client = connect(listener)
    client_handshake(client, SECRET, timeout=WAIT)
    shard_side = finish(server)
    assert shard_side is not None
    echoing = gevent.spawn(echo, shard_side)
    assert round_trip(client, FRAMES) == FRAMES
    echoing.join(WAIT)
    assert echoing.dead


def test_wrong_secret_is_refused_and_logged_with_the_peer(listener, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = serve_one(listener)
    client = connect(listener)
    peer = peer_name(client.getsockname())
    try:
        with pytest.raises(LinkAuthError, match="refused"):
            client_handshake(client, secrets.token_bytes(32), timeout=WAIT)
        assert finish(server) is None
        assert read_to_eof(client) == REFUSAL[SERVER_PROOF_SIZE:]   # the rest of the line, then EOF
    finally:
        client.close()
    [line] = refusals(caplog)
    assert peer in line and "wrong secret" in line


def test_serve_handshake_alone_returns_false_on_a_wrong_secret(listener):
    client = connect(listener)
    sock, address = listener.accept()
    server = gevent.spawn(serve_handshake, sock, SECRET, peer_name(address), WAIT)
    try:
        with pytest.raises(LinkAuthError):
            client_handshake(client, secrets.token_bytes(32), timeout=WAIT)
        assert finish(server) is False
        assert sock.closed
    finally:
        client.close()


def test_a_silent_client_is_refused_after_the_deadline(listener, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = serve_one(listener, timeout=SHORT)
    client = connect(listener)
    try:
        assert finish(server) is None
        data = read_to_eof(client)
    finally:
        client.close()
    assert data[:GREETING_SIZE].startswith(b"QSLINK1 ") and data[GREETING_SIZE:] == REFUSAL
    [line] = refusals(caplog)
    assert f"no answer within {SHORT:g} s" in line


def test_a_text_client_gets_the_error_line_without_waiting_out_the_deadline(listener, caplog):
    """The shard's deadline is longer than the client is willing to wait:
    the refusal must come from what was sent, not from the clock."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = serve_one(listener, timeout=10 * WAIT)
    client = connect(listener)
    try:
        client.sendall(b"add q 0 0 1\r\nx\r\n")
        data = read_to_eof(client)
        assert finish(server) is None
    finally:
        client.close()
        server.kill()
    assert data[GREETING_SIZE:] == REFUSAL
    [line] = refusals(caplog)
    assert "not a shard link (sent b'add q 0 0 1\\r\\nx\\r\\n')" in line


def test_a_client_hanging_up_is_refused_as_closed(listener, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = serve_one(listener)
    connect(listener).close()
    assert finish(server) is None
    [line] = refusals(caplog)
    assert ": closed" in line   # maybe with the reset the greeting met


def test_a_router_never_links_to_an_impostor_shard(listener):
    """A shard without the secret that says yes to anything still cannot prove it."""
    def impostor():
        sock, _ = listener.accept()
        try:
            sock.sendall(greeting(secrets.token_bytes(32)))
            sock.recv(CLIENT_MESSAGE_SIZE)
            sock.sendall(secrets.token_bytes(SERVER_PROOF_SIZE))
        finally:
            sock.close()
    server = gevent.spawn(impostor)
    client = connect(listener)
    try:
        with pytest.raises(LinkAuthError, match="does not verify"):
            client_handshake(client, SECRET, timeout=WAIT)
    finally:
        client.close()
        finish(server)


def test_a_router_gives_up_on_a_port_that_says_nothing(listener):
    client = connect(listener)
    sock, _ = listener.accept()
    try:
        with pytest.raises(LinkAuthError, match=f"no greeting within {SHORT:g} s"):
            client_handshake(client, SECRET, timeout=SHORT)
    finally:
        client.close()
        sock.close()


def test_blocking_stdlib_sockets_work_too():
    """Not gevent's: the deadline is the socket's own timeout."""
    with stdsocket.create_server(("127.0.0.1", 0)) as server_sock:
        errors: list = []

        def router():
            try:
                with stdsocket.create_connection(server_sock.getsockname(), timeout=WAIT) as sock:
                    client_handshake(sock, SECRET, timeout=WAIT)
            except Exception as exc:   # reported by the main thread
                errors.append(exc)

        thread = threading.Thread(target=router)
        thread.start()
        sock, address = server_sock.accept()
        with sock:
            assert serve_handshake(sock, SECRET, peer_name(address), timeout=WAIT)
        thread.join(WAIT)
        assert not errors

        silent = stdsocket.create_connection(server_sock.getsockname(), timeout=WAIT)
        with silent:
            sock, address = server_sock.accept()
            assert not serve_handshake(sock, SECRET, peer_name(address), timeout=SHORT)


# ------------------------------------------------------------------ TLS
OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[node]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(cwd, *args: str) -> None:
    subprocess.run(["/usr/bin/openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A cluster CA and a node certificate it signed, plus a stranger CA."""
    d = tmp_path_factory.mktemp("pki")
    (d / "openssl.cnf").write_text(OPENSSL_CONFIG)
    for ca in ("ca", "other-ca"):
        openssl(d, "req", "-x509", "-config", "openssl.cnf", "-extensions", "ca", *EC,
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN={ca}", "-days", "1")
    openssl(d, "req", "-new", "-config", "openssl.cnf", *EC, "-keyout", "node.key",
            "-out", "node.csr", "-subj", "/CN=node")
    openssl(d, "x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", "1",
            "-out", "node.pem", "-days", "1", "-extfile", "openssl.cnf", "-extensions", "node")
    return {name: str(d / name) for name in ("ca.pem", "ca.key", "other-ca.pem", "node.pem", "node.key")}


@pytest.fixture
def tls(pki):
    """Mutual TLS: the shard requires a router certificate from the cluster CA."""
    return (server_context(pki["node.pem"], pki["node.key"], pki["ca.pem"]),
            client_context(pki["node.pem"], pki["node.key"], pki["ca.pem"]))


def test_tls_then_hmac_then_a_big_frame(listener, tls):
    server_ctx, client_ctx = tls
    server = serve_one(listener, ctx=server_ctx)
    client = connect_link(connect(listener), SECRET, client_ctx, timeout=WAIT)
    shard_side = finish(server)
    assert isinstance(client, gevent.ssl.SSLSocket) and isinstance(shard_side, gevent.ssl.SSLSocket)
    assert shard_side.getpeercert()["subject"] == ((("commonName", "node"),),)   # the router's, verified
    echoing = gevent.spawn(echo, shard_side)
    big = [9, "result", os.urandom(300_000)]
    frames = [FRAMES[0], big, FRAMES[1], big, FRAMES[2]]
    assert round_trip(client, frames) == frames
    echoing.join(WAIT)
    assert echoing.dead


def test_tls_handshakes_yield_to_the_loop(listener, tls):
    """Two shard-side handshakes start first; were they not cooperative, the
    routers' greenlets could never answer them."""
    server_ctx, client_ctx = tls
    clients = [connect(listener) for _ in range(2)]
    accepted = [listener.accept()[0] for _ in range(2)]
    servers = [gevent.spawn(wrap_server, sock, server_ctx, WAIT) for sock in accepted]
    routers = [gevent.spawn(wrap_client, sock, client_ctx, WAIT) for sock in clients]
    gevent.joinall(servers + routers, timeout=WAIT)
    try:
        assert all(g.successful() for g in servers + routers), [g.exception for g in servers + routers]
    finally:
        for g in servers + routers:
            g.kill()
            if g.successful():
                g.value.close()


def test_a_router_trusting_another_ca_does_not_link(listener, pki, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = serve_one(listener, ctx=server_context(pki["node.pem"], pki["node.key"], pki["ca.pem"]))
    stranger = client_context(pki["node.pem"], pki["node.key"], pki["other-ca.pem"])
    with pytest.raises(LinkAuthError, match="certificate verify failed"):
        connect_link(connect(listener), SECRET, stranger, timeout=WAIT)
    assert finish(server) is None
    [line] = refusals(caplog)
    assert "TLS handshake failed" in line


def test_a_router_without_a_certificate_does_not_link_when_one_is_required(listener, pki, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = serve_one(listener, ctx=server_context(pki["node.pem"], pki["node.key"], pki["ca.pem"]))
    anonymous = client_context(None, None, pki["ca.pem"])
    with pytest.raises(LinkAuthError):   # at TLS's handshake or (TLS 1.3) at the first read
        connect_link(connect(listener), SECRET, anonymous, timeout=WAIT)
    assert finish(server) is None
    assert refusals(caplog)


def test_server_side_tls_without_client_certificates(listener, pki):
    server = serve_one(listener, ctx=server_context(pki["node.pem"], pki["node.key"], None))
    client = connect_link(connect(listener), SECRET, client_context(None, None, pki["ca.pem"]), timeout=WAIT)
    shard_side = finish(server)
    echoing = gevent.spawn(echo, shard_side)
    assert round_trip(client, FRAMES) == FRAMES
    echoing.join(WAIT)


@pytest.mark.parametrize("says", [b"add q 0 0 1\r\nx\r\n", None])
def test_a_plain_client_on_a_tls_port_is_refused(listener, tls, caplog, says: Optional[bytes]):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = serve_one(listener, ctx=tls[0], timeout=SHORT)
    client = connect(listener)
    try:
        if says is not None:
            client.sendall(says)
        read_to_eof(client)
        assert finish(server) is None
    finally:
        client.close()
    [line] = refusals(caplog)
    assert "TLS handshake" in line


def test_tls_files_that_cannot_be_loaded_say_which(pki, tmp_path):
    missing = str(tmp_path / "missing.pem")
    for make in (lambda: server_context(missing, pki["node.key"], None),
                 lambda: server_context(pki["node.pem"], pki["ca.key"], None),   # not its key
                 lambda: client_context(None, None, missing),
                 lambda: client_context(None, None, pki["node.key"])):          # no certificate in it
        with pytest.raises(TLSConfigError) as error:
            make()
        assert "\n" not in str(error.value)


# ------------------------------------------------------------------ load_secret
def secret_file(tmp_path, content: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "cluster.secret"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


def test_load_secret_strips_the_trailing_newline(tmp_path):
    assert load_secret(secret_file(tmp_path, b"0123456789abcdefXYZ\n")) == b"0123456789abcdefXYZ"


@pytest.mark.parametrize("content, mode, says", [
    (b"short\n", 0o600, "at least 16"),
    (b"0123456789abcdef" * 2, 0o644, "chmod 600 it"),
    (b"0123456789abcdef" * 2, 0o640, "chmod 600 it"),
    (None, 0o600, "does not exist"),
])
def test_load_secret_errors_are_one_line_saying_what_to_change(tmp_path, content, mode, says):
    path = secret_file(tmp_path, content, mode) if content is not None else str(tmp_path / "nope")
    with pytest.raises(SecretError) as error:
        load_secret(path)
    message = str(error.value)
    assert says in message and path in message and "\n" not in message
    assert isinstance(error.value, ValueError)
