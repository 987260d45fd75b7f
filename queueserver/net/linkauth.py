"""Who may open a shard link: an HMAC challenge-response over a shared
secret, optionally inside TLS.

Routers reach shards over TCP, so a shard's link port is open to whoever can
reach the host. Before any frame is read, both ends prove they hold the
cluster's shared secret, each over a fresh nonce of the other (nothing can be
replayed), with fixed-size messages that are only compared, never decoded:
nothing from the network is unpickled or evaluated::

    shard  -> router   b"QSLINK1 " + hex(nonce_s) + b"\\n"        73 bytes
    router -> shard    nonce_c + HMAC(secret, b"client" + nonce_s + nonce_c)   64 bytes
    shard  -> router   HMAC(secret, b"server" + nonce_s + nonce_c)              32 bytes
                       or b"-ERR link authentication failed\\r\\n" and close    33 bytes

The labels keep a proof from being reflected back as the other side's. The
HMAC proves the secret, not privacy: links between hosts should also run
inside TLS (:func:`server_context`, :func:`client_context`): wrap the TCP
socket first (:func:`wrap_server`, :func:`wrap_client`), then shake hands
inside it. :func:`accept_link` and :func:`connect_link` do both.

The message logic is pure functions over bytes; the socket part reads
exactly the expected bytes under a deadline and refuses with one log line.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import ssl
import time
from typing import Callable, Optional, Protocol, Tuple

import gevent.ssl

from ..privatefile import PrivateFileError, read_private

log = logging.getLogger(__name__)

MIN_SECRET = 16               # bytes of shared secret, at the least
NONCE_SIZE = 32
MAC_SIZE = 32                 # sha256
GREETING_PREFIX = b"QSLINK1 "
GREETING_SIZE = len(GREETING_PREFIX) + 2 * NONCE_SIZE + 1      # 73
CLIENT_MESSAGE_SIZE = NONCE_SIZE + MAC_SIZE                    # 64
SERVER_PROOF_SIZE = MAC_SIZE                                   # 32
REFUSAL = b"-ERR link authentication failed\r\n"               # 33
SHOWN_BYTES = 20              # of what a stranger sent, in the log line
_HEX = frozenset(b"0123456789abcdef")
_TEXT = frozenset(range(0x20, 0x7F)) | frozenset(b"\r\n\t")


class SecretError(ValueError):
    """The shared-secret file cannot be used; str() says what to change."""


class TLSConfigError(ValueError):
    """A certificate, key or CA file cannot be loaded; str() says which."""


class LinkAuthError(Exception):
    """The link was not authenticated (either side); str() is one line."""


# ---------------------------------------------------------------- secret
def load_secret(path: str) -> bytes:
    """The shared secret in ``path``, trailing whitespace stripped.

    The file must be private to its owner, like an ssh key: anyone who can
    read it can open links to every shard.
    """
    try:
        data = read_private(path, "shared secret file",
                            f"create it with at least {MIN_SECRET} random bytes "
                            f"(e.g. `head -c 32 /dev/urandom | base64`) and chmod 600 it")
    except PrivateFileError as err:
        raise SecretError(str(err)) from None
    secret = data.rstrip()
    if len(secret) < MIN_SECRET:
        raise SecretError(f"shared secret in {path} is {len(secret)} bytes: it needs at least "
                          f"{MIN_SECRET} (e.g. `head -c 32 /dev/urandom | base64`)")
    return secret


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET:   # an empty secret would authenticate anyone
        raise SecretError(f"shared secret is {len(secret)} bytes: it needs at least {MIN_SECRET}")


# ---------------------------------------------------------------- messages (pure)
def _mac(secret: bytes, label: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    return hmac.new(secret, label + nonce_s + nonce_c, hashlib.sha256).digest()


def greeting(nonce_s: bytes) -> bytes:
    """The shard's first message: its nonce, as a text line a human can recognize."""
    return GREETING_PREFIX + nonce_s.hex().encode("ascii") + b"\n"


