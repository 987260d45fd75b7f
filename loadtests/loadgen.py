"""The lean load generator: raw sockets, one epoll loop per process.

Why not locust: one locust process saturates a core near 38k requests/s and
spends most of it on its own bookkeeping, so on a 2-core machine it measures
the tool. Here each worker process owns many non-blocking connections and
drives them all from one ``select.epoll`` loop, with requests built from
pre-encoded bytes and replies parsed only as far as needed to know they are
whole. The workers report their own CPU so it can be printed beside the
servers' figures.

The *same* generator drives every server under test; only the spelling of
the three steps differs (:class:`Protocol`):

=========  ==================  ==========================  ================
step       workq (ours)        beanstalkd                  Redis (RESP)
=========  ==================  ==========================  ================
enqueue    ``add``             ``put``                     ``LPUSH``
take       ``lease``           ``reserve-with-timeout``    ``BLMOVE`` L R
finish     ``complete``        ``delete``                  ``LREM`` 1
=========  ==================  ==========================  ================

Workloads:

* ``cycle``: every connection runs enqueue, take, finish, one request in
  flight at a time (3 round trips per cycle). Latency is recorded per
  request and per cycle.
* ``produce``: every connection writes ``batch`` enqueues in one write and
  waits for all their replies; latency is per batch.

Safety: traffic goes only to 127.0.0.1; every run ends by itself at its
deadline (plus a short grace for replies in flight) or after ``max_ops``,
whichever comes first, and a worker that overstays is killed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import select
import socket
import ssl
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import xxhash

HOST = "127.0.0.1"          # the only address this tool ever connects to
RECV_SIZE = 65536           # larger buffers cost a map/unmap per recv
MAX_DURATION = 3600.0       # hard ceiling on any one run, seconds
GRACE = 3.0                 # wait this long past the deadline for replies in flight
TTR_MS = 60000              # leased jobs must not time out mid-cycle

CYCLE = "cycle"
PRODUCE = "produce"


# --------------------------------------------------------------- protocols
def resp(*parts: bytes) -> bytes:
    """One Redis command in RESP."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class Protocol:
    """How one server spells the steps of a job cycle, and what its replies look like.

    Reply checks rely on there being exactly one reply outstanding (cycle
    workload) or only single-line replies (produce workload), so a buffer
    ending in CRLF is a whole reply and no general parser is needed.
    """

    name = ""
    rotates_names = True     # False: one queue per connection, chosen at setup
    enqueue_ok = b""         # a good enqueue reply starts with this
    finish_ok = b""          # a good finish reply starts with this

    def __init__(self, ttl_ms: int) -> None:
        self.ttl_ms = ttl_ms

    def setup(self, sock: socket.socket, queue: bytes) -> None:
        """Blocking per-connection preparation (e.g. choose a tube)."""

    def select(self, queue: bytes) -> bytes:
        """Bytes that make later enqueues on this connection go to ``queue``, if needed."""
        return b""

    def enqueue(self, queue: bytes, payload: bytes) -> bytes:
        raise NotImplementedError

    def take(self, queue: bytes) -> bytes:
        raise NotImplementedError

    def take_reply(self, buf: bytes) -> Optional[bytes]:
        """The taken job's handle, ``b""`` for an error/timeout, None while incomplete."""
        raise NotImplementedError

    def finish(self, queue: bytes, handle: bytes) -> bytes:
        raise NotImplementedError


class Workq(Protocol):
    name = "workq"
    # One queue per connection, as beanstalkd's tube per connection and as
    # most workers and producers do: each connection's traffic goes to one
    # shard, so the direct path serves it (the shards share the load).
    rotates_names = False
    enqueue_ok = b"+OK\r\n"
    finish_ok = b"+OK\r\n"

    def enqueue(self, queue: bytes, payload: bytes) -> bytes:
        # The payload starts with a fresh UUID (see Ids), reused as the job id.
        return b"add %s %s %d %d %d\r\n%s\r\n" % (payload[:36], queue, TTR_MS, self.ttl_ms,
                                                   len(payload), payload)

    def take(self, queue: bytes) -> bytes:
        return b"lease %s 1000\r\n" % queue

    def take_reply(self, buf: bytes) -> Optional[bytes]:
        if buf[:1] == b"-":
            return b"" if buf[-2:] == b"\r\n" else None
        i = buf.find(b"\r\n")
        if i < 0:
            return None
        j = buf.find(b"\r\n", i + 2)
        if j < 0:
            return None
        handle, _, size = buf[i + 2:j].split(b" ")
        if len(buf) < j + int(size) + 4:
            return None
        return handle

    def finish(self, queue: bytes, handle: bytes) -> bytes:
        return b"complete %s 0\r\n\r\n" % handle


