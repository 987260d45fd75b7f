"""Durability, proven by kill -9: producers (workq and takeanumber) and
workq workers run against a durable server while shards and the router are
killed with SIGKILL at random moments and restarted by the supervisor; the
history checker (crash_history.py) then finds no acknowledged job lost and
nothing that was never added.

The short form runs in ``make test``; ``make crash-test`` runs many more
kill cycles (``QS_CRASH_CYCLES``).
"""
from __future__ import annotations

import datetime
import os
import random
import re
import signal
import socket
import struct
import time
import uuid

import pytest

from queueserver.client import Client
from queueserver.placement import shard_for

from crash_history import History, Load, drain, drain_limit, random_victim
from serverproc import ServerProcess, wait_for

CYCLES = int(os.environ.get("QS_CRASH_CYCLES", "4"))
QUEUES = ["crash-a", "crash-b", "crash-c", "crash-d"]


def durable(tmp_path, shards: int = 2, fsync: str = "always", in_loop: str = "5") -> ServerProcess:
    return ServerProcess(shards=shards, protocols=["workq", "takeanumber"],
                         extra=["--data-dir", str(tmp_path / "data"), "--fsync", fsync, "--fsync-in-loop", in_loop])


def restarted(proc: ServerProcess, name: str, old_pid: int) -> bool:
    pid = proc.child_pids().get(name)
    return pid is not None and pid != old_pid and os.path.exists(
        os.path.join(proc.runtime_dir, f"{name}.sock.ready")) if name.startswith("shard") else \
        pid is not None and pid != old_pid


@pytest.mark.parametrize("in_loop", ["5", "0"])
def test_no_acknowledged_job_is_lost_when_shards_and_the_router_are_killed(tmp_path, in_loop):
    """``in_loop`` 5: fsyncs in the shard's loop (this disk's are fast); 0:
    every fsync in a thread while the loop reads and executes the next
    requests, whose answers wait for the next commit."""
    assert {shard_for(q, 2) for q in QUEUES} == {0, 1}, "the queues must live on both shards"
    rng = random.Random(int(os.environ.get("QS_CRASH_SEED", "7")))
    history = History()
    with durable(tmp_path, in_loop=in_loop) as proc:
        load = Load(history, lambda: proc.ports, QUEUES).start()
        try:
            for _ in range(CYCLES):
                time.sleep(rng.uniform(0.3, 1.0))
                children = proc.child_pids()
                victim = random_victim(children, rng)
                os.kill(children[victim], signal.SIGKILL)
                wait_for(lambda: restarted(proc, victim, children[victim]), 30,
                         lambda: f"{victim} to be restarted:\n{proc.log_tail()}")
            time.sleep(0.5)
        finally:
            load.stop()
        # A lease whose answer died with a process may never time out (a
        # takeanumber job has no TTR): a restart makes every lease ready again.
        proc.restart()
        verdict = history.check(drain(proc.ports["workq"], QUEUES, limit=drain_limit(len(history.attempted))))
    print(verdict.summary(), dict(history.errors))
    assert verdict.acknowledged > 100, verdict.summary()
    assert verdict.lost == [], (verdict.summary(), verdict.lost)
    assert verdict.unexpected == [], verdict.summary()
    assert verdict.resurrected == [], verdict.summary()


SHUTDOWN_LINE = re.compile(r"shard (\d) log: (\d+) records appended, (\d+) fsyncs, .*; (\d+) fsyncs in a thread "
                           r"\(fsync_in_loop ([\d.]+) ms\)")


@pytest.mark.parametrize("in_loop", ["0", "1000"])
def test_fsync_in_loop_says_where_each_shards_fsyncs_ran(tmp_path, in_loop):
    """``--fsync-in-loop 0``: every fsync of both shards ran in a thread;
    1000 ms (no disk here is that slow): none did. Each shard says so when it stops."""
    with durable(tmp_path, in_loop=in_loop) as proc:
        with Client(port=proc.ports["workq"]) as client:
            for i, queue in enumerate(QUEUES * 5):
                id = str(uuid.uuid4())
                client.add(id, queue, b"x" * i, 30_000, 60_000)
            for queue in QUEUES:
                for _ in range(5):
                    job = client.lease([queue], 1000)
                    client.complete(job.id, b"done")
        proc.stop()
        lines = {int(m.group(1)): m.groups()[1:] for m in SHUTDOWN_LINE.finditer(proc.log())}
    assert sorted(lines) == [0, 1], proc.log_tail()
    for appended, fsyncs, threaded, said in lines.values():
        assert int(appended) >= 5 * 3 and int(fsyncs) > 0 and float(said) == float(in_loop)
        assert int(threaded) == (int(fsyncs) if in_loop == "0" else 0)


