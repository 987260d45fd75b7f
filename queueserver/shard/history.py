"""The job history: one JSON line per job transition, for the Spark pipeline
(``queueserver history``, :mod:`queueserver.history`).

Each record (schema version 1, in every line)::

    {"v": 1, "time": µs UTC, "shard": int, "event": str, "protocol": str|null,
     "queue": str, "id": str, "number": int, "attempt": int, "priority": int,
     "size": payload bytes, "outcome": str|null, "conn": str|null}

``event`` is one of added, leased, requeued (its lease ran out), released
(its holder left, or the server restarted), returned (a lease or a take
that never reached its client, undone), retried, completed, failed, dead
(out of attempts), expired (TTL), deleted, taken (dequeued with no
acknowledgement); the last six end the job and repeat themselves in
``outcome``. takeanumber's DONE and goqueue's DELETE of a reserved job
are those protocols' way to finish a job: ``completed``. ``protocol`` is the protocol of the client behind the event
(the adder for ``added``, the worker for ``leased``), ``conn`` that
client's connection (``<router>-<connection>``). ``attempt`` is the job's
attempt count once the step that made the event is over.

Lines are kept in memory and written by a greenlet of their own, in the
threadpool, about once a second: nothing on a request's path waits for
the history, and it is not part of the durability promise (a crash may
lose the last second of history, never a job). Files are
``<dir>/history-<start µs>-<seq>.jsonl``, a new one when the current one
passes ``rotate_bytes`` or ``rotate_seconds``.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gevent
from gevent.event import Event

from ..engine.job import COMPLETED, FAILED, LEASED
from ..store.segments import write_all

log = logging.getLogger("queueserver.shard")

SCHEMA_VERSION = 1
#: engine event -> history event, where the event alone says it
_EVENTS = {"add": "added", "restore": "returned", "lease": "leased", "unlease": "returned",
           "release": "released", "exhaust": "dead", "complete": "completed", "retry": "retried",
           "delete": "deleted", "take": "taken", "ttl": "expired"}
#: protocols whose workers finish a job by deleting it
ACK_BY_DELETE = frozenset(("takeanumber", "goqueue"))
#: history events that end a job, with their outcome
_FINAL = {"completed", "failed", "dead", "expired", "deleted", "taken"}

Context = Optional[Tuple[str, str]]   # (protocol, connection) of the client behind a request


def history_event(kind: str, state: int, protocol: Optional[str] = None) -> Optional[str]:
    """The history event of an engine event (None: not one, e.g. a wake-up).
    takeanumber's DONE and goqueue's DELETE of a reserved job are how those
    protocols say a job is done: completed, not deleted."""
    if kind == "delete":
        return "completed" if state == LEASED and protocol in ACK_BY_DELETE else "deleted"
    if kind == "ttr":
        return "dead" if state == FAILED else "requeued"
    if kind == "fail":
        return "failed" if state == FAILED else "retried"
    if kind == "complete" and state != COMPLETED:
        return None
    return _EVENTS.get(kind)


class HistoryWriter:
    """The history files of one shard."""

    def __init__(self, directory: str, shard: int, rotate_bytes: int = 64 << 20,
                 rotate_seconds: float = 3600.0, flush_seconds: float = 1.0) -> None:
        self.directory = directory
        self.shard = shard
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.flush_seconds = flush_seconds
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._lines: List[str] = []
        self._buffered = 0
        self._names: Dict[str, str] = {}      # queue name -> its JSON string
        self._file: Optional[int] = None
        self._file_bytes = 0
        self._file_started = 0.0
        self._seq = 0
        self._wake = Event()
        self._closing = False
        self.records = 0
        self.write_errors = 0
        self._flusher = gevent.spawn(self._flush_loop)

    # ------------------------------------------------------------- recording
    def record(self, entries: Sequence[Tuple[Any, ...]], now: int, context: Context,
               lessee: Callable[[Any], Context]) -> None:
        """One line per entry of an engine step's ``history``; ``lessee(token)``
        is the context of the request a lease went to."""
        head = f'{{"v":{SCHEMA_VERSION},"time":{now},"shard":{self.shard},"event":"'
        names = self._names
        for kind, id, name, number, attempts, priority, size, state, token in entries:
            who = lessee(token) if kind == "lease" else context
            protocol, conn = who if who is not None else (None, None)
            event = history_event(kind, state, protocol)
            if event is None:
                continue
            queue = names.get(name)
            if queue is None:
                queue = names[name] = json.dumps(name)
                if len(names) > 100_000:
                    names.clear()
            line = (f'{head}{event}","protocol":{_str(protocol)},"queue":{queue},"id":"{id}",'
                    f'"number":{number},"attempt":{attempts},"priority":{priority},"size":{size},'
                    f'"outcome":{_str(event if event in _FINAL else None)},"conn":{_str(conn)}}}\n')
            self._lines.append(line)
            self._buffered += len(line)
        if self._buffered > 1 << 20:
            self._wake.set()

    # --------------------------------------------------------------- writing
    def _flush_loop(self) -> None:
        while not self._closing:
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            self._flush()

    def _flush(self) -> None:
        if not self._lines:
            return
        data = "".join(self._lines).encode()
        self._lines = []
        self._buffered = 0
        try:
            if self._file is None or self._file_bytes >= self.rotate_bytes \
                    or time.monotonic() - self._file_started >= self.rotate_seconds:
                self._rotate()
            gevent.get_hub().threadpool.apply(write_all, (self._file, data))
            self._file_bytes += len(data)
            self.records += data.count(b"\n")
        except OSError as err:
            self.write_errors += 1
            log.error("shard %d: history write failed (%s); %d bytes of history dropped",
                      self.shard, err, len(data))

    def _rotate(self) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None
        self._seq += 1
        path = os.path.join(self.directory,
                            f"history-{time.time_ns() // 1000}-{self._seq:06d}.jsonl")
        self._file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._file_bytes = 0
        self._file_started = time.monotonic()

    def close(self) -> None:
        """Write what is buffered and close the current file."""
        self._closing = True
        self._wake.set()
        self._flusher.join()
        self._flush()
        if self._file is not None:
            os.close(self._file)
            self._file = None


def _str(value: Optional[str]) -> str:
    return "null" if value is None else f'"{value}"'
