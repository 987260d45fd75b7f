"""A TLS 1.3 session that moves: a server session exports its record
protection and a :class:`ContinuedSession` goes on with it, in memory,
against a real OpenSSL client (Python's ``ssl``) that never learns of the
move. Byte strings only: no sockets."""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueserver.net.tls import TLSError, TLSFiles, TLSSession, server_context
from queueserver.net.tlscontinued import ContinuedSession, continued_session
from queueserver.net.tlskeylog import KeyLog, client_random
from queueserver.net.tlsrecords import KEY_RECORDS, MAX_PLAINTEXT, Exported, count_records
from tests.test_tls_session import pump
from tests.tls_certs import CA


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Tuple[CA, TLSFiles]:
    ca = CA(tmp_path_factory.mktemp("continued-pki"), "continued-ca")
    cert = ca.issue("localhost", server=True)
    return ca, TLSFiles(str(cert.cert), str(cert.key))


@pytest.fixture()
def keylog() -> Iterator[KeyLog]:
    log = KeyLog()
    yield log
    log.close()


def connected(files: Tuple[CA, TLSFiles], keylog: KeyLog,
              version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3) -> Tuple[TLSSession, TLSSession]:
    """A server session whose context logs to ``keylog``, and an OpenSSL client, handshake done."""
    ca, tls_files = files
    context = server_context(tls_files)
    keylog.attach(context)
    server = TLSSession(context, keylog=keylog)
    client_context = ssl.create_default_context(cafile=str(ca.cert))
    client_context.maximum_version = version
    client = TLSSession(client_context, server_side=False, server_hostname="localhost")
    client.start()
    pump(client, server)
    assert server.handshake_done and client.handshake_done
    return server, client


def moved(server: TLSSession) -> ContinuedSession:
    """``server`` exported, the state carried as a move carries it (a msgpack-able list)."""
    state = server.export()
    assert state is not None
    session = continued_session(state.pack())
    assert session is not None
    return session


def test_a_session_moves_after_a_request_and_the_client_never_knows(files: Tuple[CA, TLSFiles],
                                                                    keylog: KeyLog) -> None:
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"add q 0 0 5\r\nhello\r\n")) == b"add q 0 0 5\r\nhello\r\n"
    assert client.receive(server.encrypt(b"+OK\r\n")) == b"+OK\r\n"
    assert server.receive(client.encrypt(b"lease q 1000\r\n")) == b"lease q 1000\r\n"
    elsewhere = moved(server)
    assert client.receive(elsewhere.encrypt(b"+OK 1\r\n")) == b"+OK 1\r\n"
    assert elsewhere.receive(client.encrypt(b"complete\r\n")) == b"complete\r\n"
    # and on again, as often as it moves
    third = moved(elsewhere)
    assert third.receive(client.encrypt(b"again\r\n")) == b"again\r\n"
    assert client.receive(third.encrypt(b"+OK\r\n")) == b"+OK\r\n"


