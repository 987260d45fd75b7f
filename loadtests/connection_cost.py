"""In-process cost of serving one job cycle through a client connection:
the connection code, the codec and the socket calls, without an engine.

Why: between the codec (``codec_cost.py``) and the whole server
(``cycle_cpu.py``) sits :class:`~queueserver.net.connection.ClientConnection`
with its writer: per request a ``recv``, decoding, ordering and budgeting,
rendering, and per loop turn one ``send`` per connection. Here that path
runs as the event loop would run it (the watcher's callback, then the
writers' end-of-turn flush), over real socket pairs, against a stand-in
server that answers each request at once with a canned engine reply, so
what changes in it shows in microseconds per cycle.

Times are this process's CPU time (other processes on a shared machine
count less), the best of several runs.

    .venv/bin/python loadtests/connection_cost.py [--cycles 20000] [--connections 32]
"""
from __future__ import annotations

import argparse
import os
import socket as stdsocket
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gevent import socket  # noqa: E402

import codec_cost  # noqa: E402
from queueserver.net import channel  # noqa: E402
from queueserver.net.connection import SERVE, ClientConnection  # noqa: E402
from queueserver.protocols import codec_class  # noqa: E402


class CannedServer:
    """Answers every request at once with the reply its op is given."""

    max_outstanding_bytes = 8 * 1048576
    max_payload = 1048576

    def __init__(self, replies: dict) -> None:
        self.replies = replies
        self.hangups = None
        self._ids = 0

    def new_connection_id(self) -> int:
        self._ids += 1
        return self._ids

    def placement(self, connection: Any, command: Any) -> int:
        return SERVE

    def execute(self, connection: Any, command: Any, callback: Callable[[list], None]) -> None:
        callback(self.replies[command.op])

    def after_requests(self) -> None:
        pass

    def connection_closed(self, connection: Any) -> None:
        pass

    def client_left(self, connection: Any) -> None:
        pass


def run(protocol: str, cycles: int, connections: int) -> float:
    """µs per cycle over ``connections`` connections, each request read,
    served and flushed in loop turns that serve every connection once."""
    steps = dict(codec_cost.CYCLES)[protocol]()
    codec = codec_class(protocol)
    replies = {}
    probe = codec()
    for request, reply in steps:
        (command,) = probe.receive(request)
        replies[command.op] = reply
    server = CannedServer(replies)
    pairs = []
    for _ in range(connections):
        ours, theirs = stdsocket.socketpair()
        conn = ClientConnection(server, socket.socket(fileno=ours.detach()), codec(), protocol)
        pairs.append((conn, theirs))
    requests = [request for request, _ in steps]
    rounds = max(1, cycles // connections)
    started = time.process_time()
    for _ in range(rounds):
        for request in requests:
            for conn, client in pairs:
                client.send(request)
            for conn, client in pairs:      # one loop turn: every connection readable
                conn._readable()
            channel._flush_pending()        # the turn's end: one send per connection
            for conn, client in pairs:
                client.recv(65536)
    elapsed = time.process_time() - started
    for conn, client in pairs:
        conn._lost()
        client.close()
    return elapsed / (rounds * connections) * 1e6


def floor(protocol: str, cycles: int, connections: int) -> float:
    """The same traffic with the server side reduced to one recv and one
    send of a fixed answer per request: the socket calls alone."""
    steps = dict(codec_cost.CYCLES)[protocol]()
    probe = codec_class(protocol)()
    answers = [probe.receive(request)[0].render(reply) for request, reply in steps]
    pairs = [stdsocket.socketpair() for _ in range(connections)]
    for ours, _ in pairs:
        ours.setblocking(False)
    requests = [request for request, _ in steps]
    rounds = max(1, cycles // connections)
    started = time.process_time()
    for _ in range(rounds):
        for request, answer in zip(requests, answers):
            for ours, client in pairs:
                client.send(request)
            for ours, client in pairs:
                ours.recv(65536)
            for ours, client in pairs:
                ours.send(answer)
            for ours, client in pairs:
                client.recv(65536)
    elapsed = time.process_time() - started
    for ours, client in pairs:
        ours.close()
        client.close()
    return elapsed / (rounds * connections) * 1e6


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="connection_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5, help="runs per codec; the best is shown")
    parser.add_argument("--only", choices=[name for name, _ in codec_cost.CYCLES])
    args = parser.parse_args(argv)
    print(f"{'codec':<12} {'µs/cycle':>9} {'sockets':>8} {'beyond':>7}  (best of {args.repeat}; "
          "sockets: the client's and server's socket calls alone)")
    for protocol, _ in codec_cost.CYCLES:
        if args.only and protocol != args.only:
            continue
        best = min(run(protocol, args.cycles, args.connections) for _ in range(args.repeat))
        least = min(floor(protocol, args.cycles, args.connections) for _ in range(args.repeat))
        print(f"{protocol:<12} {best:>9.2f} {least:>8.2f} {best - least:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
