"""Backing up and restoring a data directory, as docs/deployment.md says to.

- A cold copy (stop the server, ``cp -a`` the data directory, start it
  again) restored on another path gives back every job as it was: ready
  jobs, a finished job with its result, a scheduled job still scheduled, a
  leased job ready again (leases are not kept across a restart), and goqueue
  numbers that do not repeat (the ``numbers`` file came along).
- A copy taken at one instant while the server runs (every process of the
  server stopped with SIGSTOP, ``cp -a``, SIGCONT: what a file-system
  snapshot captures, and what ``systemctl kill --signal=SIGSTOP`` does)
  holds every job whose add was acknowledged before the instant, while
  producers keep adding; the server goes on serving after it.
"""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import List

from queueserver.client import Client

from serverproc import ServerProcess
from test_binary_protocols_server import GoWire, g_add

PROTOCOLS = ["workq", "goqueue"]
DONE = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
LEASED = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"
LATER = "6ba7b812-9dad-11d1-80b4-00c04fd430c8"


def goqueue_add(proc: ServerProcess, queue: str) -> int:
    wire = GoWire(socket.create_connection(("127.0.0.1", proc.port("goqueue")), timeout=10))
    try:
        reply = wire.call(g_add(queue))
    finally:
        wire.close()
    assert reply.startswith(b"ADDED\0"), reply
    return struct.unpack("<Q", reply[6:14])[0]


def server(data: Path) -> ServerProcess:
    return ServerProcess(shards=2, protocols=PROTOCOLS, extra=["--data-dir", str(data)])


def copy(source: Path, target: Path) -> None:
    """The copy the page shows: ``cp -a`` (owners, modes and times kept)."""
    subprocess.run(["cp", "-a", str(source), str(target)], check=True, timeout=120)


def test_a_cold_copy_restores_every_job_as_it_was(tmp_path):
    data, backup = tmp_path / "data", tmp_path / "restored"
    with server(data) as proc, Client(port=proc.port("workq")) as client:
        for _ in range(5):
            client.add(str(uuid.uuid4()), "emails", b"hello", ttr=60000, ttl=3600000)
        client.add(DONE, "done", b"x", ttr=60000, ttl=3600000)
        client.complete(client.lease(["done"], 1000).id, b"sent")
        client.add(LEASED, "leased", b"y", ttr=60000, ttl=3600000)
        assert client.lease(["leased"], 1000).id == LEASED
        client.schedule(LATER, "later", b"z", ttr=60000, ttl=3600000, time="2099-01-01T00:00:00Z")
        numbers = [goqueue_add(proc, "thumbs") for _ in range(3)]
    copy(data, backup)
    with server(backup) as proc, Client(port=proc.port("workq")) as client:
        queues = client.inspect_queues(0, 10)
        assert {name: (q["ready-len"], q["scheduled-len"]) for name, q in queues.items()} == {
            "done": (0, 0), "emails": (5, 0), "later": (0, 1), "leased": (1, 0), "thumbs": (3, 0)}
        assert client.result(DONE, 0).result == b"sent"
        assert client.inspect_job(LEASED).state == 3            # back in line, its attempt counted
        assert [job.id for job in client.inspect_scheduled_jobs("later")] == [LATER]
        assert goqueue_add(proc, "thumbs") > max(numbers)


def test_a_copy_of_one_instant_holds_every_acknowledged_job(tmp_path):
    data, snapshot = tmp_path / "data", tmp_path / "snapshot"
    acknowledged: List[str] = []
    stop = threading.Event()
    with server(data) as proc:
        port = proc.port("workq")

        def produce() -> None:
            with Client(port=port) as client:
                while not stop.is_set():
                    id = str(uuid.uuid4())
                    client.add(id, f"q{len(acknowledged) % 7}", b"payload", ttr=60000, ttl=3600000)
                    acknowledged.append(id)

        producers = [threading.Thread(target=produce) for _ in range(2)]
        for thread in producers:
            thread.start()
        try:
            time.sleep(1.5)
            pids = [proc.process.pid, *proc.child_pids().values()]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            before = list(acknowledged)                        # acknowledged before the instant
            try:
                copy(data, snapshot)
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.5)
        finally:
            stop.set()
            for thread in producers:
                thread.join(timeout=30)
        assert len(acknowledged) > len(before) > 100, "the server served before and after the copy"
    with server(snapshot) as proc, Client(port=proc.port("workq")) as client:
        ready = sum(q["ready-len"] for q in client.inspect_queues(0, 100).values())
        assert ready >= len(before)
        for id in before:
            assert client.inspect_job(id).state == 0, id