def test_long_messages_cut_anywhere_come_out_whole_both_ways(files: Tuple[CA, TLSFiles], keylog: KeyLog) -> None:
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"first\r\n")) == b"first\r\n"
    session = moved(server)
    long = bytes(range(256)) * 300   # 76,800 bytes: five records each way
    records = client.encrypt(long)
    got = b"".join(session.receive(records[start:start + 997]) for start in range(0, len(records), 997))
    assert got == long
    a = client.encrypt(b"a")
    assert session.receive(a[:3]) == b""   # a header cut short waits for the rest
    assert session.receive(a[3:]) == b"a"
    answer = session.encrypt(long)
    assert count_records(answer) == -(-len(long) // MAX_PLAINTEXT)
    assert client.receive(answer) == long
    # a record a byte at a time, then many records in one read
    one = client.encrypt(b"byte by byte")
    assert b"".join(session.receive(one[i:i + 1]) for i in range(len(one))) == b"byte by byte"
    many = b"".join(client.encrypt(b"%d;" % i) for i in range(50))
    assert session.receive(many) == b"".join(b"%d;" % i for i in range(50))


def test_a_session_is_exported_as_its_handshake_ends_checked_against_its_ticket(files: Tuple[CA, TLSFiles],
                                                                                keylog: KeyLog) -> None:
    """Before the client sent a record, the check opens our last session
    ticket with the secret that would be handed on."""
    server, client = connected(files, keylog)
    session = moved(server)
    assert session.receive(client.encrypt(b"first\r\n")) == b"first\r\n"
    assert client.receive(session.encrypt(b"+OK\r\n")) == b"+OK\r\n"


def test_a_secret_that_does_not_open_the_last_record_keeps_the_session_for_good(files: Tuple[CA, TLSFiles],
                                                                               keylog: KeyLog) -> None:
    """(A KeyUpdate OpenSSL took looks so: the client's records are under a
    key the log never showed.) It is not asked again: it stays, and is relayed if it must move."""
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
    right = server._client_secret
    server._client_secret = bytes(len(right))
    assert server.export() is None
    server._client_secret = right
    assert server.export() is None   # for good
    assert server.receive(client.encrypt(b"still served\r\n")) == b"still served\r\n"


def test_a_session_half_way_through_a_record_is_not_exported(files: Tuple[CA, TLSFiles], keylog: KeyLog) -> None:
    """Only at a record boundary: the bytes of a record begun are inside
    OpenSSL, not in our hands. Records cut anywhere before are counted right."""
    server, client = connected(files, keylog)
    records = client.encrypt(b"one\r\n") + client.encrypt(b"two\r\n")
    cut = len(records) - 4
    assert server.receive(records[:cut]) == b"one\r\n"
    assert server.export() is None
    assert server.receive(records[cut:]) == b"two\r\n"
    assert server.export() is not None
    long = client.encrypt(b"z" * 40000) + client.encrypt(b"!")
    for piece in (long[:2], long[2:9], long[9:20000], long[20000:-1]):
        server.receive(piece)
        assert server.export() is None
    assert server.receive(long[-1:]) == b"!"
    session = moved(server)
    assert session.receive(client.encrypt(b"counted\r\n")) == b"counted\r\n"


def test_tls_1_2_and_sessions_without_a_key_log_stay_where_they_are(files: Tuple[CA, TLSFiles],
                                                                     keylog: KeyLog) -> None:
    server, client = connected(files, keylog, ssl.TLSVersion.TLSv1_2)
    assert server.version() == "TLSv1.2"
    assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
    assert server.export() is None
    ca, tls_files = files
    unlogged = TLSSession(server_context(tls_files))
    other = TLSSession(ssl.create_default_context(cafile=str(ca.cert)), server_side=False,
                       server_hostname="localhost")
    other.start()
    pump(other, unlogged)
    assert unlogged.receive(other.encrypt(b"x\r\n")) == b"x\r\n"
    assert unlogged.export() is None


def test_a_record_changed_on_the_way_ends_the_session_with_bad_record_mac(files: Tuple[CA, TLSFiles],
                                                                         keylog: KeyLog) -> None:
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
    session = moved(server)
    record = bytearray(client.encrypt(b"pay 100\r\n"))
    record[-20] ^= 1
    with pytest.raises(TLSError, match="authentication"):
        session.receive(bytes(record))
    with pytest.raises(TLSError, match="bad record mac"):   # the client reads our alert
        client.receive(session.outgoing())


def test_what_tls_1_3_never_sends_after_its_handshake_is_refused(files: Tuple[CA, TLSFiles],
                                                                 keylog: KeyLog) -> None:
    """A plaintext record, and a record longer than TLS allows (refused from its header alone)."""
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
    state = server.export()
    assert state is not None
    with pytest.raises(TLSError, match="not protected"):
        ContinuedSession(state).receive(b"\x16\x03\x03\x00\x04abcd")
    with pytest.raises(TLSError, match="longer than TLS allows"):
        ContinuedSession(state).receive(b"\x17\x03\x03\xff\xff")


def test_close_notify_both_ways(files: Tuple[CA, TLSFiles], keylog: KeyLog) -> None:
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
    session = moved(server)
    assert client.receive(session.close_notify()) == b""
    assert client.peer_closed
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
    session = moved(server)
    assert session.receive(client.encrypt(b"last\r\n") + client.close_notify()) == b"last\r\n"
    assert session.peer_closed
    assert session.export() is None


def peer_of(state: Exported) -> ContinuedSession:
    """The client's side of ``state`` (its secrets the other way round)."""
    return ContinuedSession(Exported(state.suite, state.write_secret, state.write_seq, state.read_secret,
                                     state.read_seq))


def test_key_updates_asked_for_are_answered_and_a_worn_key_is_replaced(files: Tuple[CA, TLSFiles],
                                                                       keylog: KeyLog) -> None:
    """(The peer here is a ContinuedSession too: Python's ssl cannot send a
    KeyUpdate; tests/test_tls_moves.py has OpenSSL's s_client send them.)"""
    server, client = connected(files, keylog)
    assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
    state = server.export()
    assert state is not None
    worn = state._replace(write_seq=KEY_RECORDS - 1)
    session, peer = ContinuedSession(worn), peer_of(worn)
    # our key has protected enough records: a KeyUpdate follows the record, and the next uses the new key
    assert peer.receive(session.encrypt(b"one")) == b"one"
    assert peer.receive(session.encrypt(b"two")) == b"two"
    # the peer asks for an update (KeyUpdate, update_requested): ours answers it before our next record
    assert session.receive(peer.encrypt(b"") + bytes(peer._write.seal(22, b"\x18\x00\x00\x01\x01"))) == b""
    peer._write = peer._write.updated()
    assert session.receive(peer.encrypt(b"after")) == b"after"
    assert peer.receive(session.encrypt(b"answer")) == b"answer"
    # a handshake message that is not a KeyUpdate ends it, as does an empty handshake record
    with pytest.raises(TLSError, match="handshake message of type 1"):
        ContinuedSession(session.export()).receive(peer._write.seal(22, b"\x01\x00\x00\x00"))  # type: ignore[arg-type]
    peer._write.seq -= 1
    with pytest.raises(TLSError, match="a record of type 22"):
        session.receive(peer._write.seal(22, b""))


def test_the_key_log_gives_a_session_its_own_secrets_and_forgets_them(files: Tuple[CA, TLSFiles],
                                                                       keylog: KeyLog) -> None:
    server, _ = connected(files, keylog)
    assert len(server._client_secret) == len(server._server_secret) == 48   # (SHA-384's: AES-256-GCM first)
    assert keylog.take(b"\x00" * 32) == {}   # read once, then cut from the file
    assert client_random(b"\x16\x03\x01\x00\x10\x01") is None   # too short to hold one


# ------------------------------------------------------------ any bytes at all
@pytest.fixture(scope="module")
def recorded(files: Tuple[CA, TLSFiles]) -> Tuple[Exported, List[bytes], bytes]:
    """A moved session's state, the records an OpenSSL client sent after
    the move (messages of 1 byte to 40 KB), and their plaintext."""
    keylog = KeyLog()
    try:
        server, client = connected(files, keylog)
        assert server.receive(client.encrypt(b"x\r\n")) == b"x\r\n"
        state = server.export()
        assert state is not None
        messages = [bytes([65 + i % 26]) * size for i, size in enumerate((1, 5, 300, 16384, 16385, 40000, 7))]
        return state, [client.encrypt(message) for message in messages], b"".join(messages)
    finally:
        keylog.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=0, max_value=80000), max_size=30))
