"""TLS for client connections, sans-I/O.

A :class:`TLSSession` is an :class:`ssl.SSLObject` between two memory BIOs:
the connection feeds it the bytes it read from the socket and gets back the
plaintext (and the bytes the handshake wants sent), and hands it plaintext
to encrypt. It owns no socket and no clock, so the connection keeps its own
event-loop reading and writing (its batch writer, its byte offsets), and
the TLS state never hides bytes from it: every read drains the SSL object,
so nothing decrypted waits inside it for a readable socket that never comes.

:func:`server_context` makes the listeners' :class:`ssl.SSLContext` from
the ``[tls]`` files, read as the link secret is (regular files; the key
private to its owner), every failure one line naming the file.
"""
from __future__ import annotations

import logging
import os
import ssl
from typing import Any, Callable, Final, List, NamedTuple, Optional, Protocol, Tuple

from ..privatefile import PrivateFileError, read_private, read_regular

log: Final = logging.getLogger("queueserver.tls")

#: The first byte of a TLS record carrying a handshake (a ClientHello starts with it).
HANDSHAKE_RECORD: Final = 0x16
#: The first bytes of a TLS client's hello: a handshake record, TLS major version 3.
TLS_HELLO: Final = b"\x16\x03"
READ_SIZE: Final = 65536
DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0


class TLSError(Exception):
    """The peer's TLS failed (a bad handshake, a broken record); str() is one line."""


class TLSConfigError(ValueError):
    """A certificate, key or CA file cannot be used; str() is one line naming it."""


def looks_like_tls(data: bytes) -> bool:
    """Whether a connection's first bytes are a TLS client's hello."""
    return data[:2] == TLS_HELLO or data == TLS_HELLO[:1]


class _Records(Protocol):
    """What :class:`TLSSession` reads and writes records with."""

    def read(self, size: int) -> bytes: ...
    def write(self, data: bytes) -> int: ...
    def pending(self) -> int: ...


class TLSSession:
    """One TLS connection's state: bytes in, plaintext out; plaintext in,
    bytes out. :meth:`receive` and :meth:`encrypt` raise :class:`TLSError`
    when the peer's TLS fails; after :meth:`receive`, :meth:`outgoing` holds
    what must be sent (handshake messages, session tickets, alerts)."""

    __slots__ = ("_incoming", "_outgoing", "_tls", "_records", "handshake_done", "peer_closed", "received")

    def __init__(self, context: ssl.SSLContext, server_side: bool = True,
                 server_hostname: Optional[str] = None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname)
        #: what reads and writes records: the C object inside the SSLObject
        #: where there is one (its read, write and pending without a Python
        #: call around each: 0.7 µs of a job cycle's 9 µs of TLS, measured in
        #: docs/benchmarks.md), else the SSLObject itself
        self._records: _Records = getattr(self._tls, "_sslobj", None) or self._tls
        self.handshake_done = False
        self.peer_closed = False    # the peer sent its close_notify: no more data comes
        self.received = 0           # bytes fed so far

    def start(self) -> None:
        """A client's first step: its hello goes to :meth:`outgoing`."""
        self._handshake()

    def receive(self, data: bytes) -> bytes:
        """Feed ``data`` read from the network; returns the plaintext it completes."""
        self._incoming.write(data)
        self.received += len(data)
        if not self.handshake_done and not self._handshake():
            return b""
        chunks: List[bytes] = []
        records = self._records
        incoming = self._incoming
        # Plaintext is shorter than the records it came in, so a read of what
        # was fed usually takes it all; a bigger one would allocate (and then
        # shrink) a buffer of that size per read.
        size = min(len(data), READ_SIZE) or READ_SIZE
        while True:
            try:
                chunk = records.read(size)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            except ssl.SSLError as exc:
                raise TLSError(ssl_reason(exc)) from None
            if not chunk:
                self.peer_closed = True
                break
            chunks.append(chunk)
            if not incoming.pending and (len(chunk) < size or not records.pending()):
                break   # all fed is read (asking again would only raise SSLWantReadError)
            size = READ_SIZE   # (a record longer than what this feed completed, or more records)
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    def _handshake(self) -> bool:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as exc:
            raise TLSError(ssl_reason(exc)) from None
        self.handshake_done = True
        return True

    def encrypt(self, data: bytes) -> bytes:
        """``data`` as TLS records to send (after the handshake)."""
        try:
            self._records.write(data)
        except ssl.SSLError as exc:
            raise TLSError(ssl_reason(exc)) from None
        return self._outgoing.read()

    def close_notify(self) -> bytes:
        """Our close_notify alert, to send before closing (b"" if it cannot be made)."""
        try:
            self._tls.unwrap()
        except ssl.SSLWantReadError:   # ours is made; the peer's own close_notify is not awaited
            return self.outgoing()
        except (ssl.SSLError, ValueError):
            return b""
        return self.outgoing()

    def outgoing(self) -> bytes:
        """What the session wants sent now (b"" when nothing)."""
        return self._outgoing.read() if self._outgoing.pending else b""

    def certificate_names(self) -> Tuple[str, ...]:
        """The peer certificate's subject CN, then its SAN DNS, email and
        URI names, in order, without repeats (none without a certificate)."""
        return certificate_names(self._tls.getpeercert())

    def version(self) -> Optional[str]:
        return self._tls.version()