def test_jobs_schedules_and_ttls_survive_a_kill_of_the_whole_server(tmp_path):
    ready_id, scheduled_id, ttl_id, done_id = (
        "00000000-0000-4000-8000-00000000000%d" % i for i in range(1, 5))
    with durable(tmp_path) as proc:
        with Client(port=proc.ports["workq"]) as client:
            client.add(ready_id, "keep", b"ready", 30_000, 86_400_000)
            at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
            client.schedule(scheduled_id, "keep", b"later", 30_000, 86_400_000, at)
            client.add(ttl_id, "keep", b"mortal", 30_000, 3_600_000)
            client.add(done_id, "finish", b"done", 30_000, 86_400_000)
            before = {id: client.inspect_job(id) for id in (ready_id, scheduled_id, ttl_id)}
            job = client.lease(["keep"], 1000)
            assert job.id == ready_id
        with Client(port=proc.ports["workq"]) as client:
            assert client.lease(["finish"], 1000).id == done_id
            client.complete(done_id, b"finished")
        proc.kill()                                   # the supervisor and every child, SIGKILL
        proc.start()
        with Client(port=proc.ports["workq"]) as client:
            after = {id: client.inspect_job(id) for id in (ready_id, scheduled_id, ttl_id)}
            # The lease died with the server: the job is ready again, its attempt counted.
            assert after[ready_id].state == 3 and after[ready_id]["attempts"] == 1
            assert after[scheduled_id]["time"] == before[scheduled_id]["time"]
            assert client.inspect_scheduled_jobs("keep")[0].id == scheduled_id
            assert after[ttl_id]["created"] == before[ttl_id]["created"]
            assert after[ttl_id]["ttl"] == before[ttl_id]["ttl"] == 3_600_000
            assert client.result(done_id, 0).result == b"finished"


def test_a_reshard_that_cannot_read_a_log_is_one_line_and_changes_nothing(tmp_path):
    """Another shard count re-shards the directory (tests/test_reshard.py);
    when an old log is damaged, the start is refused in one line and the
    old shards are left exactly as they were."""
    proc = durable(tmp_path, shards=2)
    with proc:
        with Client("127.0.0.1", proc.port("workq")) as client:
            for i in range(200):
                client.add(str(uuid.uuid4()), f"q{i % 7}", b"x" * 100, 60_000, 600_000)
    data = tmp_path / "data"
    segment = sorted((data / "shard-1").glob("*.log"))[-1]
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0xFF            # a damaged record with valid ones after it
    segment.write_bytes(bytes(raw))
    before = {str(p): p.read_bytes() for p in data.rglob("*") if p.is_file() and p.name != "lock"}
    from serverproc import run_cli
    result = run_cli("serve", "--data-dir", str(data), "--shards", "3",
                     "--workq-port", "0", "--no-takeanumber", "--no-goqueue", "--no-queued",
                     "--no-taskflux", "--runtime-dir", str(tmp_path / "rt"))
    # the re-shard's progress lines, then the refusal in one line
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "re-sharding it to 3" in result.stderr
    assert "cannot re-shard data directory" in line and "its 2 shards are as they were" in line, line
    after = {str(p): p.read_bytes() for p in data.rglob("*") if p.is_file() and p.name != "lock"}
    assert after == before


def _disk_bytes(path) -> int:
    """Bytes of the log's segments; a segment that compaction removes
    between the listing and its stat counts as nothing (it is gone)."""
    total = 0
    for segment in path.rglob("*.log"):
        try:
            total += segment.stat().st_size
        except FileNotFoundError:
            pass
    return total


