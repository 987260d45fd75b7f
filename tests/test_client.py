"""queueserver.client and the worker against a real server."""
from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import uuid

import pytest

from queueserver.client import Client, ClientError, ConnectionLost, Job, NotFound, Result, TimedOut
from queueserver.client import Worker
from serverproc import ServerProcess, wait_for

import worker_jobs

HERE = os.path.dirname(os.path.abspath(__file__))


def new_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(shards=2, protocols=["workq"]).start()
    yield proc
    proc.stop()


@pytest.fixture
def client(server):
    with Client("127.0.0.1", server.port(), timeout=10) as c:
        yield c


def test_every_command_with_typed_results(client):
    q, id = f"c-{new_id()[:8]}", new_id()
    client.add(id, q, "hello", ttr=5000, ttl=60000, priority=3, max_attempts=2, max_fails=1)
    info = client.inspect_job(id)
    assert info.id == id and info["priority"] == 3 and info["max-attempts"] == 2 and info.state == 0
    assert info["payload"] == b"hello"
    assert client.inspect_queue(q) == {"ready-len": 1, "scheduled-len": 0}
    assert q in client.inspect_queues(0, 100)
    assert [j.id for j in client.inspect_jobs(q)] == [id]
    job = client.lease([q, "other-queue"], 1000)
    assert job == Job(id, q, b"hello")
    client.complete(id, b"done")
    assert client.result(id) == Result(id, True, b"done")
    server_info = client.inspect_server()
    assert server_info["active-clients"] >= 1 and "started" in server_info
    client.delete(id)
    with pytest.raises(NotFound):
        client.inspect_job(id)


def test_fail_and_schedule(client):
    q, id = f"c-{new_id()[:8]}", new_id()
    client.add(id, q, b"x", ttr=5000, ttl=60000)
    client.lease(q, 1000)
    client.fail(id, "broken")
    assert client.result(id, 100) == Result(id, False, b"broken")
    later = new_id()
    when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    client.schedule(later, q, b"y", ttr=1000, ttl=60000, time=when)
    [info] = client.inspect_scheduled_jobs(q)
    assert info.id == later and info["time"] == when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_errors_carry_the_servers_text(client):
    q, id = f"c-{new_id()[:8]}", new_id()
    client.add(id, q, b"x", ttr=1000, ttl=60000)
    with pytest.raises(ClientError) as err:
        client.add(id, q, b"x", ttr=1000, ttl=60000)
    assert err.value.message == "Duplicate job"
    with pytest.raises(ClientError, match="Invalid Name"):
        client.add(new_id(), "bad*name", b"x", ttr=1000, ttl=1000)
    with pytest.raises(TimedOut):
        client.lease(f"empty-{new_id()[:8]}", 100)
    with pytest.raises(NotFound):
        client.complete(new_id(), b"")


def test_run_waits_for_a_worker(server, client):
    q = f"c-{new_id()[:8]}"
    with Client("127.0.0.1", server.port()) as worker_client:
        worker = Worker(worker_client, q, worker_jobs.shout, wait_timeout=200, max_jobs=1)
        import threading
        thread = threading.Thread(target=worker.run)
        thread.start()
        result = client.run(new_id(), q, b"quiet", ttr=5000, wait_timeout=10000)
        thread.join(10)
    assert result.success and result.result == b"QUIET"


def test_pipeline_sends_a_batch_and_answers_each(client):
    q = f"c-{new_id()[:8]}"
    ids = [new_id() for _ in range(200)]
    pipe = client.pipeline()
    for id in ids:
        pipe.add(id, q, b"p" * 100, ttr=1000, ttl=60000)
    pipe.add(ids[0], q, b"dup", ttr=1000, ttl=60000)
    answers = pipe.execute()
    assert answers[:200] == [None] * 200
    assert isinstance(answers[200], ClientError) and answers[200].message == "Duplicate job"
    assert client.inspect_queue(q)["ready-len"] == 200
    cleanup = client.pipeline()
    for id in ids:
        cleanup.delete(id)
    assert cleanup.execute() == [None] * 200


def test_worker_completes_fails_and_respects_ttr(server, client):
    q = f"w-{new_id()[:8]}"
    good, bad, slow = new_id(), new_id(), new_id()
    client.add(good, q, b"hi", ttr=5000, ttl=60000)
    client.add(bad, q, b"oops", ttr=5000, ttl=60000)
    client.add(slow, q, b"1.0", ttr=300, ttl=60000, max_attempts=1)

    def handler(job):
        return {b"hi": worker_jobs.shout, b"oops": worker_jobs.boom}.get(job.payload, worker_jobs.dawdle)(job)

    with Client("127.0.0.1", server.port()) as wc:
        worker = Worker(wc, q, handler, wait_timeout=100, max_jobs=2)
        assert worker.run() == 2
        worker.max_jobs = None
        worker.process(wc.lease(q, 1000))  # the slow one: outlives its TTR
    assert client.result(good) == Result(good, True, b"HI")
    failed = client.result(bad)
    assert not failed.success and b"ValueError: cannot handle b'oops'" in failed.result
    # Not reported by the worker: the server failed it at TTR (max-attempts 1), with no result.
    assert client.result(slow, 3000) == Result(slow, False, b"")


def test_reconnects_after_the_router_restarts():
    # A router-served connection dies with its router (a direct one would not).
    proc = ServerProcess(shards=1, protocols=["workq"], extra=["--no-direct-path"]).start()
    try:
        port = proc.port()
        client = Client("127.0.0.1", port, timeout=5)
        client.add(new_id(), "rc", b"x", ttr=1000, ttl=60000)
        router = proc.child_pids()["router"]
        os.kill(router, signal.SIGKILL)
        wait_for(lambda: proc.child_pids()["router"] != router, 20, "the router to restart")
        restarted = proc.child_pids()["router"]
        ready = os.path.join(proc.runtime_dir, "router-0.ready")

        def serving() -> bool:   # a router writes its pid there once it serves
            with open(ready) as f:
                return f.read() == str(restarted)

        wait_for(serving, 20, "the restarted router to serve")
        # Follow the port ports.json gives (the test used port 0).
        with open(os.path.join(proc.runtime_dir, "ports.json")) as f:
            import json
            new_port = json.load(f)["workq"]
        with pytest.raises((ConnectionLost, OSError)):
            client.add(new_id(), "rc", b"x", ttr=1000, ttl=60000)
        client.port = new_port
        client.add(new_id(), "rc", b"x", ttr=1000, ttl=60000)  # reconnects by itself
        # The shard kept its jobs: the router relearned them from the shard.
        assert client.inspect_queue("rc")["ready-len"] == 2
        client.close()
    finally:
        proc.stop()


def _readme_blocks():
    with open(os.path.join(HERE, "..", "README.md")) as f:
        text = f.read()
    return dict(re.findall(r"```python\n# (\S+)\n(.*?)```", text, re.S))


def test_readme_producer_and_worker_example_runs_as_is(server, tmp_path):
    blocks = _readme_blocks()
    assert {"tasks.py", "producer.py"} <= set(blocks)
    (tmp_path / "tasks.py").write_text(blocks["tasks.py"])
    producer = blocks["producer.py"].replace("9922", str(server.port()))
    worker = subprocess.Popen(
        [sys.executable, "-m", "queueserver", "worker", "tasks:shout", "--queue", "shout",
         "--port", str(server.port()), "--wait-timeout", "200"],
        cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        out = subprocess.run([sys.executable, "-c", producer], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "b'HELLO'"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(10) == 0  # stops gracefully on SIGTERM