class Beanstalkd(Protocol):
    name = "beanstalkd"
    rotates_names = False    # switching tubes costs a round trip: one tube per connection
    enqueue_ok = b"INSERTED "
    finish_ok = b"DELETED\r\n"

    def setup(self, sock: socket.socket, queue: bytes) -> None:
        sock.sendall(b"use %s\r\nwatch %s\r\nignore default\r\n" % (queue, queue))
        _read_lines(sock, 3)

    def select(self, queue: bytes) -> bytes:
        return b"use %s\r\n" % queue

    def enqueue(self, queue: bytes, payload: bytes) -> bytes:
        return b"put 0 0 %d %d\r\n%s\r\n" % (TTR_MS // 1000, len(payload), payload)

    def take(self, queue: bytes) -> bytes:
        return b"reserve-with-timeout 1\r\n"

    def take_reply(self, buf: bytes) -> Optional[bytes]:
        i = buf.find(b"\r\n")
        if i < 0:
            return None
        head = buf[:i]
        if not head.startswith(b"RESERVED "):
            return b""
        _, handle, size = head.split(b" ")
        if len(buf) < i + int(size) + 4:
            return None
        return handle

    def finish(self, queue: bytes, handle: bytes) -> bytes:
        return b"delete %s\r\n" % handle


class Redis(Protocol):
    """A reliable list queue: LPUSH, BLMOVE to a per-queue busy list, LREM from it."""

    name = "redis"
    enqueue_ok = b":"
    finish_ok = b":1\r\n"

    def enqueue(self, queue: bytes, payload: bytes) -> bytes:
        return resp(b"LPUSH", queue, payload)

    def take(self, queue: bytes) -> bytes:
        return resp(b"BLMOVE", queue, queue + b":busy", b"LEFT", b"RIGHT", b"1")

    def take_reply(self, buf: bytes) -> Optional[bytes]:
        i = buf.find(b"\r\n")
        if i < 0:
            return None
        if buf[:1] != b"$" or buf[1:2] == b"-":
            return b""       # nil (timed out) or an error
        size = int(buf[1:i])
        if len(buf) < i + size + 4:
            return None
        return buf[i + 2:i + 2 + size]

    def finish(self, queue: bytes, handle: bytes) -> bytes:
        return resp(b"LREM", queue + b":busy", b"1", handle)


PROTOCOLS: Dict[str, type] = {p.name: p for p in (Workq, Beanstalkd, Redis)}


def _read_lines(sock: socket.socket, count: int, deadline: float = 30.0) -> bytes:
    """Blocking: read until ``count`` CRLF-terminated lines have arrived."""
    buf = b""
    sock.settimeout(deadline)
    while buf.count(b"\r\n") < count:
        chunk = sock.recv(RECV_SIZE)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    return buf


class Ids:
    """Unique 100-byte payloads that start with a UUIDv4-shaped id.

    A random per-process prefix plus a counter: unique across processes and
    runs, and ~10x cheaper than ``uuid.uuid4()``. Redis needs unique values
    so LREM removes exactly the job taken; workq reuses the id as job id.
    """

    def __init__(self, size: int) -> None:
        r = os.urandom(9).hex().encode()
        self.prefix = b"%s-%s-4%s-8%s-" % (r[:8], r[8:12], r[12:15], r[15:18])
        self.pad = b"." * (size - 36)
        self.n = 0

    def next(self) -> bytes:
        self.n += 1
        return b"%s%012x%s" % (self.prefix, self.n, self.pad)


class HomedIds(Ids):
    """:class:`Ids` whose job ids are all at home in ``slots`` (a cluster
    node's own: a client that keeps its ids on the node it talks to, as a
    Redis Cluster client keeps its keys by hash tags). Skips the others."""

    def __init__(self, size: int, slots: FrozenSet[int]) -> None:
        super().__init__(size)
        self.slots = slots

    def next(self) -> bytes:
        while True:
            payload = super().next()
            if xxhash.xxh64_intdigest(payload[:36]) & 16383 in self.slots:
                return payload


def make_ids(spec: "LoadSpec") -> Ids:
    return HomedIds(spec.payload, spec.id_slots) if spec.id_slots else Ids(spec.payload)


# ------------------------------------------------------------------- specs
@dataclass
class LoadSpec:
    """What to run. Durations in seconds; ``max_ops`` bounds cycles or jobs."""

    protocol: str
    port: int
    workload: str = CYCLE
    connections: int = 32
    procs: int = 2
    warmup: float = 1.0
    duration: float = 10.0
    max_ops: int = 50_000_000
    batch: int = 64
    queues: int = 256
    payload: int = 100
    ttl_ms: int = 600_000
    #: job ids only at home in these slots (a cluster node's own); None: any id
    id_slots: Optional[FrozenSet[int]] = None
    #: speak TLS to the port (the server's certificate is not checked: a bench)
    tls: bool = False
    #: (certificate, key) presented to a server that asks for a client certificate
    tls_certificate: Optional[Tuple[str, str]] = None

    def queue_names(self) -> List[bytes]:
        """Redis's queues rotate over ``queues`` names; workq's and beanstalkd's
        stay one per connection, or connections share them when ``queues`` are
        fewer (128 connections over 64 queues: two workers on each)."""
        rotates = PROTOCOLS[self.protocol].rotates_names
        count = self.queues if rotates else min(self.queues, self.connections)
        return [b"bench-%d" % i for i in range(count)]

    def check(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}")
        if self.workload not in (CYCLE, PRODUCE):
            raise ValueError(f"unknown workload {self.workload!r}")
        if not 0 < self.warmup + self.duration <= MAX_DURATION:
            raise ValueError(f"warmup + duration must be in (0, {MAX_DURATION}] s")
        if self.connections < 1 or self.procs < 1 or self.max_ops < 1 or self.batch < 1:
            raise ValueError("connections, procs, max_ops and batch must be positive")
        if self.payload < 37:
            raise ValueError("payload must hold a 36-byte id")


@dataclass
class LoadResult:
    """Counts are for the measured window unless named ``total_``.

    ``latency_us`` is per request (cycle) or per batch (produce);
    ``cycle_latency_us`` per whole cycle. ``total_ops`` and ``loadgen_cpu_s``
    cover the whole run, warm-up included, so they pair with server CPU
    sampled around the run.
    """

    spec: LoadSpec
    seconds: float = 0.0
    ops: int = 0
    requests: int = 0
    errors: int = 0
    total_ops: int = 0
    loadgen_cpu_s: float = 0.0
    latency_us: Dict[str, float] = field(default_factory=dict)
    cycle_latency_us: Dict[str, float] = field(default_factory=dict)

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> Dict[str, object]:
        d = asdict(self)
        d["ops_per_s"] = self.ops_per_s
        return d


def percentiles(samples_ns: Sequence[int], points: Sequence[float] = (50, 99, 99.9)) -> Dict[str, float]:
    """Nearest-rank percentiles, in microseconds."""
    if not samples_ns:
        return {}
    ordered = sorted(samples_ns)
    last = len(ordered) - 1
    return {f"p{p:g}": ordered[min(last, int(p / 100 * len(ordered)))] / 1000 for p in points}


# -------------------------------------------------------------- connection
class Conn:
    __slots__ = ("sock", "fd", "queue", "cursor", "step", "buf", "sent", "started",
                 "handle", "out", "want", "done")

    def __init__(self, sock: socket.socket, queue: bytes, cursor: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.queue = queue
        self.cursor = cursor      # position in the name rotation
        self.step = 0
        self.buf = b""
        self.sent = 0             # ns, when the request in flight was written
        self.started = 0          # ns, when the cycle began
        self.handle = b""
        self.out = b""            # unsent tail of a request (send buffer full)
        self.want = 0             # replies expected for the batch in flight
        self.done = False


def tls_context(certificate: Optional[Tuple[str, str]] = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if certificate is not None:
        context.load_cert_chain(*certificate)
    return context


def connect(spec: LoadSpec, timeout: float, context: Optional[ssl.SSLContext] = None) -> socket.socket:
    """A connection to the spec's port (TLS, handshake done, with ``spec.tls``;
    ``context``: one made once for many connections)."""
    sock = socket.create_connection((HOST, spec.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not spec.tls:
        return sock
    return (context or tls_context(spec.tls_certificate)).wrap_socket(sock)


def _connect(spec: LoadSpec, proto: Protocol, indices: Sequence[int]) -> List[Conn]:
    names = spec.queue_names()
    conns = []
    for i in indices:
        sock = connect(spec, 10)
        queue = names[i % len(names)]
        proto.setup(sock, queue)
        sock.setblocking(False)
        # Spread the rotation start so connections hit different queues at once.
        conns.append(Conn(sock, queue, i * (len(names) // max(1, spec.connections)) + i))
    return conns


class Worker:
    """One process's share of the connections, driven by one epoll loop."""

    def __init__(self, spec: LoadSpec, indices: Sequence[int]) -> None:
        self.spec = spec
        self.proto: Protocol = PROTOCOLS[spec.protocol](spec.ttl_ms)
        self.names = spec.queue_names()
        self.ids = make_ids(spec)
        self.conns = _connect(spec, self.proto, indices)
        self.tls = spec.tls
        self.by_fd = {c.fd: c for c in self.conns}
        self.epoll = select.epoll()
        for c in self.conns:
            self.epoll.register(c.fd, select.EPOLLIN)
        self.latency = array("q")
        self.cycle_latency = array("q")
        self.ops = self.requests = self.errors = self.total_ops = self.begun = 0
        self.active = len(self.conns)

    # The windows, in time.monotonic_ns() (CLOCK_MONOTONIC: shared by all processes).
    def run(self, start_ns: int, budget: int) -> Dict[str, object]:
        spec = self.spec
        self.measure_ns = start_ns + int(spec.warmup * 1e9)
        self.end_ns = self.measure_ns + int(spec.duration * 1e9)
        self.budget = budget
        hard_ns = self.end_ns + int(GRACE * 1e9)
        while time.monotonic_ns() < start_ns:
            time.sleep(0.001)
        handler = self._on_cycle_reply if spec.workload == CYCLE else self._on_batch_reply
        for c in self.conns:
            if spec.workload == CYCLE:
                self._begin_cycle(c, start_ns)
            else:
                self._send_batch(c, start_ns)
        self._loop(handler, hard_ns)
        for c in self.conns:
            c.sock.close()
        self.epoll.close()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"ops": self.ops, "requests": self.requests, "errors": self.errors,
                "total_ops": self.total_ops, "cpu": usage.ru_utime + usage.ru_stime,
                "latency": self.latency.tobytes(), "cycle_latency": self.cycle_latency.tobytes()}

    def _loop(self, handler, hard_ns: int) -> None:
        poll = self.epoll.poll
        by_fd = self.by_fd
        now_ns = time.monotonic_ns
        while self.active > 0:
            events = poll(0.05)
            if now_ns() >= hard_ns:
                self.errors += self.active   # replies that never came
                return
            for fd, mask in events:
                c = by_fd[fd]
                if mask & select.EPOLLOUT:
                    self._flush(c)
                if not mask & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP):
                    continue
                try:
                    data = c.sock.recv(RECV_SIZE)
                    if self.tls:
                        while c.sock.pending():   # records decrypted already: epoll will not tell
                            data += c.sock.recv(RECV_SIZE)
                except (BlockingIOError, ssl.SSLWantReadError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._close(c, failed=True)
                    continue
                c.buf += data
                handler(c)

    # ------------------------------------------------------------- sending
    def _send(self, c: Conn, data: bytes, now: int) -> None:
        c.sent = now
        try:
            n = c.sock.send(data)
        except (BlockingIOError, ssl.SSLWantWriteError):
            n = 0
        except OSError:
            self._close(c, failed=True)
            return
        if n < len(data):
            c.out = data[n:]
            self.epoll.modify(c.fd, select.EPOLLIN | select.EPOLLOUT)

    def _flush(self, c: Conn) -> None:
        try:
            n = c.sock.send(c.out)
        except (BlockingIOError, ssl.SSLWantWriteError):
            return
        except OSError:
            self._close(c, failed=True)
            return
        c.out = c.out[n:]
        if not c.out:
            self.epoll.modify(c.fd, select.EPOLLIN)

    def _close(self, c: Conn, failed: bool = False) -> None:
        if c.done:
            return
        c.done = True
        self.active -= 1
        if failed:
            self.errors += 1
        try:
            self.epoll.unregister(c.fd)
        except (OSError, ValueError):
            pass

    def _next_queue(self, c: Conn) -> bytes:
        if self.proto.rotates_names:
            c.cursor += 1
            c.queue = self.names[c.cursor % len(self.names)]
        return c.queue

    # --------------------------------------------------------------- cycle
    def _begin_cycle(self, c: Conn, now: int) -> None:
        if now >= self.end_ns or self.begun >= self.budget:
            self._close(c)
            return
        self.begun += 1         # counted at the start, so cycles in flight cannot overshoot
        c.step = 0
        c.started = now
        self._send(c, self.proto.enqueue(self._next_queue(c), self.ids.next()), now)

    def _on_cycle_reply(self, c: Conn) -> None:
        buf = c.buf
        step = c.step
        proto = self.proto
        if step == 1:
            handle = proto.take_reply(buf)
            if handle is None:
                return
            ok = bool(handle)
        else:
            if buf[-2:] != b"\r\n":
                return
            ok = buf.startswith(proto.finish_ok if step == 2 else proto.enqueue_ok)
        c.buf = b""
        now = time.monotonic_ns()
        in_window = self.measure_ns <= now < self.end_ns
        if in_window:
            self.latency.append(now - c.sent)
            self.requests += 1
        if not ok:
            self.errors += 1
            self._begin_cycle(c, now)
        elif step == 0:
            c.step = 1
            self._send(c, proto.take(c.queue), now)
        elif step == 1:
            c.step = 2
            c.handle = handle
            self._send(c, proto.finish(c.queue, handle), now)
        else:
            self.total_ops += 1
            if in_window:
                self.ops += 1
                self.cycle_latency.append(now - c.started)
            self._begin_cycle(c, now)

    # ------------------------------------------------------------- produce
    def _send_batch(self, c: Conn, now: int) -> None:
        n = min(self.spec.batch, self.budget - self.total_ops)
        if now >= self.end_ns or n <= 0:
            self._close(c)
            return
        self.total_ops += n     # reserved now so the count bound holds across connections
        enqueue = self.proto.enqueue
        nxt = self.ids.next
        queue = self._next_queue
        c.want = n
        self._send(c, b"".join([enqueue(queue(c), nxt()) for _ in range(n)]), now)

    def _on_batch_reply(self, c: Conn) -> None:
        buf = c.buf
        if buf[-2:] != b"\r\n" or buf.count(b"\r\n") < c.want:
            return
        c.buf = b""
        now = time.monotonic_ns()
        good = buf.count(self.proto.enqueue_ok)
        self.errors += c.want - good
        if self.measure_ns <= now < self.end_ns:
            self.latency.append(now - c.sent)
            self.requests += c.want
            self.ops += good
        self._send_batch(c, now)


def _worker_main(spec: LoadSpec, indices: Sequence[int], budget: int, pipe) -> None:
    parent = os.getppid()
    try:
        worker = Worker(spec, indices)
        pipe.send(("ready", None))
        # Another worker may hold our pipe's far end (forked after it): a
        # parent that died would then never be seen as EOF. Watch it instead.
        while not pipe.poll(0.5):
            if os.getppid() != parent:
                return
        start_ns = pipe.recv()
        pipe.send(("done", worker.run(start_ns, budget)))
    except KeyboardInterrupt:
        pass
    except Exception as err:  # report, don't hang the parent
        pipe.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        pipe.close()


# -------------------------------------------------------------------- run
def run(spec: LoadSpec) -> LoadResult:
    """Run ``spec`` in ``spec.procs`` forked workers; always reaps them."""
    spec.check()
    procs = min(spec.procs, spec.connections)
    ctx = mp.get_context("fork")
    workers = []
    try:
        for p in range(procs):
            parent, child = ctx.Pipe()
            indices = list(range(p, spec.connections, procs))
            budget = spec.max_ops // procs + (1 if p < spec.max_ops % procs else 0)
            proc = ctx.Process(target=_worker_main, args=(spec, indices, budget, child), daemon=True)
            workers.append((proc, parent))   # listed first: an interrupt after start still reaps it
            proc.start()
            child.close()
        for _, pipe in workers:
            kind, body = _receive(pipe, 60.0)
            if kind != "ready":
                raise RuntimeError(f"load generator worker failed to connect: {body}")
        start_ns = time.monotonic_ns() + 50_000_000
        for _, pipe in workers:
            pipe.send(start_ns)
        limit = spec.warmup + spec.duration + GRACE + 30.0
        result = LoadResult(spec=spec, seconds=spec.duration)
        latency, cycle_latency = array("q"), array("q")
        for _, pipe in workers:
            kind, body = _receive(pipe, limit)
            if kind != "done":
                raise RuntimeError(f"load generator worker failed: {body}")
            result.ops += body["ops"]
            result.requests += body["requests"]
            result.errors += body["errors"]
            result.total_ops += body["total_ops"]
            result.loadgen_cpu_s += body["cpu"]
            latency.frombytes(body["latency"])
            cycle_latency.frombytes(body["cycle_latency"])
        result.latency_us = percentiles(latency)
        result.cycle_latency_us = percentiles(cycle_latency)
        return result
    finally:
        for proc, pipe in workers:
            pipe.close()
            if proc.pid is None:
                continue   # interrupted before it started
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _receive(pipe, timeout: float):
    if not pipe.poll(timeout):
        raise RuntimeError(f"load generator worker silent for {timeout:.0f} s")
    try:
        return pipe.recv()
    except EOFError:
        return ("error", "worker exited")


def prefill(spec: LoadSpec, total: int, chunk: int = 2000) -> int:
    """Blocking, pipelined: spread ``total`` jobs evenly over the spec's queues.

    This puts the queues in steady state before a cycle run, so a take never
    waits. Returns the number of jobs the server accepted.
    """
    proto: Protocol = PROTOCOLS[spec.protocol](spec.ttl_ms)
    names = spec.queue_names()
    ids = make_ids(spec)
    accepted = 0
    with connect(spec, 30) as sock:
        for k, queue in enumerate(names):
            n = total // len(names) + (1 if k < total % len(names) else 0)
            while n > 0:
                m = min(n, chunk)
                head = proto.select(queue)
                sock.sendall(head + b"".join([proto.enqueue(queue, ids.next()) for _ in range(m)]))
                replies = _read_lines(sock, m + (1 if head else 0))
                accepted += replies.count(proto.enqueue_ok)
                n -= m
    return accepted


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Lean load generator (loopback only).")
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workload", choices=(CYCLE, PRODUCE), default=CYCLE)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--max-ops", type=int, default=50_000_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=0, help="jobs to queue before a run")
    args = parser.parse_args(argv)
    spec = LoadSpec(protocol=args.protocol, port=args.port, workload=args.workload,
                    connections=args.connections, procs=args.procs, warmup=args.warmup,
                    duration=args.duration, max_ops=args.max_ops, batch=args.batch)
    if args.prefill:
        prefill(spec, args.prefill)
    result = run(spec)
    json.dump(result.to_dict(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
