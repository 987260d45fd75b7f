"""A TLS 1.3 session continued in a process that did not do its handshake.

A shard terminates the TLS of the connections a router hands it, but a
connection's queues may live on another shard. Rather than relaying every
record between processes (:mod:`.tlsrelay`), the shard exports the
session's record protection (:meth:`TLSSession.export`) and hands the
socket on with it; the process that receives both serves the connection
as its own, through a :class:`ContinuedSession`: the same interface as
the OpenSSL session it replaces, on :mod:`.tlsrecords`.

After the handshake a TLS 1.3 peer may send application data, alerts and
KeyUpdate messages; anything else (a post-handshake certificate, a
second ClientHello, a malformed record) ends the connection with the
alert RFC 8446 names, as OpenSSL would.
"""
from __future__ import annotations

from typing import Any, Final, List, Optional, Tuple

from .tls import TLSError, TLSSession
from .tlsrecords import (ALERT, APPLICATION_DATA, CLOSE_NOTIFY, DECODE_ERROR, HANDSHAKE, HEADER,
                         ILLEGAL_PARAMETER, KEY_RECORDS, MAX_PLAINTEXT, SUITES, UNEXPECTED_MESSAGE, USER_CANCELED,
                         Direction, Exported, RecordError, record_header)

#: handshake message type of a KeyUpdate (RFC 8446 §4.6.3), and its whole message as we send it
KEY_UPDATE: Final = 24
_OUR_KEY_UPDATE: Final = b"\x18\x00\x00\x01\x00"   # update_not_requested


class ContinuedSession(TLSSession):
    """A TLS 1.3 session from its exported state: bytes in, plaintext out;
    plaintext in, records out. :meth:`receive` raises :class:`TLSError`
    when the peer's records fail (the alert to send is then in
    :meth:`outgoing`)."""

    __slots__ = ("_read", "_write", "_partial", "_pending", "_handshake_bytes", "_answering_update", "names")

    def __init__(self, state: Exported, names: Tuple[str, ...] = ()) -> None:
        suite = SUITES[state.suite]
        self._read = Direction(suite, state.read_secret, state.read_seq)
        self._write = Direction(suite, state.write_secret, state.write_seq)
        self._partial = state.partial          # received bytes of a record not complete yet
        self._pending = state.outgoing         # records made, to send before the next ones
        self._handshake_bytes = b""            # a handshake message not complete yet
        self._answering_update = False         # our KeyUpdate answering the peer's waits in _pending
        self.names = names
        self.handshake_done = True
        self.peer_closed = False
        self.received = 0
        self.continued = True

    def start(self) -> None:
        """(The handshake is done.)"""

    def receive(self, data: bytes) -> bytes:
        """Feed ``data`` read from the network; returns the plaintext it completes."""
        self.received += len(data)
        buffer = self._partial + data if self._partial else data
        size = len(buffer)
        pos = 0
        chunks: List[bytes] = []
        try:
            while size - pos >= HEADER and not self.peer_closed:
                end = pos + HEADER + record_header(buffer, pos)
                if end > size:
                    break
                content_type, content = self._read.open(buffer[pos:pos + HEADER], buffer[pos + HEADER:end])
                pos = end
                if content_type == APPLICATION_DATA and not self._handshake_bytes:
                    chunks.append(content)
                elif content_type == HANDSHAKE and content:
                    self._handshake_message(content)
                elif content_type == ALERT and not self._handshake_bytes:
                    self._alert(content)
                else:
                    raise RecordError(UNEXPECTED_MESSAGE, f"a record of type {content_type} after the handshake")
        except RecordError as err:
            self._partial = b""
            self._pending += self._write.seal(ALERT, bytes((2, err.alert)))
            raise TLSError(str(err)) from None
        self._partial = buffer[pos:] if pos < size and not self.peer_closed else b""
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    def _handshake_message(self, content: bytes) -> None:
        """A KeyUpdate is the one handshake message a client sends after the handshake."""
        data = self._handshake_bytes + content
        while len(data) >= 4:
            if data[0] != KEY_UPDATE:
                raise RecordError(UNEXPECTED_MESSAGE, f"a handshake message of type {data[0]} after the handshake")
            if data[1:4] != b"\x00\x00\x01":
                raise RecordError(DECODE_ERROR, "a KeyUpdate of the wrong length")
            if len(data) < 5:
                break
            request = data[4]
            if request > 1:
                raise RecordError(ILLEGAL_PARAMETER, "a KeyUpdate with an unknown request")
            if len(data) > 5:   # the key changes after this message: nothing may follow it in its record
                raise RecordError(UNEXPECTED_MESSAGE, "data after a KeyUpdate in its record")
            data = b""
            self._read = self._read.updated()
            if request and not self._answering_update:
                self._answer_update()
        self._handshake_bytes = data

    def _answer_update(self) -> None:
        """Our KeyUpdate, under the key it retires; what follows uses the next."""
        self._pending += self._write.seal(HANDSHAKE, _OUR_KEY_UPDATE)
        self._write = self._write.updated()
        self._answering_update = True

    def _alert(self, content: bytes) -> None:
        if len(content) != 2:
            raise RecordError(DECODE_ERROR, "an alert of the wrong length")
        description = content[1]
        if description == CLOSE_NOTIFY:
            self.peer_closed = True
        elif description != USER_CANCELED:
            raise TLSError(f"the peer sent alert {description}")

    def encrypt(self, data: bytes) -> bytes:
        """``data`` as TLS records to send, after any records waiting."""
        write = self._write
        if len(data) <= MAX_PLAINTEXT:
            records = write.seal(APPLICATION_DATA, data) if data else b""
        else:
            records = b"".join(write.seal(APPLICATION_DATA, data[start:start + MAX_PLAINTEXT])
                               for start in range(0, len(data), MAX_PLAINTEXT))
        if write.seq >= KEY_RECORDS:   # this key has protected enough: the next one from here
            pending = self._pending
            self._pending = b""
            self._answering_update = False
            records = pending + records + write.seal(HANDSHAKE, _OUR_KEY_UPDATE)
            self._write = write.updated()
            return records
        if self._pending:
            records = self._pending + records
            self._pending = b""
            self._answering_update = False
        return records

    def close_notify(self) -> bytes:
        """Our close_notify alert, after any records waiting."""
        return self.outgoing() + self._write.seal(ALERT, bytes((1, CLOSE_NOTIFY)))

    def outgoing(self) -> bytes:
        pending = self._pending
        self._pending = b""
        self._answering_update = False
        return pending

    def export(self) -> Optional[Exported]:
        """The session's state, to go on in yet another process (None while
        a handshake message is half received, or after the peer's close_notify)."""
        if self._handshake_bytes or self.peer_closed:
            return None
        read, write = self._read, self._write
        return Exported(read.suite.name, read.secret, read.seq, write.secret, write.seq, self._partial,
                        self._pending)

    def certificate_names(self) -> Tuple[str, ...]:
        return self.names

    def version(self) -> Optional[str]:
        return "TLSv1.3"


def continued_session(fields: List[Any]) -> Optional[ContinuedSession]:
    """The session a move carried (:attr:`~queueserver.net.handoff.Move.tls_state`); None if it is not one."""
    state = Exported.unpack(fields)
    return ContinuedSession(state) if state is not None else None
