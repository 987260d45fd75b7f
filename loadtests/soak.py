"""A long soak of all five protocols, watching every process's memory.

Why: a leak shows only over time. This starts a durable server and runs a
steady, bounded mix against it for ``--duration`` seconds, as real clients
behave: workq adds with retries (``fail`` until attempts run out), leases
left to expire, completes, results and deletes; takeanumber RESERVE, DONE
and RETRY; goqueue reservations deleted or dropped with their connection;
queued and TaskFlux enqueues and dequeues; every client reconnecting every
few hundred requests; and malformed lines on every protocol. Every
``--interval`` seconds it samples each process's RSS (supervisor, routers,
shards); after ``--warmup`` it fits a line to each process's samples and
reports its growth in MB per minute (target: <= 0.05 once warm).

    .venv/bin/python loadtests/soak.py --duration 3600 --warmup 600
    .venv/bin/python loadtests/soak.py --duration 120 --warmup 30 --interval 5   # a quick look

The figures also go to ``loadtests/results/soak-<time>.json`` with every sample.
"""
from __future__ import annotations

import abc
import argparse
import base64
import json
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from queueserver.testing.serverprocess import ServerProcess  # noqa: E402

#: each protocol's own queues (a job's semantics are its producer's: a
#: takeanumber job leased over workq and dropped would stay reserved for ever)
QUEUES = {protocol: [f"soak-{protocol}-{i}" for i in range(8)]
          for protocol in ("workq", "takeanumber", "goqueue", "queued", "taskflux")}
#: the queue where jobs cross protocols: workq adds, takeanumber reserves and finishes
SHARED = "soak-shared"
#: takes per add: consumers drain faster than producers fill, so the
#: queues stay short (retries and expired leases put jobs back) and what
#: grows is the server, not its backlog
TAKES = 2


class Reader:
    """Buffered reads from one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk

    def until(self, end: bytes) -> bytes:
        while end not in self.buf:
            self._more()
        at = self.buf.index(end) + len(end)
        out, self.buf = self.buf[:at], self.buf[at:]
        return out

    def exact(self, size: int) -> bytes:
        while len(self.buf) < size:
            self._more()
        out, self.buf = self.buf[:size], self.buf[size:]
        return out


class Client(abc.ABC):
    """One protocol's client that reconnects every ``every`` requests."""

    protocol = ""

    def __init__(self, port: int, stats: Dict[str, int], every: int = 300) -> None:
        self.port = port
        self.stats = stats
        self.every = every
        self.sock: Optional[socket.socket] = None
        self.reader: Optional[Reader] = None
        self.sent = 0

    def connect(self) -> Reader:
        if self.sock is None or self.sent >= self.every:
            self.close()
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.reader = Reader(self.sock)
            self.sent = 0
            self.stats["connects"] += 1
        assert self.reader is not None
        return self.reader

    def send(self, data: bytes) -> Reader:
        reader = self.connect()
        assert self.sock is not None
        self.sock.sendall(data)
        self.sent += 1
        self.stats["requests"] += 1
        return reader

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    @abc.abstractmethod
    def step(self, rng: random.Random) -> None:
        """One round of this protocol's requests."""


def workq_reply(r: Reader) -> Tuple[bytes, List[Tuple[List[bytes], bytes]]]:
    """(status line, [(header tokens, block)]) of one workq reply."""
    line = r.until(b"\r\n")
    items = []
    if line.startswith(b"+OK ") and line[4:-2].isdigit():
        for _ in range(int(line[4:-2])):
            head = r.until(b"\r\n")[:-2].split(b" ")
            items.append((head, r.exact(int(head[-1]) + 2)[:-2]))
    return line, items


