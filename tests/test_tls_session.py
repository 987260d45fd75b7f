"""The sans-I/O TLS session: two sessions talking to each other in memory,
and the server context's checks of its files."""
from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Tuple

import pytest

from queueserver.net.tls import (TLSConfigError, TLSError, TLSFiles, TLSSession, certificate_names,
                                 looks_like_tls, server_context)
from tests.tls_certs import CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Tuple[CA, CA, Path]:
    base = tmp_path_factory.mktemp("pki")
    return CA(base, "ca-one"), CA(base, "ca-two"), base


def client_context(ca: CA, cert: object = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))  # type: ignore[attr-defined]
    return context


def pump(client: TLSSession, server: TLSSession) -> None:
    """Carry bytes both ways until neither side has more to say."""
    for _ in range(10):
        to_server = client.outgoing()
        if to_server:
            server.receive(to_server)
        to_client = server.outgoing()
        if to_client:
            client.receive(to_client)
        if not to_server and not to_client:
            return


def connected_without_client_ca(ca: CA, name: str) -> Tuple[TLSSession, TLSSession]:
    """A server (certificate ``name`` of ``ca``, no client CA) and a client, handshake done."""
    server_cert = ca.issue(name, server=True)
    server = TLSSession(server_context(TLSFiles(str(server_cert.cert), str(server_cert.key))))
    client = TLSSession(client_context(ca), server_side=False, server_hostname="localhost")
    client.start()
    pump(client, server)
    return server, client


def test_handshake_then_data_both_ways_and_the_client_names(pki: Tuple[CA, CA, Path]) -> None:
    one, _, _ = pki
    server_cert = one.issue("server", server=True)
    alice = one.issue("alice", sans="DNS:alice.example,email:alice@example.com,URI:spiffe://q/alice")
    context = server_context(TLSFiles(str(server_cert.cert), str(server_cert.key), str(one.cert)))
    server = TLSSession(context)
    client = TLSSession(client_context(one, alice), server_side=False, server_hostname="localhost")
    client.start()
    assert not server.handshake_done
    pump(client, server)
    assert server.handshake_done and client.handshake_done
    assert server.certificate_names() == ("alice", "alice.example", "alice@example.com", "spiffe://q/alice")
    assert server.version() in ("TLSv1.2", "TLSv1.3")
    records = client.encrypt(b"add q 0 0 5\r\nhello\r\n")
    assert b"hello" not in records
    # split anywhere: the plaintext comes once the record is whole
    assert server.receive(records[:7]) == b""
    assert server.receive(records[7:]) == b"add q 0 0 5\r\nhello\r\n"
    assert client.receive(server.encrypt(b"OK\r\n") + server.encrypt(b"more\r\n")) == b"OK\r\nmore\r\n"


def test_every_byte_fed_comes_out_however_the_records_are_cut(pki: Tuple[CA, CA, Path]) -> None:
    """A read asks for as many bytes as were fed: a feed that ends a long
    record, one that carries many records, and records fed a byte at a
    time still give all their plaintext, in order, from that feed."""
    server, client = connected_without_client_ca(pki[0], "cutter")
    long = bytes(range(256)) * 200                     # 51,200 bytes: four records
    records = client.encrypt(long)
    first = server.receive(records[:-10])               # all but the end of the last record
    rest = server.receive(records[-10:])                # 10 bytes fed, thousands of bytes out
    assert len(rest) > 10 and first + rest == long
    many = b"".join(client.encrypt(b"req %d\r\n" % n) for n in range(50))
    assert server.receive(many) == b"".join(b"req %d\r\n" % n for n in range(50))
    one_record = client.encrypt(b"x" * 300)
    out = b"".join(server.receive(one_record[i:i + 1]) for i in range(len(one_record)))
    assert out == b"x" * 300
    whole = client.encrypt(long)
    got = b"".join(server.receive(whole[i:i + 1000]) for i in range(0, len(whole), 1000))
    assert got == long


def test_a_client_of_another_ca_fails_the_handshake(pki: Tuple[CA, CA, Path]) -> None:
    one, two, _ = pki
    server_cert = one.issue("server2", server=True)
    mallory = two.issue("mallory")
    server = TLSSession(server_context(TLSFiles(str(server_cert.cert), str(server_cert.key), str(one.cert))))
    client = TLSSession(client_context(one, mallory), server_side=False, server_hostname="localhost")
    client.start()
    with pytest.raises(TLSError, match="certificate"):
        pump(client, server)
    assert not server.handshake_done


def test_no_client_ca_means_no_client_certificate_and_no_names(pki: Tuple[CA, CA, Path]) -> None:
    server, _ = connected_without_client_ca(pki[0], "server3")
    assert server.handshake_done and server.certificate_names() == ()


def test_garbage_is_a_tls_error_not_a_crash(pki: Tuple[CA, CA, Path]) -> None:
    one, _, _ = pki
    server_cert = one.issue("server4", server=True)
    server = TLSSession(server_context(TLSFiles(str(server_cert.cert), str(server_cert.key))))
    with pytest.raises(TLSError):
        server.receive(b"\x16\x03\x01\x00\x05hello" + b"\x00" * 40)


def test_first_bytes() -> None:
    assert looks_like_tls(b"\x16\x03\x01\x02\x00") and looks_like_tls(b"\x16")
    assert not looks_like_tls(b"add q 0 0 1\r\n") and not looks_like_tls(b"D\x00\x00")


def test_certificate_names_of_a_decoded_certificate() -> None:
    cert = {"subject": ((("organizationName", "x"),), (("commonName", "bob"),)),
            "subjectAltName": (("DNS", "bob"), ("IP Address", "10.0.0.1"), ("email", "b@x"))}
    assert certificate_names(cert) == ("bob", "b@x")
    assert certificate_names(None) == () and certificate_names({}) == ()


def test_file_problems_are_one_line_naming_the_file(pki: Tuple[CA, CA, Path]) -> None:
    one, _, base = pki
    cert = one.issue("server5", server=True)
    with pytest.raises(TLSConfigError, match=f"TLS key {cert.key} is accessible by group or others"):
        os.chmod(cert.key, 0o644)
        server_context(TLSFiles(str(cert.cert), str(cert.key)))
    os.chmod(cert.key, 0o600)
    with pytest.raises(TLSConfigError, match=f"TLS certificate {base}/nope.pem does not exist"):
        server_context(TLSFiles(str(base / "nope.pem"), str(cert.key)))
    other = one.issue("other", server=True)
    with pytest.raises(TLSConfigError, match="key belongs to the certificate"):
        server_context(TLSFiles(str(cert.cert), str(other.key)))
    with pytest.raises(TLSConfigError, match=f"client CA file {cert.key} holds no usable PEM"):
        server_context(TLSFiles(str(cert.cert), str(cert.key), str(cert.key)))
    encrypted = base / "encrypted.key"
    os.system(f"openssl pkey -in {cert.key} -aes256 -passout pass:secret -out {encrypted}")
    os.chmod(encrypted, 0o600)
    with pytest.raises(TLSConfigError, match="is encrypted"):
        server_context(TLSFiles(str(cert.cert), str(encrypted)))
    context = server_context(TLSFiles(str(cert.cert), str(cert.key), str(one.cert)))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2 and context.verify_mode == ssl.CERT_REQUIRED
    assert context.options & ssl.OP_NO_COMPRESSION and context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
