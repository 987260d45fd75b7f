"""The control socket of a shard or router process: one request, one answer.

Each shard and router listens on a Unix socket of its own in the runtime
directory (``shard-<i>.ctl``, ``router-<i>.ctl``; mode 0600 like the shard
sockets, removed when the process exits). It is *not* the shard's router
socket (``shard-<i>.sock``): a channel there is taken for a router, is sent
every job id and makes the shard announce every job it makes.

The exchange, in msgpack: the asker sends one request, ``["stats"]``; the
process answers one map (see :meth:`queueserver.shard.stats.ShardStats.snapshot`
and :func:`queueserver.router.stats.router_stats`) and closes. Anything else
is answered ``{"error": "..."}``. A shard also answers the web console's
``["console", op, ...]`` requests (:mod:`queueserver.shard.console`), each
in a greenlet of its own that may yield to the loop while it works. A
router of a cluster on etcd also answers ``["cluster", ...]``: the state
its supervisor's watch on etcd passes on (:mod:`queueserver.cluster.watch`).
The process side runs in its gevent loop;
the supervisor's side (:func:`ask`, :func:`ask_all`) uses blocking stdlib
sockets with a timeout, and asks every process at once, so one process that
does not answer costs a scrape at most that timeout.
"""
from __future__ import annotations

import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, TypeVar

import msgpack

if TYPE_CHECKING:   # the process side's; the supervisor runs without gevent's loop
    from gevent import Greenlet
    from gevent import socket as gsocket

#: An answer: a msgpack map, decoded (``Any``: whatever the process sent)
Answer = Dict[str, Any]
#: What answers one kind of request (``["console", ...]``, ``["cluster", ...]``)
Handler = Callable[[List[Any]], Answer]
Key = TypeVar("Key")

log = logging.getLogger("queueserver.metrics")

#: Seconds the supervisor waits for one process's answer.
ASK_TIMEOUT = 1.0
#: Seconds a process gives an asker to send its request.
REQUEST_TIMEOUT = 5.0
#: Largest request a process reads (a cluster's slot map: up to 16,384 runs).
MAX_REQUEST = 1048576
#: Largest answer the supervisor reads.
MAX_ANSWER = 64 * 1024 * 1024


def control_path(socket_path: str) -> str:
    """The control socket beside a shard's socket: ``shard-0.sock`` -> ``shard-0.ctl``."""
    base = socket_path[:-5] if socket_path.endswith(".sock") else socket_path
    return base + ".ctl"


# ------------------------------------------------------------ process side
def serve_control(path: str, stats: Callable[[], Answer], console: Optional[Handler] = None,
                  cluster: Optional[Handler] = None) -> Greenlet[[], None]:
    """Listen on ``path`` (gevent; mode 0600) and answer ``["stats"]`` with
    ``stats()``, ``["console", ...]`` with ``console(request)`` and
    ``["cluster", ...]`` with ``cluster(request)`` (those given); returns
    the accepting greenlet. ``stats`` runs in the event loop, so it sees a
    consistent state and must be quick."""
    handlers = {kind: handler for kind, handler in (("console", console), ("cluster", cluster))
                if handler is not None}
    import gevent
    from gevent import socket as gsocket

    listener = gsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.lexists(path):
        os.unlink(path)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    listener.listen(16)

    def accept_loop() -> None:
        try:
            while True:
                sock, _ = listener.accept()
                gevent.spawn(_answer, sock, stats, handlers)
        finally:
            listener.close()

    return gevent.spawn(accept_loop)


def _answer(sock: gsocket.socket, stats: Callable[[], Answer], handlers: Dict[str, Handler]) -> None:
    try:
        sock.settimeout(REQUEST_TIMEOUT)
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_REQUEST)
        while True:
            data = sock.recv(4096)
            if not data:
                return
            unpacker.feed(data)
            for request in unpacker:
                sock.sendall(msgpack.packb(_handle(request, stats, handlers), use_bin_type=True))
                return
    except (OSError, ValueError, msgpack.UnpackException) as err:
        log.debug("control request failed: %s", err)
    finally:
        sock.close()


def _handle(request: object, stats: Callable[[], Answer], handlers: Dict[str, Handler]) -> Answer:
    kind = request[0] if isinstance(request, list) and request else None
    if isinstance(request, list) and isinstance(kind, str) and kind in handlers:
        try:
            return handlers[kind](request)
        except Exception as err:   # a bug must cost this request only
            log.exception("%s request %.100r failed", kind, request)
            return {"error": f"{kind} request failed: {type(err).__name__}", "status": 500}
    if kind != "stats":
        expected = "".join(f', ["{k}", ...]' for k in handlers)
        return {"error": f"unknown request {request!r:.100}; expected [\"stats\"]{expected}"}
    try:
        return stats()
    except Exception as err:   # a bug in counting must not cost the process
        log.exception("gathering stats failed")
        return {"error": f"gathering stats failed: {type(err).__name__}"}


# --------------------------------------------------------- supervisor side
def ask(path: str, request: Sequence[object] = ("stats",), timeout: float = ASK_TIMEOUT) -> Answer:
    """One process's answer; OSError (ConnectionRefusedError, FileNotFoundError,
    TimeoutError, ...) or ValueError when there is none within ``timeout`` s."""
    import time
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(msgpack.packb(list(request), use_bin_type=True))
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_ANSWER, strict_map_key=False)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{path}: no answer within {timeout:g} s")
            sock.settimeout(left)
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionResetError(f"{path}: closed without an answer")
            unpacker.feed(data)
            for answer in unpacker:
                if not isinstance(answer, dict):
                    raise ValueError(f"{path}: answered {type(answer).__name__}, not a map")
                return answer


def ask_all(paths: Dict[Key, str], timeout: float = ASK_TIMEOUT) -> Dict[Key, Optional[Answer]]:
    """Every process's answer at once (a thread each): key -> answer, or
    None for a process that did not answer (down, starting, stuck)."""
    if not paths:
        return {}

    def one(path: str) -> Optional[Answer]:
        try:
            answer = ask(path, timeout=timeout)
        except (OSError, ValueError, msgpack.UnpackException) as err:
            log.debug("no stats from %s: %s", path, err)
            return None
        if "error" in answer:
            log.warning("stats from %s: %s", path, answer["error"])
            return None
        return answer

    with ThreadPoolExecutor(max_workers=min(len(paths), 32),
                            thread_name_prefix="metrics-ask") as pool:
        futures = {key: pool.submit(one, path) for key, path in paths.items()}
        return {key: future.result() for key, future in futures.items()}