def test_the_records_cut_anywhere_give_the_same_plaintext(recorded: Tuple[Exported, List[bytes], bytes],
                                                         cuts: List[int]) -> None:
    state, records, plaintext = recorded
    stream = b"".join(records)
    session = ContinuedSession(state)
    edges = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    assert b"".join(session.receive(stream[a:b]) for a, b in zip(edges, edges[1:])) == plaintext


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.binary(max_size=400), at=st.integers(min_value=0, max_value=2000), flip=st.booleans())
def test_any_bytes_give_plaintext_or_a_tls_error_and_nothing_else(recorded: Tuple[Exported, List[bytes], bytes],
                                                                  noise: bytes, at: int, flip: bool) -> None:
    """Noise spliced into the stream, or one bit flipped: what comes out
    before the damage is the client's, and then a TLSError (with an alert
    to send), never another exception and never a forged byte."""
    state, records, plaintext = recorded
    stream = b"".join(records)
    at %= len(stream)
    damaged = stream[:at] + bytes([stream[at] ^ 1]) + stream[at + 1:] if flip else stream[:at] + noise + stream[at:]
    session = ContinuedSession(state)
    got = b""
    try:
        for start in range(0, len(damaged), 1500):
            got += session.receive(damaged[start:start + 1500])
    except TLSError:
        assert session.outgoing()   # the alert
    assert plaintext.startswith(got)
    if flip:
        assert got != plaintext   # a flipped bit never passes


def test_a_resumed_session_moves_too(files: Tuple[CA, TLSFiles], keylog: KeyLog) -> None:
    """A client that comes back with a session ticket (a PSK handshake,
    Python's ``ssl`` on its own memory BIOs): its session is exported as
    its handshake ends, as a full handshake's is."""
    server, first = connected(files, keylog)
    session = moved(server)
    assert session.receive(first.encrypt(b"x\r\n")) == b"x\r\n"
    ticket = first._tls.session   # (the tickets came with the first handshake)
    assert ticket is not None and ticket.has_ticket
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = first._tls.context.wrap_bio(incoming, outgoing, server_hostname="localhost", session=ticket)
    again = TLSSession(server._tls.context, keylog=keylog)   # (its ticket keys are the first context's)
    for _ in range(10):
        try:
            client.do_handshake()
        except ssl.SSLWantReadError:
            pass
        if outgoing.pending:
            again.receive(outgoing.read())
        reply = again.outgoing()
        if not reply:
            break
        incoming.write(reply)
    assert client.session_reused
    resumed = moved(again)
    client.write(b"resumed\r\n")
    assert resumed.receive(outgoing.read()) == b"resumed\r\n"
    incoming.write(resumed.encrypt(b"+OK\r\n"))
    assert client.read(100) == b"+OK\r\n"
