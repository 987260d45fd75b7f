"""In-process cost of each codec on one job cycle: decode the cycle's
requests and render their answers, no sockets, no engine.

Why: the server's CPU per cycle mixes syscalls, the event loop, the engine
and the codec, and a noisy machine hides a few microseconds in the whole.
Timed alone, a codec change shows its effect in microseconds per cycle
(``bench.py`` and ``cycle_cpu.py`` give the whole server's figure).

The cycle is the bench's: enqueue a 100-byte payload, take it, finish it
(queued and TaskFlux take with no acknowledgement, so two requests). Each
request arrives in a read of its own, as with one request in flight.

Times are this process's CPU time (other processes on a shared machine
count less), the best of several runs.

    .venv/bin/python loadtests/codec_cost.py [--cycles 20000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import base64
import os
import struct
import sys
import time
import uuid
from typing import Any, Callable, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from queueserver.engine.status import OK  # noqa: E402
from queueserver.engine.views import LeaseView  # noqa: E402
from queueserver.protocols import codec_class  # noqa: E402

PAYLOAD = 100
QUEUE = b"bench-queue-17"

Step = Tuple[bytes, list]      # request bytes, the engine's reply to it


def _lease_reply(id: str, payload: bytes) -> list:
    return [OK, LeaseView(id, QUEUE.decode(), payload, 7, 0, 60000, 1, (0, 0, 1, 7), 0)]


def workq_cycle() -> List[Step]:
    id = str(uuid.uuid4())
    payload = (id + "x" * PAYLOAD)[:PAYLOAD].encode()
    return [
        (b"add %s %s 60000 3600000 %d\r\n%s\r\n" % (id.encode(), QUEUE, len(payload), payload),
         [OK, [id, 7]]),
        (b"lease %s 1000\r\n" % QUEUE, _lease_reply(id, payload)),
        (b"complete %s 0\r\n\r\n" % id.encode(), [OK, None]),
    ]


def goqueue_cycle() -> List[Step]:
    id = str(uuid.uuid4())
    payload = b"p" * PAYLOAD
    return [
        (b"ADD\0" + QUEUE + b"\0" + struct.pack("<III", 0, 60, len(payload)) + payload,
         [OK, [id, 7]]),
        (b"RESERVE\0" + QUEUE + b"\0" + struct.pack("<I", 1), _lease_reply(id, payload)),
        (b"DELETE\0" + struct.pack("<Q", 7), [OK, None]),
    ]


def takeanumber_cycle() -> List[Step]:
    id = str(uuid.uuid4())
    payload = b"p" * PAYLOAD
    return [
        (b"ADD %s 0 %s\r\n" % (QUEUE, payload), [OK, [id, 7]]),
        (b"RESERVE %s\r\n" % QUEUE, _lease_reply(id, payload)),
        (b"DONE %s %s\r\n" % (QUEUE, id.encode()), [OK, None]),
    ]


def queued_cycle() -> List[Step]:
    id = str(uuid.uuid4())
    payload = b"p" * PAYLOAD
    return [
        (b"ENQUE " + base64.b64encode(payload) + b"\n", [OK, [id, 7]]),
        (b"DEQUE\n", _lease_reply(id, payload)),
    ]


def taskflux_cycle() -> List[Step]:
    id = str(uuid.uuid4())
    payload = b"p" * PAYLOAD

    def packet(body: bytes) -> bytes:
        return b"D" + struct.pack(">i", len(body)) + body

    name = struct.pack(">i", len(QUEUE)) + QUEUE
    return [
        (packet(b"E" + name + struct.pack(">q", 5) + struct.pack(">i", len(payload)) + payload),
         [OK, [id, 7]]),
        (packet(b"D" + name), _lease_reply(id, payload)),
    ]


CYCLES: List[Tuple[str, Callable[[], List[Step]]]] = [
    ("workq", workq_cycle), ("goqueue", goqueue_cycle), ("takeanumber", takeanumber_cycle),
    ("queued", queued_cycle), ("taskflux", taskflux_cycle),
]


def time_codec(protocol: str, steps: List[Step], cycles: int) -> Tuple[float, float]:
    """µs per cycle: (decode only, decode + render)."""
    codec = codec_class(protocol)()
    receive = codec.receive
    requests = [request for request, _ in steps]
    # Every request must decode to one command that renders its reply.
    for request, reply in steps:
        commands = receive(request)
        assert len(commands) == 1 and commands[0].render is not None, (protocol, request, commands)
        commands[0].render(reply)

    started = time.process_time()
    for _ in range(cycles):
        for request in requests:
            receive(request)
    decode = time.process_time() - started

    started = time.process_time()
    for _ in range(cycles):
        for request, reply in steps:
            for command in receive(request):
                command.render(reply)
    both = time.process_time() - started
    return decode / cycles * 1e6, both / cycles * 1e6


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="codec_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5, help="runs per codec; the best is shown")
    parser.add_argument("--only", choices=[name for name, _ in CYCLES])
    args = parser.parse_args(argv)
    print(f"{'codec':<12} {'requests':>8} {'decode µs':>10} {'decode+render µs':>17}  (per cycle, best of {args.repeat})")
    for protocol, make in CYCLES:
        if args.only and protocol != args.only:
            continue
        steps = make()
        runs = [time_codec(protocol, steps, args.cycles) for _ in range(args.repeat)]
        decode = min(run[0] for run in runs)
        both = min(run[1] for run in runs)
        print(f"{protocol:<12} {len(steps):>8} {decode:>10.2f} {both:>17.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
