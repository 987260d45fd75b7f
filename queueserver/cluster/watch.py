"""The supervisor's watch on etcd's cluster state, told to its node's routers and shards.

Routers have no etcd client: each node's supervisor watches the keys that
say where things are (``<prefix>/slotmap``, :mod:`.slotstore`, and
``<prefix>/groups/<ordinal>``, :mod:`.groups`) and which nodes are alive
(``<prefix>/nodes/<name>``, on each node's lease, :mod:`.coordination`),
and tells every router of its node on the router's control socket, as
soon as etcd has a change::

    ["cluster", "view", runs or None, [[ordinal, epoch, primary node, copy], ...],
     [node holding a lease, ...]]

the whole state each time (a router takes it in by epoch, so a view told
twice or late changes nothing). One watch per node, not per router, and
one connection to etcd for it.

Why not etcd3gw's ``watch``: its iterator is fed from a thread of its own
that drops whatever ends the stream, so after etcd restarts (or a
connection is lost) the iterator waits for ever, seeing nothing; and a
watch etcd cancels (its start revision compacted) is ignored the same way
(both checked against etcd 3.4's gateway). So this module posts etcd's
watch request itself, on the etcd3gw client's HTTP session, and reads the
stream in its own thread, where its end is seen.

:class:`ClusterWatch` runs two daemon threads:

- ``etcd-watch`` reads every key of the prefix (the state and its revision),
  then watches the prefix from the next revision; whatever ends the watch
  (etcd restarted or unreachable, the revision compacted, no news for
  :data:`WATCH_QUIET` seconds: a connection cut without a word looks like
  that) makes it read everything again. When etcd cannot be read it says
  so once, tries every :data:`RETRY_EVERY` seconds, and says once that it
  is back. Routers keep the last state meanwhile.
- ``etcd-tell`` tells each router the current state when it changed, and
  when a router's control socket is new (a router started or restarted:
  it gets the state at once); a router that did not answer is told again
  :data:`TELL_EVERY` seconds later.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import etcd3gw
import msgpack
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.utils import _encode, _increment_last_byte
from requests import Response
from requests.exceptions import RequestException

from ..metrics.control import ask
from ..net import faults
from .clusterfile import EtcdSpec
from .coordination import REQUEST_TIMEOUT, CoordinationError, Etcd
from .groups import Group, decode as decode_group
from .slotstore import Run, SlotTable

log = logging.getLogger("queueserver.cluster")

#: Seconds without a word from etcd after which the watch is made again.
WATCH_QUIET = 30.0
#: Seconds between two tries while etcd cannot be read.
RETRY_EVERY = 1.0
#: Seconds between two looks at the routers' control sockets.
TELL_EVERY = 0.2

#: A control socket's identity: (inode, change time); None while there is none
Identity = Optional[Tuple[int, int]]


class WatchEnded(Exception):
    """The watch stream ended or was cancelled (why, in the message)."""


class ClusterState:
    """What etcd says of the cluster: its slot map's runs, each group's
    record, and the nodes that hold a lease."""

    def __init__(self) -> None:
        self.runs: Optional[List[Run]] = None
        self.groups: Dict[int, Group] = {}
        self.nodes: Set[str] = set()

    def take(self, key: str, value: Optional[bytes], prefix: str) -> bool:
        """Key ``key`` (under ``prefix``) now holds ``value`` (None: deleted);
        whether the state changed. A value that cannot be read is logged and
        leaves the state as it was."""
        name = key[len(prefix):]
        try:
            if name == "slotmap":
                runs = None if value is None else SlotTable.decode(value).runs()
                changed = runs != self.runs
                self.runs = runs
                return changed
            if name.startswith("groups/"):
                ordinal = int(name[len("groups/"):])
                if value is None:
                    return self.groups.pop(ordinal, None) is not None
                group = decode_group(value)
                changed = self.groups.get(ordinal) != group
                self.groups[ordinal] = group
                return changed
            if name.startswith("nodes/"):   # a node's registration lives while its lease does
                node = name[len("nodes/"):]
                if value is None:
                    if node not in self.nodes:
                        return False
                    self.nodes.discard(node)
                    return True
                if node in self.nodes:
                    return False
                self.nodes.add(node)
                return True
        except (ValueError, KeyError, TypeError) as err:
            log.warning("etcd key %s holds what cannot be read (%s: %s); routers keep what they "
                        "knew of it", key, type(err).__name__, err)
        return False

    def message(self) -> List[Any]:
        """The control request that tells a router this state."""
        primaries = [[ordinal, group["epoch"], group["primary"], group["copy"]]
                     for ordinal, group in sorted(self.groups.items())]
        return ["cluster", "view", self.runs, primaries, sorted(self.nodes)]


class ClusterWatch:
    """Watches ``<prefix>/`` in etcd and tells the processes whose control
    sockets ``listeners()`` gives: the node's routers (where each slot and
    primary is) and shards (their links to other shards follow the primaries)."""

    def __init__(self, spec: EtcdSpec, listeners: Callable[[], List[str]]) -> None:
        self.etcd = Etcd(spec)   # its own client: the watch holds one of its connections
        self.prefix = self.etcd.key("")
        self.listeners = listeners
        self._lock = threading.Lock()
        self._message: Optional[List[Any]] = None   # None until etcd was read once
        self._version = 0
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._stream: Optional[Response] = None
        self._threads = [threading.Thread(target=self._watch, name="etcd-watch", daemon=True),
                         threading.Thread(target=self._tell, name="etcd-tell", daemon=True)]

    def start(self) -> "ClusterWatch":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        stream = self._stream
        if stream is not None:
            _interrupt(stream)   # the watch thread's read ends
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT * 2)
        self.etcd.close()

    # ------------------------------------------------------------ watching
    def _watch(self) -> None:
        lost = False
        while not self._stop.is_set():
            state = ClusterState()
            try:
                revision = self._read(state)
            except (CoordinationError, KeyError, ValueError) as err:
                if not lost:
                    log.warning("etcd watch lost: %s; routers keep the cluster state they were told, "
                                "and etcd is read again every %g s", err, RETRY_EVERY)
                    lost = True
                self._stop.wait(RETRY_EVERY)
                continue
            if lost:
                log.warning("etcd watch back: routers are told the cluster state again")
                lost = False
            self._publish(state)
            began = time.monotonic()
            try:
                for key, value in self._events(revision + 1):
                    if state.take(key, value, self.prefix):
                        self._publish(state)
            except WatchEnded as ended:
                log.debug("etcd watch ended (%s); reading the state again", ended)
            if time.monotonic() - began < RETRY_EVERY:   # a watch that ends at once: do not spin
                self._stop.wait(RETRY_EVERY)

    def _read(self, state: ClusterState) -> int:
        """Every key under the prefix into ``state``; the revision read at."""
        prefix = self.prefix
        body = {"key": _encode(prefix), "range_end": _encode(_increment_last_byte(prefix))}
        answer = self.etcd.call(lambda client: client.post(client.get_url("/kv/range"), json=body))
        for kv in answer.get("kvs", []):
            state.take(_text(kv["key"]), base64.b64decode(kv.get("value", "")), prefix)
        return int(answer["header"]["revision"])

    def _events(self, start: int) -> Iterator[Tuple[str, Optional[bytes]]]:
        """``(key, new value or None when deleted)`` of each change under the
        prefix from revision ``start``, until the watch ends (WatchEnded)."""
        prefix = self.prefix
        create = {"create_request": {"key": _encode(prefix), "range_end": _encode(_increment_last_byte(prefix)),
                                     "start_revision": start}}
        try:
            self._stream = stream = self.etcd.call(lambda client: _open_watch(client, create))
        except CoordinationError as err:
            raise WatchEnded(str(err)) from None
        try:
            if self._stop.is_set():
                return
            for line in stream.iter_lines():
                if faults.cut_off():
                    raise WatchEnded("cut off by fault injection")
                if not line.strip():
                    continue
                chunk: Any = json.loads(line)
                if "error" in chunk:
                    raise WatchEnded(f"etcd: {chunk['error'].get('message', chunk['error'])}")
                result = chunk.get("result", {})
                if result.get("canceled"):
                    raise WatchEnded(f"cancelled by etcd (compacted to {result.get('compact_revision')}: "
                                     f"{result.get('cancel_reason', '')})")
                for event in result.get("events", ()):
                    kv = event["kv"]
                    deleted = event.get("type") == "DELETE"
                    yield _text(kv["key"]), None if deleted else base64.b64decode(kv.get("value", ""))
            raise WatchEnded("the stream ended")
        except (RequestException, ValueError, KeyError, AttributeError) as err:
            raise WatchEnded(f"{type(err).__name__}: {str(err)[:200]}") from None
        finally:
            self._stream = None
            stream.close()

    def _publish(self, state: ClusterState) -> None:
        message = state.message()
        with self._lock:
            before = self._message
            if message == before:
                return
            self._message = message
            self._version += 1
        log.info("etcd: %s; telling this node's routers and shards", _changes(before, message))
        self._changed.set()

    # ------------------------------------------------------------- telling
    def _tell(self) -> None:
        told: Dict[str, Tuple[int, Identity]] = {}   # control socket -> (version, socket) it was told
        while not self._stop.is_set():
            self._changed.wait(TELL_EVERY)
            self._changed.clear()
            with self._lock:
                message, version = self._message, self._version
            if message is None:
                continue
            for path in self.listeners():
                identity = _identity(path)
                if identity is None or told.get(path) == (version, identity):
                    continue
                try:
                    answer = ask(path, message)
                except (OSError, ValueError, msgpack.UnpackException) as err:
                    log.debug("%s not told yet: %s", path, err)
                    continue   # starting, or stopping: again at the next look
                if "error" in answer:
                    log.warning("%s refused the cluster state: %s", path, answer["error"])
                told[path] = (version, identity)


def _open_watch(client: etcd3gw.Etcd3Client, create: Dict[str, Any]) -> Response:
    """etcd's watch stream, created (its first line read); RequestException or
    Etcd3Exception when this endpoint cannot give one."""
    stream = client.session.post(client.get_url("/watch"), json=create, stream=True,
                                 timeout=(REQUEST_TIMEOUT, WATCH_QUIET))
    if stream.status_code != 200:
        stream.close()
        raise Etcd3Exception(stream.text, stream.reason)
    return stream


def _text(encoded: str) -> str:
    return base64.b64decode(encoded).decode()


def _identity(path: str) -> Identity:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_ctime_ns


def _interrupt(stream: Response) -> None:
    """End a read of ``stream`` blocked in another thread (closing the socket
    would not wake it; shutting it down does)."""
    try:
        with socket.socket(fileno=os.dup(stream.raw.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError, AttributeError):
        pass   # already closed


def _changes(before: Optional[List[Any]], after: List[Any]) -> str:
    """A log line's account of what changed from view ``before`` to ``after``."""
    runs, primaries = after[2], after[3]
    old_runs, old_primaries = (before[2], before[3]) if before is not None else (None, [])
    parts = []
    if before is None or runs != old_runs:
        parts.append("no slot map" if runs is None else f"slot map of {len(runs)} runs")
    told = [p for p in primaries if p not in old_primaries]
    if told:
        parts.append(", ".join(f"shard {o}'s primary on {node} (epoch {epoch}{', its copy' if copy else ''})"
                               for o, epoch, node, copy in told))
    gone = sorted({p[0] for p in old_primaries} - {p[0] for p in primaries})
    if gone:
        parts.append(f"no record of shard {', '.join(map(str, gone))}")
    leased, old_leased = set(after[4]), set(before[4]) if before is not None else set()
    if leased - old_leased:
        parts.append(f"node {', '.join(sorted(leased - old_leased))} holds a lease")
    if old_leased - leased:
        parts.append(f"node {', '.join(sorted(old_leased - leased))} holds no lease (lapsed or stopped)")
    return "; ".join(parts) or "no change"

