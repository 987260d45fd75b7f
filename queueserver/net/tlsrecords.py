"""TLS 1.3 record protection (RFC 8446 §5, §7.3), sans-I/O.

Once a TLS 1.3 handshake is done, what protects the records is small: per
direction a traffic secret, the key and IV derived from it, and a record
sequence number. That is all a connection needs to move to another
process with its TLS (what kernel TLS does for a socket): the process that
did the handshake exports it (:meth:`~queueserver.net.tls.TLSSession.export`)
and the receiver goes on from there (:mod:`.tlscontinued`). The AEAD
ciphers are ``cryptography``'s (OpenSSL underneath); this module only
lays out records, nonces and the key schedule's labels.
"""
from __future__ import annotations

import hmac
from typing import Callable, Dict, Final, List, NamedTuple, Optional, Tuple, Union

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

#: record content types
ALERT: Final = 21
HANDSHAKE: Final = 22
APPLICATION_DATA: Final = 23
#: the largest plaintext of a record, and of its ciphertext (RFC 8446 §5.2)
MAX_PLAINTEXT: Final = 1 << 14
MAX_CIPHERTEXT: Final = MAX_PLAINTEXT + 256
HEADER: Final = 5
TAG: Final = 16
#: records one key protects before the sender moves to the next (a KeyUpdate):
#: far inside AES-GCM's limit of 2^24.5 full records (RFC 8446 §5.5)
KEY_RECORDS: Final = 1 << 23


class Suite(NamedTuple):
    name: str
    aead: Callable[[bytes], Union[AESGCM, ChaCha20Poly1305]]
    key_length: int
    hash: str            # the key schedule's hash, as hmac names it
    hash_length: int


#: the TLS 1.3 cipher suites OpenSSL offers by default, by the name ``SSLObject.cipher()`` gives
SUITES: Final[Dict[str, Suite]] = {
    "TLS_AES_128_GCM_SHA256": Suite("TLS_AES_128_GCM_SHA256", AESGCM, 16, "sha256", 32),
    "TLS_AES_256_GCM_SHA384": Suite("TLS_AES_256_GCM_SHA384", AESGCM, 32, "sha384", 48),
    "TLS_CHACHA20_POLY1305_SHA256": Suite("TLS_CHACHA20_POLY1305_SHA256", ChaCha20Poly1305, 32, "sha256", 32),
}


class RecordError(Exception):
    """A record that must end the connection; ``alert`` is the TLS alert to send."""

    def __init__(self, alert: int, message: str) -> None:
        super().__init__(message)
        self.alert = alert


#: alert descriptions (RFC 8446 §6); of those a peer sends, close_notify
#: ends its data and user_canceled nothing, every other one the connection
CLOSE_NOTIFY: Final = 0
UNEXPECTED_MESSAGE: Final = 10
BAD_RECORD_MAC: Final = 20
RECORD_OVERFLOW: Final = 22
ILLEGAL_PARAMETER: Final = 47
DECODE_ERROR: Final = 50
USER_CANCELED: Final = 90


def expand_label(suite: Suite, secret: bytes, label: bytes, length: int) -> bytes:
    """HKDF-Expand-Label with an empty context (RFC 8446 §7.1). Every length
    asked here is at most the hash's, so HKDF-Expand is its first block."""
    full = b"tls13 " + label
    info = length.to_bytes(2, "big") + bytes([len(full)]) + full + b"\x00"
    return hmac.new(secret, info + b"\x01", suite.hash).digest()[:length]


def next_secret(suite: Suite, secret: bytes) -> bytes:
    """The traffic secret after a KeyUpdate (RFC 8446 §7.2)."""
    return expand_label(suite, secret, b"traffic upd", suite.hash_length)