def certificate_names(cert: Any) -> Tuple[str, ...]:
    """The names of a decoded certificate (:meth:`ssl.SSLObject.getpeercert`'s dict)."""
    if not cert:
        return ()
    names: List[str] = []
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.append(value)
    for kind, value in cert.get("subjectAltName", ()):
        if kind in ("DNS", "email", "URI"):
            names.append(value)
    return tuple(dict.fromkeys(names))


def ssl_reason(exc: ssl.SSLError) -> str:
    """An SSL error as a short line ("certificate verify failed", "wrong version number")."""
    # (read with getattr: either may be None, whatever the stubs say, and compiled code checks types)
    reason: object = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or str(exc)
    return " ".join(str(reason).replace("_", " ").lower().split())


# ------------------------------------------------------------------ contexts
class TLSFiles(NamedTuple):
    """The ``[tls]`` files a listener's context is made of."""
    certificate: str
    key: str
    client_ca: Optional[str] = None


def server_context(files: TLSFiles) -> ssl.SSLContext:
    """A server context: TLS 1.2 at least, no compression, our cipher
    order; with a client CA, every client must present a certificate it
    signed. :class:`TLSConfigError` names the file that cannot be used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_SINGLE_ECDH_USE
    certificate = _read(read_regular, files.certificate, "TLS certificate")
    key = _read(read_private, files.key, "TLS key")
    _load_chain(context, certificate, key, files)
    if files.client_ca is not None:
        _load_ca(context, files.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(files: TLSFiles) -> ssl.SSLContext:
    """A context for asking another node of the cluster as a client: it
    presents ``files``' certificate (the node's own, so the other node knows
    who asks) and checks the other node's certificate, and its host name,
    against the client CA file, the CA that signs the cluster's
    certificates (none named: the system's trusted CAs). TLS 1.2 at least."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)   # CERT_REQUIRED and check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    certificate = _read(read_regular, files.certificate, "TLS certificate")
    key = _read(read_private, files.key, "TLS key")
    _load_chain(context, certificate, key, files)
    if files.client_ca is not None:
        _load_ca(context, files.client_ca)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    return context


def _load_ca(context: ssl.SSLContext, path: str) -> None:
    ca = _read(read_regular, path, "TLS client CA file")
    try:
        context.load_verify_locations(cadata=ca.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise TLSConfigError(f"TLS client CA file {path} holds no usable PEM certificate "
                             f"({_one_line(exc)})") from None


def _read(reader: Callable[[str, str, str], bytes], path: str, what: str) -> bytes:
    try:
        return reader(path, what, "give the path of a PEM file")
    except PrivateFileError as exc:
        raise TLSConfigError(str(exc)) from None


def _load_chain(context: ssl.SSLContext, certificate: bytes, key: bytes, files: TLSFiles) -> None:
    """Load the bytes that were checked (not the paths again, which may have
    changed since): :meth:`ssl.SSLContext.load_cert_chain` reads files only,
    so through memory files."""
    cert_fd = _memory_file("tls-certificate", certificate)
    key_fd = _memory_file("tls-key", key)
    try:
        context.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}", password=_no_password)
    except _EncryptedKey:
        raise TLSConfigError(f"TLS key {files.key} is encrypted: give an unencrypted key "
                             f"(openssl pkey -in KEY -out KEY.plain), private to the server's user") from None
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot use TLS certificate {files.certificate} with key {files.key} "
                             f"({_one_line(exc)}): check that both are PEM and that the key belongs to "
                             f"the certificate") from None
    finally:
        os.close(cert_fd)
        os.close(key_fd)


class _EncryptedKey(Exception):
    pass


def _no_password() -> bytes:
    """Asked for a passphrase: the key is encrypted (never prompt on a terminal)."""
    raise _EncryptedKey()


def _memory_file(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class TLSServing(NamedTuple):
    """What a TLS listener gives each connection it accepts: the context
    (replaced on reload; a connection keeps the one it began with) and how
    long its handshake may take."""
    context: ssl.SSLContext
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT


def reloaded(serving: TLSServing, files: TLSFiles, who: str) -> TLSServing:
    """SIGHUP: ``serving`` with a context of ``files`` read again, for new
    connections (open ones keep theirs); files that cannot be used leave it
    as it is. Either way one line, naming ``who`` reads them."""
    try:
        context = server_context(files)
    except TLSConfigError as err:
        log.error("%s: keeping the TLS certificate in use: %s", who, err)
        return serving
    log.info("%s: new TLS connections use the certificate %s read again%s", who, files.certificate,
             f" (client CA {files.client_ca})" if files.client_ca else "")
    return serving._replace(context=context)
