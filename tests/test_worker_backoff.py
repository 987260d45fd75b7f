"""``queueserver worker`` when its server is not there: exponential backoff
with a cap, one line when the trouble starts and one when it is over (a
worker pointed at a dead port once logged two warnings a second, for ever).
A real worker process against a port with nothing listening, then a real
server started on that port, stopped and started again."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

from queueserver.client import Client
from queueserver.client.worker import FIRST_BACKOFF, MAX_BACKOFF, backoff_delay
from serverproc import ServerProcess, wait_for
from wire import new_id, qname

TESTS = os.path.dirname(os.path.abspath(__file__))
ATTEMPT = re.compile(r" worker DEBUG attempt (\d+) failed \((.*)\); next in (\d+\.\d+) s$")


def test_the_delay_doubles_from_the_first_to_the_cap_with_jitter_below_each_step():
    highest = [backoff_delay(n, rng=lambda low, high: high) for n in range(1, 20)]
    lowest = [backoff_delay(n, rng=lambda low, high: low) for n in range(1, 20)]
    assert highest[:5] == [FIRST_BACKOFF * 2 ** i for i in range(5)]
    assert highest[-1] == MAX_BACKOFF and max(highest) == MAX_BACKOFF
    assert all(b == min(MAX_BACKOFF, 2 * a) for a, b in zip(highest, highest[1:]))
    assert lowest == [h / 2 for h in highest]
    assert backoff_delay(10_000) <= MAX_BACKOFF   # no overflow however long it lasts


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_on(port: int) -> ServerProcess:
    return ServerProcess(protocols=["workq"], extra=["--workq-port", str(port)]).start()


def test_a_worker_backs_off_while_nothing_listens_and_says_once_when_it_connects(tmp_path):
    port = free_port()
    log_path = tmp_path / "worker.log"
    queue = qname("backoff")
    with open(log_path, "w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "queueserver", "worker", "worker_jobs:shout",
                                   "--queue", queue, "--port", str(port), "--wait-timeout", "200",
                                   "--log-level", "debug"],
                                  cwd=TESTS, stdout=log, stderr=subprocess.STDOUT)
    server = None
    try:
        def lines():
            return log_path.read_text().splitlines()

        def attempts():
            return [m for m in map(ATTEMPT.search, lines()) if m]

        wait_for(lambda: len(attempts()) >= 5, 30, lambda: "five failed attempts:\n" + "\n".join(lines()))
        server = server_on(port)
        wait_for(lambda: any(" connected to server" in line for line in lines()), 60,
                 lambda: "the worker to connect:\n" + "\n".join(lines()))
        first, second = new_id(), new_id()
        with Client("127.0.0.1", port) as client:
            client.add(first, queue, b"one", ttr=10000, ttl=60000)
            assert client.result(first, 30000).result == b"ONE"
        # The server goes away under the worker, and comes back on the same port.
        server.stop()
        server = None
        wait_for(lambda: sum("WARNING cannot reach server" in line for line in lines()) == 2, 30,
                 lambda: "the worker to lose the server:\n" + "\n".join(lines()))
        server = server_on(port)
        wait_for(lambda: any("reconnected to server" in line for line in lines()), 60,
                 lambda: "the worker to reconnect:\n" + "\n".join(lines()))
        with Client("127.0.0.1", port) as client:
            client.add(second, queue, b"two", ttr=10000, ttl=60000)
            assert client.result(second, 30000).result == b"TWO"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if server is not None:
            server.stop()
    text = log_path.read_text()
    out = text.splitlines()
    assert "Traceback" not in text, text
    # The waits grow: each attempt's wait lies in the upper half of its step.
    for match in attempts():
        ceiling = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (int(match.group(1)) - 1))
        assert ceiling / 2 - 0.01 <= float(match.group(3)) <= ceiling + 0.01, match.group(0)
    # One line per change of state: down (nothing listens), up, down, up. A
    # server that answers but cannot serve yet (its shard still starting) is
    # a state of its own, and may come between.
    changes = [line for line in out if " WARNING " in line or "connected to server" in line]
    unreachable = f"WARNING cannot reach server 127.0.0.1:{port}: "
    assert changes[0].endswith(f" worker {unreachable}connection refused; retrying with backoff "
                               f"(at most 30 s apart)"), changes
    assert sum(unreachable in line for line in changes) == 2, changes
    assert sum(" connected to server" in line for line in changes) == 1, changes
    assert sum("reconnected to server" in line for line in changes) == 1, changes
    assert all("cannot reach server" in line or "cannot serve the lease" in line
               or "connected to server" in line for line in changes), changes
    states = [line.split(" worker ", 1)[1][:30] for line in changes]
    assert all(a != b for a, b in zip(states, states[1:])), changes   # each line a change
    assert len(changes) <= 6, changes
    assert len([line for line in out if re.search(r" job \S+ completed in ", line)]) == 2, text
    assert out[-1].endswith("stopped after 2 jobs"), text