class Direction:
    """One direction's protection: its secret, key, IV and sequence number."""

    __slots__ = ("suite", "secret", "seq", "_aead", "_iv")

    def __init__(self, suite: Suite, secret: bytes, seq: int = 0) -> None:
        self.suite = suite
        self.secret = secret
        self.seq = seq
        self._aead = suite.aead(expand_label(suite, secret, b"key", suite.key_length))
        self._iv = int.from_bytes(expand_label(suite, secret, b"iv", 12), "big")

    def updated(self) -> "Direction":
        return Direction(self.suite, next_secret(self.suite, self.secret))

    def seal(self, content_type: int, content: bytes) -> bytes:
        """One record of ``content`` (at most :data:`MAX_PLAINTEXT` bytes)."""
        inner = content + bytes((content_type,))
        header = b"\x17\x03\x03" + (len(inner) + TAG).to_bytes(2, "big")
        nonce = (self._iv ^ self.seq).to_bytes(12, "big")
        self.seq += 1
        return header + self._aead.encrypt(nonce, inner, header)

    def open(self, header: bytes, body: bytes) -> Tuple[int, bytes]:
        """The content type and content of the record ``header`` + ``body``
        (:class:`RecordError` if it does not authenticate or is malformed)."""
        nonce = (self._iv ^ self.seq).to_bytes(12, "big")
        try:
            inner = self._aead.decrypt(nonce, body, header)
        except InvalidTag:
            raise RecordError(BAD_RECORD_MAC, "a record failed its authentication") from None
        self.seq += 1
        end = len(inner)
        while end and not inner[end - 1]:   # zero padding after the content type
            end -= 1
        if not end:
            raise RecordError(UNEXPECTED_MESSAGE, "a record with no content type")
        if end - 1 > MAX_PLAINTEXT:
            raise RecordError(RECORD_OVERFLOW, "a record longer than TLS allows")
        return inner[end - 1], inner[:end - 1]


def record_header(data: bytes, pos: int) -> int:
    """The length of the protected record whose header is at ``pos``
    (:class:`RecordError` if it is not one TLS 1.3 sends after its handshake)."""
    if data[pos] != APPLICATION_DATA or data[pos + 1] != 3 or data[pos + 2] != 3:
        raise RecordError(UNEXPECTED_MESSAGE, "a record that is not protected application data")
    length = (data[pos + 3] << 8) | data[pos + 4]
    if length > MAX_CIPHERTEXT:
        raise RecordError(RECORD_OVERFLOW, "a record longer than TLS allows")
    return length


def count_records(data: bytes) -> int:
    """How many records ``data`` (whole records, as a TLS library wrote them) holds."""
    count = pos = 0
    size = len(data)
    while pos + HEADER <= size:
        pos += HEADER + ((data[pos + 3] << 8) | data[pos + 4])
        count += 1
    return count


def last_record(data: bytes) -> bytes:
    """The last of the whole records ``data`` holds (b"" if none)."""
    pos = 0
    last = b""
    size = len(data)
    while pos + HEADER <= size:
        end = pos + HEADER + ((data[pos + 3] << 8) | data[pos + 4])
        if end > size:
            break
        last = data[pos:end]
        pos = end
    return last


class Exported(NamedTuple):
    """A TLS 1.3 connection's protection, as it moves to another process:
    what the peer sends (``read``) and what we send (``write``), each a
    secret and the next sequence number; ``partial``: bytes received of a
    record not complete yet; ``outgoing``: records made but not sent."""

    suite: str
    read_secret: bytes
    read_seq: int
    write_secret: bytes
    write_seq: int
    partial: bytes = b""
    outgoing: bytes = b""

    def pack(self) -> List[object]:
        return list(self)

    @classmethod
    def unpack(cls, fields: List[object]) -> Optional["Exported"]:
        """The state a move carried (None if it is not one)."""
        try:
            state = cls(*fields)   # type: ignore[arg-type]
        except TypeError:
            return None
        if state.suite not in SUITES or not isinstance(state.read_secret, bytes) \
                or not isinstance(state.write_secret, bytes) or not isinstance(state.partial, bytes) \
                or not isinstance(state.outgoing, bytes) or not isinstance(state.read_seq, int) \
                or not isinstance(state.write_seq, int):
            return None
        return state
