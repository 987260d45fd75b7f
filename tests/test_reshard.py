"""Changing the shard count of a data directory: started with another
``--shards``, the server re-shards its jobs first (real processes, real
logs), and a crash at any step of the change leaves the jobs of the old
count or of the new one, never both or neither."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from queueserver.datadir import DataDir, read_layout
from serverproc import ServerProcess, wait_for
from test_binary_protocols_server import GoWire, g_add, g_delete
from test_text_protocols_server import TextWire
from wire import Wire, add, inspect_field, new_id, qname

ONLY = ["--no-queued", "--no-taskflux"]


def serve(data: str, shards: int) -> ServerProcess:
    return ServerProcess(shards=shards, protocols=["workq", "takeanumber", "goqueue"],
                         extra=["--data-dir", data]).start()


def ready_len(w: Wire, queue: str) -> int:
    reply = w.call(f"inspect queue {queue}\r\n".encode())
    return int(reply.split(b"ready-len ")[1].split(b"\r\n")[0])


def test_jobs_survive_a_change_of_the_shard_count_both_ways(tmp_path):
    data = str(tmp_path / "data")
    proc = serve(data, 2)
    queues = [qname("r") for _ in range(8)]
    try:
        w = Wire(proc.connect())
        for i, queue in enumerate(queues):
            for j in range(10):
                assert w.call(add(new_id(), queue, b"%d-%d" % (i, j))) == b"+OK\r\n"
        finished, leased = new_id(), new_id()
        assert w.call(add(finished, "kept", b"f", ttl=3_600_000)) == b"+OK\r\n"
        w.call(b"lease kept 0\r\n")
        assert w.call(f"complete {finished} 6\r\nresult\r\n".encode()) == b"+OK\r\n"
        assert w.call(add(leased, "held", b"l", ttr=60_000)) == b"+OK\r\n"
        assert w.call(b"lease held 0\r\n").startswith(f"+OK 1\r\n{leased}".encode())
        g = GoWire(proc.connect("goqueue"))
        old_numbers = [g.add(queue) for queue in queues]
        t = TextWire(proc.connect("takeanumber"), b"\r\n")
        assert t.call(b"ADD tan 3 hello\r\n").startswith(b"+")
        for each in (w, g, t):
            each.close()
        for shards in (3, 1):
            proc.stop()
            proc = serve(data, shards)
            assert read_layout(data)["shards"] == shards
            assert f"re-sharding it to {shards}" in proc.log()
            w = Wire(proc.connect())
            for queue in queues:
                assert ready_len(w, queue) == 11          # 10 workq jobs and the goqueue one
            assert w.call(f"result {finished} 0\r\n".encode()) == f"+OK 1\r\n{finished} 1 6\r\nresult\r\n".encode()
            assert inspect_field(w, leased, "state") == b"3"   # ready again after the restart, charged
            assert ready_len(w, "tan") == 1
            w.close()
        g = GoWire(proc.connect("goqueue"))
        new = g.add(queues[0])
        assert new > max(old_numbers)
        for number in old_numbers + [new]:
            assert g.call(g_delete(number)) == b"OK\0", number
        g.close()
        assert not any(name.startswith(".reshard") for name in os.listdir(data))
    finally:
        proc.stop()


def _renames_of_a_reshard(tmp_path, crash_at: int):
    """Re-shard in this process with ``os.rename`` failing at its
    ``crash_at``-th call (a crash there); None if it got that far."""
    import queueserver.reshard as R

    real, calls = os.rename, [0]

    def rename(src, dst):
        calls[0] += 1
        if calls[0] == crash_at:
            raise KeyboardInterrupt("crash")
        return real(src, dst)

    R.os.rename = rename
    try:
        directory = DataDir(str(tmp_path / "data"))
        try:
            directory.acquire(3, True)
        except KeyboardInterrupt:
            return True
        finally:
            directory.release()
        return None
    finally:
        R.os.rename = real


def test_a_crash_at_any_step_of_a_reshard_keeps_every_job_once(tmp_path):
    data = str(tmp_path / "data")
    proc = serve(data, 2)
    queues = [qname("c") for _ in range(6)]
    w = Wire(proc.connect())
    for queue in queues:
        w.send(b"".join(add(new_id(), queue) for _ in range(50)))
        for _ in range(50):
            assert w.reply() == b"+OK\r\n"
    w.close()
    proc.stop()
    pristine = str(tmp_path / "pristine")
    subprocess.run(["cp", "-a", data, pristine], check=True)
    crash_at = 1
    while True:
        subprocess.run(["rm", "-rf", data], check=True)
        subprocess.run(["cp", "-a", pristine, data], check=True)
        crashed = _renames_of_a_reshard(tmp_path, crash_at)
        # the next start (asking for 3 shards again) ends with every job once
        proc = serve(data, 3)
        try:
            w = Wire(proc.connect())
            assert [ready_len(w, queue) for queue in queues] == [50] * 6, crash_at
            w.close()
        finally:
            proc.stop()
        if crashed is None:
            break
        crash_at += 1
    assert crash_at > 5    # the snapshots' and the switch's renames were each a crash point


def test_a_supervisor_killed_while_resharding_loses_nothing(tmp_path):
    """A kill -9 while the new shards are being written: the next start
    finds the old shards untouched, or the new ones whole."""
    data = str(tmp_path / "data")
    proc = serve(data, 2)
    w = Wire(proc.connect())
    queues = [qname("k") for _ in range(4)]
    for queue in queues:
        w.send(b"".join(add(new_id(), queue, b"x" * 200) for _ in range(5000)))
        for _ in range(5000):
            assert w.reply() == b"+OK\r\n"
    w.close()
    proc.stop()
    argv = [sys.executable, "-m", "queueserver", "serve", "--shards", "3", "--data-dir", data,
            "--runtime-dir", str(tmp_path / "rt"), "--workq-port", "0", "--metrics-port", "0", *ONLY,
            "--takeanumber-port", "0", "--goqueue-port", "0"]
    killer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.isdir(os.path.join(data, ".reshard")), 30, "the re-shard to start")
        time.sleep(0.2)
    finally:
        killer.send_signal(signal.SIGKILL)
        killer.wait()
    for shards in (2, 3):   # whatever the crash left, a start with either count serves it all
        proc = serve(data, shards)
        try:
            w = Wire(proc.connect())
            assert [ready_len(w, queue) for queue in queues] == [5000] * 4
            w.close()
        finally:
            proc.stop()
