"""A crash test's history and its checker, the way Jepsen's queue checker
works: clients record what they tried and what the server acknowledged;
after the crashes, the queue is drained and the history is checked.

Jobs are known by a token in their payload, so one job can be added over
one protocol and taken over another. The rules:

* an acknowledged add is never lost: its job is drained at the end (after
  a restart, which makes every job whose lease was not completed ready
  again), or a worker tried to complete it (a complete whose answer was
  lost in a crash may or may not have happened);
* nothing comes out that nobody tried to add;
* a job whose complete was acknowledged does not come back;
* the same job delivered twice (at-least-once, after a crash took a lease)
  is counted and reported, not an error.
"""
from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Final, Iterable, List, Optional, Set

from queueserver.client import Client
from queueserver.client.client import ConnectionLost, TimedOut, WorkqError


class History:
    """What every client tried and what the server acknowledged (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.attempted: Set[str] = set()
        self.acked: Set[str] = set()
        self.leased: Counter = Counter()
        self.completing: Set[str] = set()
        self.completed: Set[str] = set()
        self.errors: Counter = Counter()

    def note(self, kind: str, token: str) -> None:
        with self._lock:
            if kind == "leased":
                self.leased[token] += 1
            else:
                getattr(self, kind).add(token)

    def error(self, what: str) -> None:
        with self._lock:
            self.errors[what] += 1

    def check(self, drained: Iterable[str]) -> "Verdict":
        drained = list(drained)
        left = set(drained)
        taken = set(self.leased)
        return Verdict(
            acknowledged=len(self.acked),
            lost=sorted(self.acked - left - self.completing),
            unexpected=sorted((left | taken) - self.attempted),
            resurrected=sorted(self.completed & left),
            duplicates=sum(n - 1 for n in self.leased.values() if n > 1)
            + sum(1 for t in drained if t in taken),
            drained=len(drained))


@dataclass
class Verdict:
    acknowledged: int
    lost: List[str]
    unexpected: List[str]
    resurrected: List[str]
    duplicates: int
    drained: int
    notes: Dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.acknowledged} acknowledged adds, lost {len(self.lost)}, unexpected "
                f"{len(self.unexpected)}, completed-and-back {len(self.resurrected)}, "
                f"delivered again {self.duplicates}, drained {self.drained}")


# ------------------------------------------------------------------ clients
class Load:
    """Producers over workq and takeanumber, and workq workers, in threads,
    until :meth:`stop`; every outcome goes to ``history``."""

    def __init__(self, history: History, ports: Callable[[], Dict[str, int]], queues: List[str],
                 ttr_ms: int = 1000, host: str = "127.0.0.1",
                 workers_at: Optional[Callable[[], tuple]] = None) -> None:
        """``host``/``ports``: where producers (and, unless ``workers_at``
        gives another ``(host, ports)``, workers) connect."""
        self.history = history
        self.ports = ports
        self.host = host
        self.workers_at = workers_at or (lambda: (host, ports()))
        self.queues = queues
        self.ttr_ms = ttr_ms
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []

    def start(self, producers: int = 2, workers: int = 2) -> "Load":
        for i in range(producers):
            self._spawn(self._workq_producer, i)
            self._spawn(self._takeanumber_producer, i)
        for i in range(workers):
            self._spawn(self._worker, i)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
            assert not thread.is_alive(), f"{thread.name} did not stop"

    def _spawn(self, target, i: int) -> None:
        thread = threading.Thread(target=target, args=(i,), name=f"{target.__name__}-{i}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _pause(self) -> None:
        self._stop.wait(0.05)

    def _workq_producer(self, i: int) -> None:
        history, client = self.history, Client(host=self.host, port=self.ports()["workq"], timeout=5)
        n = 0
        while not self._stop.is_set():
            n += 1
            token = f"w{i}-{n}"
            history.note("attempted", token)
            try:
                client.add(str(uuid.uuid4()), self.queues[n % len(self.queues)], token.encode(),
                           self.ttr_ms, 3_600_000)
                history.note("acked", token)
            except (ConnectionLost, OSError, WorkqError) as err:
                history.error(f"workq add: {type(err).__name__} {err}"[:80])
                client.close()
                self._pause()
        client.close()

    def _takeanumber_producer(self, i: int) -> None:
        history, sock, n = self.history, None, 0
        while not self._stop.is_set():
            n += 1
            token = f"t{i}-{n}"
            history.note("attempted", token)
            try:
                if sock is None:
                    sock = socket.create_connection((self.host, self.ports()["takeanumber"]), 5)
                    sock.settimeout(5)
                    reader = sock.makefile("rb")
                sock.sendall(f"ADD {self.queues[n % len(self.queues)]} 3 {token}\r\n".encode())
                line = reader.readline()
                if line.startswith(b"+"):
                    history.note("acked", token)
                else:
                    history.error(f"takeanumber add: {line[:40]!r}")
                    if not line:
                        raise ConnectionError("closed")
                    self._pause()   # as the workq producer does on an error (a shard restarting)
            except OSError as err:
                history.error(f"takeanumber add: {type(err).__name__}")
                if sock is not None:
                    sock.close()
                sock = None
                self._pause()
        if sock is not None:
            sock.close()

    def _worker(self, i: int) -> None:
        host, ports = self.workers_at()
        history, client = self.history, Client(host=host, port=ports["workq"], timeout=5)
        rng = random.Random(i)
        while not self._stop.is_set():
            try:
                job = client.lease(self.queues, wait_timeout=200)
            except TimedOut:
                continue
            except (ConnectionLost, OSError, WorkqError) as err:
                history.error(f"lease: {type(err).__name__}")
                client.close()
                self._pause()
                continue
            token = job.payload.decode()
            history.note("leased", token)
            if rng.random() < 0.1:
                continue   # a worker that dies with its lease: the job must come back
            history.note("completing", token)
            try:
                client.complete(job.id, b"done")
                history.note("completed", token)
            except (ConnectionLost, OSError, WorkqError) as err:
                history.error(f"complete: {type(err).__name__}")
                client.close()
                self._pause()
        client.close()


#: seconds a drain may take whatever is left, and per job it may have to take
DRAIN_BASE: Final = 120.0
DRAIN_PER_JOB: Final = 0.004   # a lease and a delete, each a round trip: ~1 ms here


def drain_limit(jobs: int) -> float:
    """How long a drain of up to ``jobs`` jobs may take before it is a hang
    (a long kill run leaves a backlog of 100,000 jobs and more)."""
    return DRAIN_BASE + DRAIN_PER_JOB * jobs


def drain(port: int, queues: List[str], quiet_ms: int = 2500, limit: float = DRAIN_BASE,
          host: str = "127.0.0.1") -> List[str]:
    """Lease and delete every job left until none comes for ``quiet_ms``
    (longer than the TTR, so leases taken by workers that stopped come back
    first): their tokens. ``limit``: seconds before the drain fails (see
    :func:`drain_limit`)."""
    tokens: List[str] = []
    deadline = time.monotonic() + limit
    with Client(host=host, port=port, timeout=10) as client:
        while time.monotonic() < deadline:
            try:
                job = client.lease(queues, wait_timeout=quiet_ms)
            except TimedOut:
                return tokens
            tokens.append(job.payload.decode())
            client.delete(job.id)
    raise AssertionError(f"the queues did not drain within {limit:.0f} s ({len(tokens)} drained)")


def random_victim(children: Dict[str, int], rng: random.Random, include_router: bool = True) -> Optional[str]:
    names = sorted(n for n in children if n.startswith("shard") or (include_router and n.startswith("router")))
    return rng.choice(names) if names else None