class Workq(Client):
    protocol = "workq"

    def step(self, rng: random.Random) -> None:
        q = rng.choice(QUEUES[self.protocol])
        if rng.random() < 0.05:   # for a takeanumber worker
            workq_reply(self.send(f"add {uuid.uuid4()} {SHARED} 10000 60000 5\r\ncross\r\n".encode()))
        ttr = 150 if rng.random() < 0.1 else 10000           # one lease in ten expires
        id = str(uuid.uuid4())
        r = self.send(f"add {id} {q} {ttr} 60000 5 -max-attempts=3\r\npayld\r\n".encode())
        workq_reply(r)
        for _ in range(TAKES):
            self.take(q, ttr, rng)

    def take(self, q: str, ttr: int, rng: random.Random) -> None:
        line, items = workq_reply(self.send(f"lease {q} 10\r\n".encode()))
        if not items:
            return
        leased = items[0][0][0].decode()
        roll = rng.random()
        if ttr == 150:
            return                                            # left to expire (and be retried)
        if roll < 0.6:
            workq_reply(self.send(f"complete {leased} 2\r\nok\r\n".encode()))
            if roll < 0.1:
                workq_reply(self.send(f"result {leased} 10\r\n".encode()))
        elif roll < 0.85:
            workq_reply(self.send(f"fail {leased} 4\r\nfail\r\n".encode()))   # retried until out of attempts
        else:
            workq_reply(self.send(f"delete {leased}\r\n".encode()))


class TakeANumber(Client):
    protocol = "takeanumber"

    def step(self, rng: random.Random) -> None:
        q = rng.choice(QUEUES[self.protocol])
        if rng.random() < 0.05:   # jobs workq added: reserved and done, until none is left
            for _ in range(16):
                line = self.send(f"RESERVE {SHARED}\r\n".encode()).until(b"\r\n")
                if not line.startswith(b"+"):
                    break
                self.send(f"DONE {SHARED} {line[1:].split(b' ', 1)[0].decode()}\r\n".encode()).until(b"\r\n")
        r = self.send(f"ADD {q} 2 body{rng.randrange(1000)}\r\n".encode())
        r.until(b"\r\n")
        for _ in range(TAKES):
            line = self.send(f"RESERVE {q}\r\n".encode()).until(b"\r\n")
            if line.startswith(b"+"):
                id = line[1:].split(b" ", 1)[0].decode()
                verb = "RETRY" if rng.random() < 0.3 else "DONE"
                self.send(f"{verb} {q} {id}\r\n".encode()).until(b"\r\n")
        self.send(f"LEN {q}\r\n".encode()).until(b"\r\n")


def go_reply(r: Reader) -> bytes:
    word = r.until(b"\0")
    if word == b"ADDED\0":
        return word + r.exact(8)
    if word == b"ERROR\0":
        return word + r.until(b"\0")
    if word == b"RESERVED\0":
        head = r.exact(16) + r.until(b"\0") + r.exact(4)
        return word + head + r.exact(struct.unpack("<I", head[-4:])[0])
    return word


class Goqueue(Client):
    protocol = "goqueue"

    def step(self, rng: random.Random) -> None:
        q = rng.choice(QUEUES[self.protocol]).encode()
        data = b"go-payload"
        go_reply(self.send(b"ADD\0" + q + b"\0" + struct.pack("<III", 0, 2, len(data)) + data))
        for take in range(1 if rng.random() < 0.7 else 2):   # an empty queue makes a take wait 1 s
            # (a timeout of 0 would wait for ever on an empty queue)
            reply = go_reply(self.send(b"RESERVE\0" + q + b"\0" + struct.pack("<I", 1)))
            if reply.startswith(b"RESERVED\0") and (take or rng.random() < 0.8):
                id = struct.unpack("<Q", reply[9:17])[0]
                go_reply(self.send(b"DELETE\0" + struct.pack("<Q", id)))
            # else: left reserved; ready again when its TTP runs out or the connection goes
            if not reply.startswith(b"RESERVED\0"):
                break


class Queued(Client):
    protocol = "queued"

    def connect(self) -> Reader:
        fresh = self.sock is None or self.sent >= self.every
        reader = super().connect()
        if fresh:
            assert self.sock is not None
            self.sock.sendall(f"USE {QUEUES[self.protocol][0]}\n".encode())
            reader.until(b"\n")
        return reader

    def step(self, rng: random.Random) -> None:
        item = os.urandom(12).hex().encode()
        self.send(b"ENQUE " + base64.b64encode(item) + b"\n").until(b"\n")
        for _ in range(TAKES):
            self.send(b"DEQUE\n").until(b"\n")
        if rng.random() < 0.2:
            self.send(b"SIZE\n").until(b"\n")


