"""locust load tests for the workq protocol.

Users (pick with locust's class arguments, default: all, weighted):

- ``Producer``: adds 100-byte jobs to many queues.
- ``Consumer``: leases from those queues and completes what it gets.
- ``Mixed``: add, lease, complete on one of many queues (every shard takes load).
- ``Runner``: blocking ``run`` answered by the ``Consumer`` users.

Every command fires a locust request event (request_type ``workq``, name =
the command), with its latency and reply size. Point it at a server with
``--host tcp://127.0.0.1:9922``. ``loadtests/loadtest.py`` (``make
loadtest``) starts a server and runs a bounded headless run.
"""
from __future__ import annotations

import os
import random
import time
import uuid
from urllib.parse import urlparse

from locust import User, between, constant, events, task

from queueserver.client import Client, TimedOut, WorkqError

QUEUES = [f"load-{i}" for i in range(int(os.environ.get("QS_QUEUES", "64")))]
PAYLOAD = b"x" * 100
TTR = 30000
TTL = 600000


class WorkqUser(User):
    """A locust user with a workq client that reports every command."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        url = urlparse(self.host or "tcp://127.0.0.1:9922")
        self.client = Client(url.hostname or "127.0.0.1", url.port or 9922, timeout=60)

    def on_stop(self) -> None:
        self.client.close()

    def call(self, name: str, fn, *args, ok_errors=(), **kwargs):
        """Run one client command, reporting it to locust; expected errors count as successes."""
        started = time.perf_counter()
        exception = None
        result = None
        try:
            result = fn(*args, **kwargs)
        except ok_errors as err:
            result = err
        except (WorkqError, OSError) as err:
            exception = err
        events.request.fire(request_type="workq", name=name,
                            response_time=(time.perf_counter() - started) * 1000,
                            response_length=len(getattr(result, "payload", b"") or b""),
                            exception=exception, context={})
        return result


class Producer(WorkqUser):
    weight = 2

    @task
    def add(self) -> None:
        self.call("add", self.client.add, str(uuid.uuid4()), random.choice(QUEUES), PAYLOAD, TTR, TTL)


class Consumer(WorkqUser):
    weight = 2

    @task
    def lease_and_complete(self) -> None:
        job = self.call("lease", self.client.lease, random.sample(QUEUES, 4), 1000, ok_errors=(TimedOut,))
        if job is not None and not isinstance(job, WorkqError):
            self.call("complete", self.client.complete, job.id, b"done")


class Mixed(WorkqUser):
    weight = 4

    @task
    def cycle(self) -> None:
        queue = random.choice(QUEUES)
        self.call("add", self.client.add, str(uuid.uuid4()), queue, PAYLOAD, TTR, TTL)
        job = self.call("lease", self.client.lease, queue, 1000, ok_errors=(TimedOut,))
        if job is not None and not isinstance(job, WorkqError):
            self.call("complete", self.client.complete, job.id, b"done")


class Runner(WorkqUser):
    weight = 1
    wait_time = between(0.0, 0.05)

    @task
    def run_and_wait(self) -> None:
        self.call("run", self.client.run, str(uuid.uuid4()), random.choice(QUEUES), PAYLOAD, TTR, 5000,
                  ok_errors=(TimedOut,))