def parse_greeting(data: bytes) -> bytes:
    """The shard's nonce in a greeting; :class:`LinkAuthError` if it is none."""
    hexpart = data[len(GREETING_PREFIX):-1]
    if (len(data) != GREETING_SIZE or not data.startswith(GREETING_PREFIX)
            or not data.endswith(b"\n") or not _HEX.issuperset(hexpart)):
        raise LinkAuthError(f"not a shard link: it greeted with {_shown(data)}")
    return bytes.fromhex(hexpart.decode("ascii"))


def client_message(secret: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    """The router's answer: its own nonce and its proof over both nonces."""
    return nonce_c + _mac(secret, b"client", nonce_s, nonce_c)


def verify_client_message(secret: bytes, nonce_s: bytes, message: bytes) -> Optional[bytes]:
    """The router's nonce if ``message`` proves the secret, else None."""
    if len(message) != CLIENT_MESSAGE_SIZE:
        return None
    nonce_c, proof = message[:NONCE_SIZE], message[NONCE_SIZE:]
    if hmac.compare_digest(proof, _mac(secret, b"client", nonce_s, nonce_c)):
        return nonce_c
    return None


def server_proof(secret: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    """The shard's proof, so a router never talks to an impostor shard."""
    return _mac(secret, b"server", nonce_s, nonce_c)


def verify_server_proof(secret: bytes, nonce_s: bytes, nonce_c: bytes, proof: bytes) -> bool:
    return len(proof) == SERVER_PROOF_SIZE and hmac.compare_digest(
        proof, server_proof(secret, nonce_s, nonce_c))


def _looks_like_text(data: bytes) -> bool:
    """A line of some text protocol: printable, ended by a newline.

    Lets a shard refuse a stray text client at once instead of waiting out
    the deadline for 64 bytes that will not come. A router's 64 random
    bytes leave in one write and arrive whole, so seeing a prefix of them
    that is also a printable line takes a split segment and odds far below
    one in a thousand on top; the router then just reconnects.
    """
    return len(data) >= 2 and data.endswith(b"\n") and _TEXT.issuperset(data)


def _shown(data: bytes) -> str:
    shown = repr(data[:SHOWN_BYTES])
    return shown + "..." if len(data) > SHOWN_BYTES else shown


def _why_refused(data: bytes) -> str:
    """Why a whole 64-byte message failed: text is a stranger, bytes a wrong secret."""
    if _TEXT.issuperset(data):
        return f"not a shard link (sent {_shown(data)})"
    return "wrong secret"


# ---------------------------------------------------------------- sockets
_TIMEOUT = "timeout"
_CLOSED = "closed"
_STOPPED = "stopped"


class _Deadline:
    """One deadline over several operations on a socket.

    Each operation gets the time left as the socket's timeout: gevent's
    sockets (TLS ones too) wait cooperatively and raise ``socket.timeout``,
    and a plain blocking socket honours it the same way. The socket's own
    timeout is restored by :meth:`restore`.
    """

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + timeout
        self.saved = sock.gettimeout()

    def _arm(self, grace: float = 0.0) -> bool:
        left = max(self.deadline - time.monotonic(), grace)
        if left <= 0:
            return False
        self.sock.settimeout(left)
        return True

    def send(self, data: bytes, grace: float = 0.0) -> Optional[str]:
        """None when sent, else why not."""
        if not self._arm(grace):
            return _TIMEOUT
        try:
            self.sock.sendall(data)
        except TimeoutError:
            return _TIMEOUT
        except OSError as exc:
            return f"{_CLOSED} ({_one_line(exc)})"
        return None

    def recv(self, size: int, stop: Optional[Callable[[bytes], bool]] = None) -> Tuple[bytes, Optional[str]]:
        """Up to ``size`` bytes, and why fewer came (None when all did);
        ``stop`` may end the wait early on what came so far."""
        data = b""
        while len(data) < size:
            if not self._arm():
                return data, _TIMEOUT
            try:
                chunk = self.sock.recv(size - len(data))
            except TimeoutError:
                return data, _TIMEOUT
            except OSError as exc:
                return data, f"{_CLOSED} ({_one_line(exc)})"
            if not chunk:
                return data, _CLOSED
            data += chunk
            if len(data) < size and stop is not None and stop(data):
                return data, _STOPPED
        return data, None

    def discard(self) -> None:
        """Read off what already arrived, so closing sends FIN, not RST
        (which could destroy the refusal line before the peer reads it)."""
        try:
            self.sock.settimeout(0.0)
            for _ in range(16):
                if not self.sock.recv(65536):
                    return
        except (OSError, ValueError):
            pass

    def restore(self) -> None:
        try:
            self.sock.settimeout(self.saved)
        except OSError:
            pass


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def serve_handshake(sock: socket.socket, secret: bytes, peer: str, timeout: float = 5.0) -> bool:
    """The shard's side: True if the peer proved the secret and got our proof.

    When refused, the peer is sent :data:`REFUSAL` (unless it is gone), the
    socket is closed, one warning naming ``peer`` and the reason is logged,
    and False is returned. Never waits past ``timeout`` for the peer.
    """
    _check_secret(secret)
    nonce_s = secrets.token_bytes(NONCE_SIZE)
    io = _Deadline(sock, timeout)
    reason = io.send(greeting(nonce_s))
    if reason is None:
        message, why = io.recv(CLIENT_MESSAGE_SIZE, stop=_looks_like_text)
        if why is None:
            nonce_c = verify_client_message(secret, nonce_s, message)
            if nonce_c is not None:
                reason = io.send(server_proof(secret, nonce_s, nonce_c))
                if reason is None:
                    io.restore()
                    return True
            else:
                reason = _why_refused(message)
        elif message:
            reason = f"not a shard link (sent {_shown(message)})"
        elif why == _TIMEOUT:
            reason = f"no answer within {timeout:g} s"
        else:
            reason = why
        if not reason.startswith(_CLOSED) and io.send(REFUSAL, grace=1.0) is None:
            io.discard()
    log.warning("refused shard link from %s: %s", peer, reason)
    _close(sock)
    return False


def client_handshake(sock: socket.socket, secret: bytes, timeout: float = 5.0) -> None:
    """The router's side: returns once both ends proved the secret.

    Raises :class:`LinkAuthError` (one line) on a greeting that is not a
    shard's, a refusal, a proof that does not verify, a closed link or no
    answer within ``timeout``. The socket is the caller's to close.
    """
    _check_secret(secret)
    io = _Deadline(sock, timeout)
    data, why = io.recv(GREETING_SIZE, stop=lambda d: b"\n" in d)
    if why is not None and not data:
        raise LinkAuthError(_lacking("no greeting", why, timeout))
    nonce_s = parse_greeting(data)
    nonce_c = secrets.token_bytes(NONCE_SIZE)
    why = io.send(client_message(secret, nonce_s, nonce_c))
    if why is not None:
        raise LinkAuthError(_lacking("could not answer the greeting", why, timeout))
    proof, why = io.recv(SERVER_PROOF_SIZE)
    if verify_server_proof(secret, nonce_s, nonce_c, proof):
        io.restore()
        return
    if proof and REFUSAL.startswith(proof):
        raise LinkAuthError("the shard refused the link: is the shared secret the same on both hosts?")
    if why is not None:
        raise LinkAuthError(_lacking("no proof from the shard", why, timeout))
    raise LinkAuthError("the shard's proof does not verify: it does not hold the shared secret")


def _lacking(what: str, why: str, timeout: float) -> str:
    return f"{what} within {timeout:g} s" if why == _TIMEOUT else f"{what}: link {why}"


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


# ---------------------------------------------------------------- TLS
def server_context(cert: str, key: str, ca: Optional[str] = None) -> ssl.SSLContext:
    """TLS 1.2+ for a shard's link port; with ``ca``, routers must present a
    certificate signed by it. A gevent context: handshakes and reads yield
    to the loop."""
    ctx = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key)
    if ca:
        _load_ca(ctx, ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(cert: Optional[str], key: Optional[str], ca: str) -> ssl.SSLContext:
    """TLS 1.2+ for a router: the shard's certificate must be signed by ``ca``.

    Host names are not checked: cluster files name shards by address, and
    certificates rarely carry IP addresses. Trust comes from the cluster's
    own CA instead, whose every certificate is a cluster node's (and the
    HMAC handshake inside proves the shared secret on top). The chain is
    still verified: ``check_hostname`` off, ``verify_mode`` required.
    """
    ctx = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_ca(ctx, ca)
    if cert:
        _load_chain(ctx, cert, key)
    elif key:
        raise TLSConfigError(f"TLS key {key} given without a certificate: give both or neither")
    return ctx


class TLSPaths(Protocol):
    """A link client's TLS files (a cluster file's ``[tls]``:
    :class:`queueserver.cluster.clusterfile.TLSFiles`, from a layer above)."""

    @property
    def cert(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def ca(self) -> str: ...


def client_credentials(secret_file: str, tls: Optional[TLSPaths]) -> Tuple[bytes, Optional[ssl.SSLContext]]:
    """What a link's client presents: the secret of ``secret_file`` and,
    when ``tls`` (a cluster file's cert, key and ca) is given, its TLS context."""
    secret = load_secret(secret_file)
    return secret, client_context(tls.cert, tls.key, tls.ca) if tls is not None else None


def _load_chain(ctx: ssl.SSLContext, cert: str, key: Optional[str]) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot load TLS certificate {cert} with key {key or cert} "
                             f"({_one_line(exc)}): check both paths and that the key "
                             f"belongs to the certificate") from None


def _load_ca(ctx: ssl.SSLContext, ca: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot load TLS CA file {ca} ({_one_line(exc)}): "
                             f"point to the cluster CA's PEM certificate") from None


def wrap_server(sock: socket.socket, ctx: ssl.SSLContext, timeout: float = 5.0) -> ssl.SSLSocket:
    """The TLS socket over accepted TCP ``sock``, handshake done.

    ``sock`` is detached into the returned socket: use only the result. On
    failure it is closed and :class:`LinkAuthError` is raised.
    """
    return _handshake(ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), timeout)


def wrap_client(sock: socket.socket, ctx: ssl.SSLContext, timeout: float = 5.0) -> ssl.SSLSocket:
    """The TLS socket over connected TCP ``sock``, handshake done and the
    shard's certificate verified; as :func:`wrap_server` otherwise."""
    return _handshake(ctx.wrap_socket(sock, server_side=False, do_handshake_on_connect=False), timeout)


def _handshake(tls: ssl.SSLSocket, timeout: float) -> ssl.SSLSocket:
    saved = tls.gettimeout()
    try:
        tls.settimeout(timeout)   # gevent's SSL socket waits cooperatively
        tls.do_handshake()
        tls.settimeout(saved)
    except TimeoutError:
        _close(tls)
        raise LinkAuthError(f"no TLS handshake within {timeout:g} s") from None
    except (OSError, ValueError) as exc:
        _close(tls)
        raise LinkAuthError(f"TLS handshake failed: {_one_line(exc)}") from None
    return tls


# ---------------------------------------------------------------- both at once
def accept_link(sock: socket.socket, secret: bytes, peer: str, ctx: Optional[ssl.SSLContext] = None,
                timeout: float = 5.0) -> Optional[socket.socket]:
    """A shard's accepted connection made a link: TLS first when ``ctx``
    is given, then the HMAC handshake inside it. Returns the socket to use
    (the TLS one), or None when refused (closed, one warning logged)."""
    if ctx is not None:
        try:
            sock = wrap_server(sock, ctx, timeout)
        except LinkAuthError as exc:
            log.warning("refused shard link from %s: %s", peer, exc)
            return None
    return sock if serve_handshake(sock, secret, peer, timeout) else None


def connect_link(sock: socket.socket, secret: bytes, ctx: Optional[ssl.SSLContext] = None,
                 timeout: float = 5.0) -> socket.socket:
    """A router's connected socket made a link (TLS when ``ctx`` is given,
    then HMAC). Returns the socket to use; raises :class:`LinkAuthError`,
    the socket then closed."""
    if ctx is not None:
        sock = wrap_client(sock, ctx, timeout)
    try:
        client_handshake(sock, secret, timeout)
    except BaseException:
        _close(sock)
        raise
    return sock


def peer_name(address: object) -> str:
    """``host:port`` of an ``accept()`` address, for :func:`serve_handshake`'s log line."""
    if isinstance(address, tuple) and len(address) >= 2:
        host = address[0]
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return str(address) or "?"