def tf_packet(body: bytes) -> bytes:
    return b"D" + struct.pack(">i", len(body)) + body


def tf_string(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def tf_reply(r: Reader) -> bytes:
    head = r.exact(5)
    return head + r.exact(struct.unpack(">i", head[1:])[0])


class TaskFlux(Client):
    protocol = "taskflux"

    def step(self, rng: random.Random) -> None:
        q = rng.choice(QUEUES[self.protocol]).encode()
        tf_reply(self.send(tf_packet(b"E" + tf_string(q) + struct.pack(">q", rng.randrange(100))
                                     + tf_string(b"flux"))))
        for _ in range(TAKES):
            tf_reply(self.send(tf_packet(b"D" + tf_string(q))))
        if rng.random() < 0.2:
            tf_reply(self.send(tf_packet(b"C" + tf_string(q))))


#: per protocol: (garbage, a valid request, how to read the valid request's answer)
MALFORMED: Dict[str, Tuple[bytes, bytes, Callable[[Reader], object]]] = {
    "workq": (b"bogus command\r\nadd nope\r\nlease\r\n", b"lease soak-workq-0 1\r\n", workq_reply),
    "takeanumber": (b"FROB x\r\nADD\r\n", b"LEN soak-takeanumber-0\r\n", lambda r: r.until(b"\r\n")),
    "queued": (b"WHAT\nENQUE !!!\n", b"SIZE\n", lambda r: r.until(b"\n")),
    "goqueue": (b"NOSUCH\0", b"", go_reply),                        # fatal: the server closes
    "taskflux": (tf_packet(b"Z???"), b"", tf_reply),
}


def malformed(ports: Dict[str, int], stats: Dict[str, int], rng: random.Random) -> None:
    protocol = rng.choice(sorted(MALFORMED))
    garbage, valid, read = MALFORMED[protocol]
    with socket.create_connection(("127.0.0.1", ports[protocol]), timeout=30) as sock:
        stats["connects"] += 1
        sock.sendall(garbage + valid)
        reader = Reader(sock)
        try:
            while True:       # the errors, then the valid request's answer (or the close)
                read(reader)
                stats["requests"] += 1
        except (ConnectionError, socket.timeout, OSError):
            pass


def run_client(make: Callable[[], Client], rate: float, stop: threading.Event, rng: random.Random,
               stats: Dict[str, int]) -> None:
    client = make()
    period = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            client.step(rng)
        except (OSError, ConnectionError) as err:
            stats["errors"] += 1
            client.close()
            time.sleep(0.1)
            print(f"{client.protocol}: {err!r}", file=sys.stderr)
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        else:
            next_at = time.monotonic()
    client.close()


def run_malformed(ports: Dict[str, int], rate: float, stop: threading.Event, rng: random.Random,
                  stats: Dict[str, int]) -> None:
    while not stop.wait(1.0 / rate):
        try:
            malformed(ports, stats, rng)
        except OSError as err:
            stats["errors"] += 1
            print(f"malformed: {err!r}", file=sys.stderr)


def jobs_held(metrics_port: int) -> Dict[str, int]:
    """The server's jobs by state (``/status``): what it holds is part of its memory."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status", timeout=10) as answer:
        status = json.loads(answer.read())
    held: Dict[str, int] = {}
    for queue in status.get("queues", {}).values():
        for state, count in queue.get("jobs", {}).items():
            held[state] = held.get(state, 0) + count
    return held


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def slope_per_minute(points: List[Tuple[float, float]]) -> float:
    """Least-squares growth of (seconds, MB) points, in MB per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 60


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="soak.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=600.0, help="seconds before the growth is measured")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between RSS samples")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--rate", type=float, default=150.0, help="steps per second per protocol client")
    parser.add_argument("--clients", type=int, default=2, help="clients per protocol")
    parser.add_argument("--json", default=None, help="where to write the figures (default loadtests/results/)")
    parser.add_argument("--memwatch", metavar="DIR", help="plain Python, each router and shard writing what "
                        "grew most to DIR every --memwatch-seconds (queueserver/memwatch.py)")
    parser.add_argument("--memwatch-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.memwatch:
        os.makedirs(args.memwatch, exist_ok=True)
        os.environ.update(QS_MEMWATCH=os.path.abspath(args.memwatch), QS_PURE_PYTHON="1",
                          QS_MEMWATCH_SECONDS=str(args.memwatch_seconds))

    data = tempfile.mkdtemp(prefix="qs-soak-")
    server = ServerProcess(shards=args.shards, extra=["--data-dir", os.path.join(data, "data")]).start()
    stop = threading.Event()
    stats: Dict[str, int] = {"requests": 0, "connects": 0, "errors": 0}
    threads = []
    try:
        ports = {p: server.port(p) for p in ("workq", "takeanumber", "goqueue", "queued", "taskflux")}
        rng = random.Random(1)
        for kind in (Workq, TakeANumber, Goqueue, Queued, TaskFlux):
            for i in range(args.clients):
                make = (lambda k=kind: k(ports[k.protocol], stats, every=rng.randrange(100, 500)))
                threads.append(threading.Thread(target=run_client, daemon=True,
                                                args=(make, args.rate, stop, random.Random(rng.random()), stats)))
        threads.append(threading.Thread(target=run_malformed, daemon=True,
                                        args=(ports, 5.0, stop, random.Random(2), stats)))
        for thread in threads:
            thread.start()
        pids = {"supervisor": server.pid, **server.child_pids()}
        samples: Dict[str, List[Tuple[float, float]]] = {name: [] for name in pids}
        held: List[Tuple[float, Dict[str, int]]] = []
        started = time.monotonic()
        last_requests = 0
        while True:
            now = time.monotonic() - started
            for name, pid in server.child_pids().items():
                if pids.get(name) != pid:
                    print(f"{name} restarted (pid {pids.get(name)} -> {pid}): its samples start again",
                          file=sys.stderr)
                    pids[name] = pid
                    samples[name] = []
            for name, pid in pids.items():
                samples[name].append((now, rss_mb(pid)))
            held.append((now, jobs_held(server.port("metrics"))))
            rate = (stats["requests"] - last_requests) / args.interval if now else 0
            last_requests = stats["requests"]
            print(f"{now:7.0f} s  {rate:7.0f} req/s  " + "  ".join(
                f"{name} {samples[name][-1][1]:.1f}" for name in sorted(samples)) + " MB  jobs " +
                " ".join(f"{state} {count}" for state, count in sorted(held[-1][1].items()) if count),
                flush=True)
            if now >= args.duration:
                break
            time.sleep(min(args.interval, max(0.0, args.duration - now)))
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        server.stop()
    growth = {name: slope_per_minute([p for p in points if p[0] >= args.warmup]) for name, points in samples.items()}
    print(f"\nafter {args.warmup:.0f} s of warm-up, over {args.duration - args.warmup:.0f} s: "
          f"{stats['requests']} requests, {stats['connects']} connections, {stats['errors']} errors")
    print(f"{'process':<12} {'RSS at warm-up':>15} {'RSS at end':>11} {'MB/min':>8}")
    for name in sorted(samples):
        warm = [v for t, v in samples[name] if t >= args.warmup]
        if warm:
            print(f"{name:<12} {warm[0]:>12.1f} MB {warm[-1]:>8.1f} MB {growth[name]:>8.3f}")
    totals = [(t, float(sum(counts.values()))) for t, counts in held if t >= args.warmup]
    if totals:
        print(f"jobs held: {totals[0][1]:.0f} at warm-up, {totals[-1][1]:.0f} at the end "
              f"({slope_per_minute(totals):+.0f} per minute): a server holding more jobs holds more memory")
    out = args.json or os.path.join(HERE, "results", time.strftime("soak-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"args": vars(args), "stats": stats, "growth_mb_per_min": growth, "samples": samples,
                   "jobs_held": held}, f)
    print(f"figures in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
