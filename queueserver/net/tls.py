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
from .tlskeylog import KeyLog, client_random
from .tlsrecords import (APPLICATION_DATA, HANDSHAKE, HEADER, SUITES, Direction, Exported, RecordError, count_records,
                         last_record)

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
    what must be sent (handshake messages, session tickets, alerts).

    With a :class:`~.tlskeylog.KeyLog`, a server session of TLS 1.3 can
    :meth:`export` its record protection once its handshake is done, to go
    on in another process (:mod:`.tlscontinued`): it takes its traffic
    secrets from the log and counts the records each side sent since."""

    __slots__ = ("_incoming", "_outgoing", "_tls", "_records", "handshake_done", "peer_closed", "received",
                 "continued", "_keylog", "_random", "_client_secret", "_server_secret", "_tracking", "_seen",
                 "_need", "_head", "_last", "_sent", "_last_ticket")

    def __init__(self, context: ssl.SSLContext, server_side: bool = True,
                 server_hostname: Optional[str] = None, keylog: Optional[KeyLog] = None) -> None:
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
        self.continued = False      # (a session continued from another process's: see .tlscontinued)
        #: where its handshake's secrets are logged (None: it cannot be exported)
        self._keylog = keylog if server_side else None
        self._random: Optional[bytes] = None    # its ClientHello's random, which names its secrets there
        self._client_secret = b""   # the traffic secrets each way, once logged
        self._server_secret = b""
        #: counting the records since the handshake (TLS 1.3 with a key log): the
        #: peer's (whose headers were seen; the bytes of its last one still to come;
        #: a header cut by a read; the last one's bytes so far) and ours
        self._tracking = False
        self._seen = 0
        self._need = 0
        self._head = b""
        self._last = b""
        self._sent = 0
        self._last_ticket = b""   # our last session ticket's record, while nothing else followed it

    def start(self) -> None:
        """A client's first step: its hello goes to :meth:`outgoing`."""
        self._handshake()

    def receive(self, data: bytes) -> bytes:
        """Feed ``data`` read from the network; returns the plaintext it completes."""
        self._incoming.write(data)
        if not self.received and self._keylog is not None:
            self._random = client_random(data)
        self.received += len(data)
        since_handshake = data
        if not self.handshake_done:
            if not self._handshake():
                return b""
            since_handshake = self._handshake_completed(data)
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
        if self._tracking:
            self._track(since_handshake)
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    def _handshake(self) -> bool:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._take_secrets()
            return False
        except ssl.SSLError as exc:
            raise TLSError(ssl_reason(exc)) from None
        self._take_secrets()
        self.handshake_done = True
        return True

    def _take_secrets(self) -> None:
        if self._keylog is not None and self._random is not None:
            secrets = self._keylog.take(self._random)
            self._client_secret = secrets.get("CLIENT_TRAFFIC_SECRET_0", self._client_secret)
            self._server_secret = secrets.get("SERVER_TRAFFIC_SECRET_0", self._server_secret)

    def _handshake_completed(self, data: bytes) -> bytes:
        """The handshake ended with ``data``: start counting records (TLS
        1.3 with its secrets logged); returns the part of ``data`` after it."""
        pending = self._incoming.pending   # (OpenSSL reads no record beyond the client's Finished)
        if self._keylog is None or pending > len(data) or self._tls.version() != "TLSv1.3" \
                or not self._client_secret or not self._server_secret:
            return b""
        tickets = self._outgoing.read()   # what the step that completed it made: under the traffic keys
        self._outgoing.write(tickets)     # (still to be sent, as it was)
        self._sent = count_records(tickets)
        self._last_ticket = last_record(tickets)
        self._tracking = True
        return data[len(data) - pending:]

    def _track(self, data: bytes) -> None:
        """Count the peer's records in ``data``, its bytes since the handshake."""
        if self._head:
            data = self._head + data
            self._head = b""
        size = len(data)
        pos = self._need
        if pos:   # the last record, begun in an earlier read, goes on here
            self._last += data[:pos]
        at = -1
        seen = 0
        while pos + HEADER <= size:
            at = pos
            pos += HEADER + ((data[pos + 3] << 8) | data[pos + 4])
            seen += 1
        if at >= 0:
            self._seen += seen
            self._last = data[at:] if at else data   # (its own bytes only: a read may be 64 KiB)
        if pos >= size:
            self._need = pos - size
        else:
            self._need = 0
            self._head = data[pos:]

    def export(self) -> Optional[Exported]:
        """Its record protection, for the connection to go on in another
        process; None unless TLS 1.3 with its secrets known, and at a record
        boundary both ways with nothing left inside OpenSSL. The peer's last
        record is opened with what would be exported first (before the peer
        sent any, our last session ticket): a key the peer changed since (a
        KeyUpdate) or a miscount shows, and the session stays."""
        if not self._tracking or self.peer_closed or self._need or self._head \
                or self._incoming.pending or self._outgoing.pending or self._records.pending():
            return None
        cipher = self._tls.cipher()
        suite = SUITES.get(cipher[0]) if cipher else None
        read_secret, write_secret = self._client_secret, self._server_secret
        if suite is None:
            return None
        if self._last:
            secret, seq, last, expected = read_secret, self._seen - 1, self._last, APPLICATION_DATA
        elif self._last_ticket:
            secret, seq, last, expected = write_secret, self._sent - 1, self._last_ticket, HANDSHAKE
        else:
            return None
        try:
            content_type, _ = Direction(suite, secret, seq).open(last[:HEADER], last[HEADER:])
        except RecordError:
            content_type = -1
        if content_type != expected:
            self._tracking = False   # keys changed (a KeyUpdate) or miscounted: for good, so asked no more
            return None
        return Exported(suite.name, read_secret, self._seen, write_secret, self._sent)

    def encrypt(self, data: bytes) -> bytes:
        """``data`` as TLS records to send (after the handshake)."""
        try:
            self._records.write(data)
        except ssl.SSLError as exc:
            raise TLSError(ssl_reason(exc)) from None
        records = self._outgoing.read()
        if self._tracking:
            self._sent += count_records(records)
            self._last_ticket = b""
        return records

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
    #: where the context logs its handshakes' secrets, so that a session can
    #: move to another process (None: sessions stay where they began)
    keylog: Optional[KeyLog] = None


def reloaded(serving: TLSServing, files: TLSFiles, who: str) -> TLSServing:
    """SIGHUP: ``serving`` with a context of ``files`` read again, for new
    connections (open ones keep theirs); files that cannot be used leave it
    as it is. Either way one line, naming ``who`` reads them."""
    try:
        context = server_context(files)
    except TLSConfigError as err:
        log.error("%s: keeping the TLS certificate in use: %s", who, err)
        return serving
    if serving.keylog is not None:
        try:
            serving.keylog.attach(context)
        except (OSError, ValueError) as err:   # (its sessions are relayed when they must move)
            log.warning("%s: TLS sessions of the certificate read again cannot move: %s", who, err)
            return serving._replace(context=context, keylog=None)
    log.info("%s: new TLS connections use the certificate %s read again%s", who, files.certificate,
             f" (client CA {files.client_ca})" if files.client_ca else "")
    return serving._replace(context=context)
