"""A durable server on a disk that fills up: requests that change state get
an error in their protocol's form, nothing unwritten is acknowledged, the
server keeps running, and it accepts changes again once space returns."""
from __future__ import annotations

import os
import socket

from queueserver.client import Client
from queueserver.client.client import ServerError

from serverproc import ServerProcess, wait_for
from test_store_faults import fill, small_fs  # noqa: F401  (a fixture: a real, tiny tmpfs)

ID = "00000000-0000-4000-8000-%012d"


def takeanumber(port: int, line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        sock.sendall(line)
        return sock.makefile("rb").readline()


def test_a_full_disk_gives_errors_in_each_protocols_form_then_service_returns(small_fs):  # noqa: F811
    proc = ServerProcess(shards=1, protocols=["workq", "takeanumber"],
                         extra=["--data-dir", os.path.join(small_fs, "data")])
    with proc:
        with Client(port=proc.ports["workq"]) as client:
            client.add(ID % 1, "q", b"before", 60_000, 86_400_000)
            filler = fill(small_fs)
            try:
                client.add(ID % 2, "q", b"x" * 4096, 60_000, 86_400_000)
                raise AssertionError("an add on a full disk was acknowledged")
            except ServerError as err:
                assert "Log write failed" in str(err) and "No space left" in str(err)
            line = takeanumber(proc.ports["takeanumber"], b"ADD q 1 " + b"y" * 4096 + b"\r\n")
            assert line.startswith(b"-ERR Log write failed"), line
            assert proc.process.poll() is None        # still serving
            os.unlink(filler)

            def accepted() -> bool:
                try:
                    client.add(ID % 3, "q", b"after", 60_000, 86_400_000)
                    return True
                except ServerError:
                    return False

            wait_for(accepted, 15, "an add to succeed once space returned")
        proc.kill()
        proc.start()
        with Client(port=proc.ports["workq"]) as client:
            ids = {info.id for info in client.inspect_jobs("q")}
            assert {ID % 1, ID % 3} <= ids
