"""TLS 1.3 connections move with their TLS, through real processes and real
TLS clients: the shard that did the handshake hands the socket on with its
record protection (no relay), and the shard of the connection's queue
serves it directly from then on. Python's ``ssl`` and OpenSSL's
``s_client`` (whose KeyUpdates and cipher suites Python cannot choose)
never learn that the other end changed processes."""
from __future__ import annotations

import json
import os
import re
import select
import socket
import ssl
import subprocess
from pathlib import Path
from typing import List

import pytest

from queueserver.router import shard_for
from tests.serverproc import ServerProcess, http_get, wait_for
# (the fixtures are test_tls_direct's: a CA with a server certificate, and a 2-shard server of this module's own)
from tests.test_tls_direct import Certificates, certs, executed_by, two_shards  # noqa: F401
from tests.wire import Wire, add, new_id


def queue_on(shard: int, prefix: str) -> str:
    """A new queue name that lives on ``shard`` (of 2)."""
    while True:
        name = f"{prefix}-{new_id()[:8]}"
        if shard_for(name, 2) == shard:
            return name


def shard_counts(proc: ServerProcess, key: str) -> List[int]:
    return [int(shard[key]) for shard in json.loads(http_get(proc, "/status"))["shards"]]


def test_a_connection_moves_to_its_queues_shard_with_its_tls(two_shards: ServerProcess,
                                                            certs: Certificates) -> None:
    """Connections land on the shards in turn; each works one queue, so of
    two in a row for one queue, one lands on the wrong shard and moves, once, with its TLS: every
    request is executed by the queue's shard, nothing is relayed, and
    answers of several records (a 100 KB job) come whole both ways."""
    moves_before = sum(shard_counts(two_shards, "tls_moves"))
    payload = os.urandom(50000).hex().encode()   # 100,000 bytes: seven records each way
    queues = [queue_on(0, "moves-a"), queue_on(1, "moves-b")]
    for queue in (queues[0], queues[0], queues[1], queues[1]):
        with certs.connect(two_shards) as sock:
            w = Wire(sock)
            id = new_id()
            assert w.call(add(id, queue, payload)) == b"+OK\r\n"
            assert w.call(f"lease {queue} 1000\r\n".encode()) == \
                f"+OK 1\r\n{id} {queue} {len(payload)}\r\n".encode() + payload + b"\r\n"
            assert w.call(f"complete {id} 2\r\nok\r\n".encode()) == b"+OK\r\n"
            assert w.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 1 2\r\nok\r\n".encode()
    wait_for(lambda: len(executed_by(two_shards, queues[0])) >= 4 and len(executed_by(two_shards, queues[1])) >= 4,
             10, "the debug lines of the requests")
    assert set(executed_by(two_shards, queues[0])) == {"shard-0"}
    assert set(executed_by(two_shards, queues[1])) == {"shard-1"}
    assert sum(shard_counts(two_shards, "tls_moves")) - moves_before == 2   # the two that landed wrong
    assert shard_counts(two_shards, "tls_relays") == [0, 0]
    assert re.search(rb'^queueserver_tls_moves_total\{node="[^"]*",shard="[01]"\} [1-9]',
                     http_get(two_shards, "/metrics"), re.M)


def test_pipelined_requests_for_both_shards_follow_the_connection_in_order(two_shards: ServerProcess,
                                                                           certs: Certificates) -> None:
    """A client that alternates between the shards' queues, pipelined: its
    connection moves on at each change, TLS and unread requests with it,
    and every answer comes once, in order."""
    a, b = queue_on(0, "pipe-a"), queue_on(1, "pipe-b")
    with certs.connect(two_shards) as sock:
        w = Wire(sock)
        ids = [new_id() for _ in range(8)]
        w.send(b"".join(add(id, (a, b)[i % 2], f"p{i}".encode()) for i, id in enumerate(ids)))
        assert [w.reply() for _ in ids] == [b"+OK\r\n"] * 8
        w.send(b"".join(f"lease {(a, b)[i % 2]} 1000\r\n".encode() for i in range(8)))
        for i, id in enumerate(ids):
            assert w.reply() == f"+OK 1\r\n{id} {(a, b)[i % 2]} 2\r\np{i}\r\n".encode()
    assert shard_counts(two_shards, "tls_relays") == [0, 0]