def test_the_log_stays_proportional_to_live_jobs_and_survives_compaction(tmp_path):
    """History is rewritten as the live jobs (from a forked child) once the
    log passes a (tiny, here) size; what is live survives kill -9."""
    proc = ServerProcess(shards=1, protocols=["workq"],
                         extra=["--data-dir", str(tmp_path / "data"), "--compact-after-bytes", "65536"])
    keep = ["00000000-0000-4000-8000-%012d" % i for i in range(5)]
    with proc:
        with Client(port=proc.ports["workq"]) as client:
            for id in keep:
                client.add(id, "kept", b"k" * 100, 60_000, 86_400_000)
            for round in range(30):
                pipe = client.pipeline()
                ids = [str(uuid.uuid4()) for _ in range(100)]
                for id in ids:
                    pipe.add(id, "churn", b"x" * 200, 60_000, 86_400_000)
                for id in ids:
                    pipe.delete(id)
                assert all(answer is None for answer in pipe.execute())
        wait_for(lambda: "log compacted" in proc.log(), 20, "a compaction")
        # 3,000 jobs of 200 bytes came and went: about 1 MB of history.
        wait_for(lambda: _disk_bytes(tmp_path / "data") < 400_000, 20,
                 lambda: f"the log to shrink ({_disk_bytes(tmp_path / 'data')} bytes)")
        assert "paused" in proc.log()
        proc.kill()
        proc.start()
        with Client(port=proc.ports["workq"]) as client:
            assert sorted(info.id for info in client.inspect_jobs("kept")) == keep
            assert client.inspect_queues().get("churn", {"ready-len": 0})["ready-len"] == 0


def test_a_log_damaged_in_the_middle_stops_the_server_with_one_line(tmp_path):
    data = tmp_path / "data"
    with ServerProcess(shards=1, protocols=["workq"], extra=["--data-dir", str(data)]) as proc:
        with Client(port=proc.ports["workq"]) as client:
            for i in range(50):
                client.add(str(uuid.uuid4()), "q", b"p" * 100, 60_000, 86_400_000)
    segment = max((data / "shard-0").glob("*.log"), key=lambda p: p.stat().st_size)
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0xFF                     # a bit flip in a record with valid ones after it
    segment.write_bytes(bytes(raw))
    from serverproc import one_line_error, run_cli
    result = run_cli("serve", "--data-dir", str(data), "--workq-port", "0", "--no-takeanumber",
                     "--no-goqueue", "--no-queued", "--no-taskflux", "--log-level", "critical",
                     "--runtime-dir", str(tmp_path / "rt"), timeout=60)
    line = one_line_error(result)
    assert "shard-0 cannot start" in line and str(segment) in line and "refusing to start" in line


def _goqueue_add(port: int, queue: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        data = b"x"
        sock.sendall(b"ADD\0" + queue + b"\0" + struct.pack("<II", 0, 60)
                     + struct.pack("<I", len(data)) + data)
        reply = b""
        while len(reply) < 6 + 8:
            chunk = sock.recv(64)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"ADDED\0"), reply
    return struct.unpack("<Q", reply[6:14])[0]


def test_goqueue_numbers_never_repeat_across_restarts_even_after_the_newest_job_goes(tmp_path):
    proc = ServerProcess(shards=2, protocols=["workq", "goqueue"],
                         extra=["--data-dir", str(tmp_path / "data"), "--compact-after-bytes", "4096"])
    with proc:
        numbers = [_goqueue_add(proc.ports["goqueue"], b"numbers") for _ in range(150)]
        with socket.create_connection(("127.0.0.1", proc.ports["goqueue"]), 5) as sock:
            for number in numbers:       # every job goes; the log keeps the highest number
                sock.sendall(b"DELETE\0" + struct.pack("<Q", number))
                assert sock.recv(16) == b"OK\0"
        wait_for(lambda: "log compacted" in proc.log(), 20, "a compaction (the snapshot keeps the number)")
        proc.kill()
        proc.start()
        again = _goqueue_add(proc.ports["goqueue"], b"numbers")
        assert again > max(numbers), (again, numbers)


def test_a_second_server_on_the_same_data_directory_is_refused_with_one_line(tmp_path):
    data = tmp_path / "data"
    with ServerProcess(shards=1, protocols=["workq"], extra=["--data-dir", str(data)]) as proc:
        from serverproc import one_line_error, run_cli
        result = run_cli("serve", "--data-dir", str(data), "--workq-port", "0", "--no-takeanumber",
                         "--no-goqueue", "--no-queued", "--no-taskflux",
                         "--runtime-dir", str(tmp_path / "rt2"))
        line = one_line_error(result)
        assert f"data directory {data} is in use by another queueserver (pid {proc.pid}" in line