class SClient:
    """``openssl s_client`` as a workq client: lines in (CRLF added), bytes out."""

    def __init__(self, proc: ServerProcess, certs: Certificates, *flags: str) -> None:
        self.process = subprocess.Popen(
            ["openssl", "s_client", "-quiet", "-no_ign_eof", "-crlf", "-tls1_3",
             "-connect", f"{proc.host}:{proc.ports['workq_tls']}", "-CAfile", str(certs.ca.cert),
             "-verify_return_error", "-servername", "localhost", *flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.said = b""   # its stderr so far
        self.updates = 0

    def key_update(self, letter: str) -> None:
        """``k`` (a KeyUpdate) or ``K`` (one whose answer is asked for); waits
        until s_client says it did it: it drops what else its read of stdin held."""
        assert self.process.stderr is not None
        self.send(letter)
        while self.said.count(b"KEYUPDATE") < self.updates + 1 \
                and select.select([self.process.stderr], [], [], 20)[0]:
            chunk = os.read(self.process.stderr.fileno(), 4096)
            if not chunk:
                break
            self.said += chunk
        self.updates += 1
        assert self.said.count(b"KEYUPDATE") == self.updates, self.said

    def send(self, *lines: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("".join(f"{line}\n" for line in lines).encode())
        self.process.stdin.flush()

    def read(self, expected: bytes) -> bytes:
        assert self.process.stdout is not None
        got = b""
        while len(got) < len(expected) and select.select([self.process.stdout], [], [], 20)[0]:
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                break
            got += chunk
        return got

    def call(self, *lines: str, expected: bytes) -> None:
        self.send(*lines)
        assert self.read(expected) == expected

    def close(self) -> str:
        """Ends it; returns what it wrote on stderr."""
        self.process.kill()
        _, err = self.process.communicate(timeout=10)
        return (self.said + err).decode(errors="replace")


def job_cycle(client: SClient, queue: str, payload: str = "x") -> None:
    id = new_id()
    client.call(f"add {id} {queue} 1000 60000 {len(payload)}", payload, expected=b"+OK\r\n")
    client.call(f"lease {queue} 1000", expected=f"+OK 1\r\n{id} {queue} {len(payload)}\r\n{payload}\r\n".encode())
    client.call(f"complete {id} 0", "", expected=b"+OK\r\n")


def test_openssl_key_updates_before_and_after_a_move(two_shards: ServerProcess, certs: Certificates) -> None:
    """``s_client``'s ``k`` (KeyUpdate) and ``K`` (KeyUpdate, answer asked
    for) on a connection that has moved, and moves again after them."""
    a, b = queue_on(0, "ku-a"), queue_on(1, "ku-b")
    client = SClient(two_shards, certs)
    try:
        job_cycle(client, a)
        job_cycle(client, b)   # (on one of the two it arrived by a move)
        client.key_update("k")
        job_cycle(client, b)
        client.key_update("K")
        job_cycle(client, b, "after the answered update")
        client.key_update("K")
        job_cycle(client, a)   # moves again, on keys updated twice each way
        client.key_update("k")
        job_cycle(client, b)
    finally:
        err = client.close()
    assert err.count("KEYUPDATE") == 4, err


@pytest.mark.parametrize("suite", ["TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256",
                                   "TLS_AES_256_GCM_SHA384"])
def test_each_tls_1_3_cipher_suite_moves(two_shards: ServerProcess, certs: Certificates, suite: str) -> None:
    moves_before = sum(shard_counts(two_shards, "tls_moves"))
    a, b = queue_on(0, "suite-a"), queue_on(1, "suite-b")
    client = SClient(two_shards, certs, "-ciphersuites", suite)
    try:
        for queue in (a, b, a, b):
            job_cycle(client, queue, "x" * 20000)
    finally:
        client.close()
    assert sum(shard_counts(two_shards, "tls_moves")) - moves_before >= 3
    wait_for(lambda: re.search(rf"DEBUG connection \d+: TLSv1\.3 handshake done", two_shards.log()), 10, "the line")


def test_a_moved_connection_keeps_the_identity_its_shard_gave_it(certs: Certificates, tmp_path: Path) -> None:
    acl = tmp_path / "access.toml"
    acl.write_text('[identities.local]\nnetworks = ["127.0.0.1/32"]\nproduce = ["mine.*"]\nconsume = ["mine.*"]\n'
                   'inspect = ["*"]\n')
    with ServerProcess(shards=2, protocols=["workq"], extra=[*certs.flags(), "--acl", str(acl)],
                       log_level="debug") as proc:
        mine = [queue_on(0, "mine.a"), queue_on(1, "mine.b")]
        theirs = [queue_on(0, "theirs.a"), queue_on(1, "theirs.b")]
        for turn in range(2):   # (whichever shard each connection lands on)
            with certs.connect(proc) as sock:
                w = Wire(sock)
                for shard in (turn, 1 - turn):
                    id = new_id()
                    assert w.call(add(id, mine[shard], b"m")) == b"+OK\r\n"
                    assert w.call(add(new_id(), theirs[shard], b"t")) == \
                        f"-CLIENT-ERROR Permission denied: local may not produce queue {theirs[shard]}\r\n".encode()
                    assert w.call(f"lease {mine[shard]} 1000\r\n".encode()) == \
                        f"+OK 1\r\n{id} {mine[shard]} 1\r\nm\r\n".encode()
        assert sum(shard_counts(proc, "tls_moves")) >= 2


def handshakes(proc: ServerProcess) -> int:
    return len(re.findall(r"DEBUG connection \d+: TLSv1\.3 handshake done", proc.log()))


def test_a_key_update_right_after_the_handshake_is_answered_and_the_connection_moves(
        two_shards: ServerProcess, certs: Certificates) -> None:
    """The session leaves OpenSSL as its handshake ends (checked against its
    own session ticket): a KeyUpdate before any request is taken by the
    shard's own record code, answered, and the connection still moves with
    its TLS, relayed nowhere."""
    a, b = queue_on(0, "early-a"), queue_on(1, "early-b")
    before = handshakes(two_shards)
    moves = sum(shard_counts(two_shards, "tls_moves"))
    client = SClient(two_shards, certs)
    try:
        wait_for(lambda: handshakes(two_shards) > before, 10, "the handshake")
        client.key_update("K")
        job_cycle(client, a)
        job_cycle(client, b)   # (on one of the two it must move)
        job_cycle(client, a)
        assert shard_counts(two_shards, "tls_relays") == [0, 0]
    finally:
        client.close()
    assert sum(shard_counts(two_shards, "tls_moves")) - moves >= 2
