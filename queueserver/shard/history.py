"""The job history: one JSON line per job transition, for the Spark pipeline
(``queueserver history``, :mod:`queueserver.history`).

Each line (schema version 2) is a JSON array, its fields by position
(:data:`FIELDS`)::

    [2, time µs UTC, shard, event, protocol|null, queue, id, number,
     attempt, priority, size (payload bytes), conn|null]

Version 1 files (one JSON object per line, the same fields by name and an
``outcome``) are still read: :func:`decode` here, and the Spark reader.
The arrays take half the bytes of the objects and less CPU to make
(``loadtests/history_writer_bench.py``); ``outcome`` is not written as it
is the event's name on a final event.

``event`` is one of added, leased, requeued (its lease ran out), released
(its holder left, or the server restarted), returned (a lease or a take
that never reached its client, undone), retried, completed, failed, dead
(out of attempts), expired (TTL), deleted, taken (dequeued with no
acknowledgement); the last six end the job. takeanumber's DONE and
goqueue's DELETE of a reserved job are those protocols' way to finish a
job: ``completed``. ``protocol`` is the protocol of the client behind the
event (the adder for ``added``, the worker for ``leased``), ``conn`` that
client's connection (``<router>-<connection>``). ``attempt`` is the job's
attempt count once the step that made the event is over.

Lines are kept in memory and written by a greenlet of their own, in the
threadpool, about once a second: nothing on a request's path waits for
the history, and it is not part of the durability promise (a crash may
lose the last second of history, never a job). Files (segments) are
``<dir>/history-<start µs>-<seq>.jsonl``, a new one when the current one
would pass ``rotate_bytes`` or is ``rotate_seconds`` old. Retention
(:class:`HistoryWriter`) drops the oldest segments past an age or a size.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Final, List, Optional, Sequence, Tuple, Union

import gevent
from gevent.event import Event

from ..history.checkpoint import NAME as CHECKPOINT_NAME, Checkpoint
from ..history.errors import HistoryError
from ..store.segments import write_all
from .outcomes import FINAL as _FINAL, history_event

log: Final = logging.getLogger("queueserver.shard")

SCHEMA_VERSION: Final = 2

#: (protocol, connection) of the client behind a request: a tuple, or a list
#: once it crossed a router's link (as :data:`queueserver.links.shardlink.Context`)
Context = Optional[Sequence[str]]


#: The fields of a version-2 line, by position (a version-1 line names them and adds ``outcome``).
FIELDS: Final = ("v", "time", "shard", "event", "protocol", "queue", "id", "number", "attempt", "priority",
          "size", "conn")
#: A segment's file name: ``history-<start µs>-<seq>.jsonl``.
SEGMENT_NAME: Final = re.compile(r"history-(\d+)-(\d+)\.jsonl\Z")
#: The size bound holds about this many segments, so a drop frees an eighth of it.
SEGMENTS_PER_BOUND: Final = 8
MIN_SEGMENT_BYTES: Final = 4096


def decode(line: Union[str, bytes]) -> Dict[str, Any]:
    """A history line of either schema version as a version-1 record (fields
    by name, ``outcome`` included): for tests and tools that read the files."""
    value = json.loads(line)
    if isinstance(value, list):
        record = dict(zip(FIELDS, value))
        record["outcome"] = record.get("event") if record.get("event") in _FINAL else None
        return record
    if not isinstance(value, dict):
        raise ValueError(f"not a history line: {line!r}")
    return value


@dataclass
class Segment:
    """One history file: its path, its bytes, its last write (s since the epoch)."""
    path: str
    size: int
    mtime: float


class HistoryWriter:
    """The history files of one shard, kept within ``max_bytes`` and ``max_age``.

    Retention drops whole segments, oldest first: before each write as many
    as it takes for the directory to stay within ``max_bytes`` with the new
    bytes in it (the segment being written is closed first when it stands in
    the way), so the bound holds at every moment, not on average; and, about
    once a second, those last written more than ``max_age`` seconds ago.
    ``rotate_bytes`` is cut to an eighth of ``max_bytes`` so that one drop
    frees a small part of the bound, ``rotate_seconds`` to an eighth of
    ``max_age`` so that segments age out about on time. None (or 0): no
    bound. Segments of earlier runs, of either schema version, count too.

    ``checkpoint``: the ``_checkpoint.json`` that ``queueserver history --out
    OUT`` writes (or OUT itself). Every segment dropped is one log line: a
    warning when that checkpoint has not read all of it (or cannot be read),
    so that history nobody analysed never goes silently; info otherwise.
    """

    def __init__(self, directory: str, shard: int, max_bytes: Optional[int] = None,
                 max_age: Optional[float] = None, checkpoint: Optional[str] = None,
                 rotate_bytes: int = 64 << 20, rotate_seconds: float = 3600.0,
                 flush_seconds: float = 1.0) -> None:
        self.directory = directory
        self.shard = shard
        self.max_bytes = max_bytes or None
        self.max_age = max_age or None
        self.checkpoint = checkpoint
        if self.max_bytes:
            rotate_bytes = min(rotate_bytes, max(self.max_bytes // SEGMENTS_PER_BOUND, MIN_SEGMENT_BYTES))
        if self.max_age:
            rotate_seconds = min(rotate_seconds, self.max_age / SEGMENTS_PER_BOUND)
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.flush_seconds = flush_seconds
        #: buffered bytes that wake the flusher early (a flush stays well inside a segment)
        self._wake_bytes = min(1 << 20, max(1, rotate_bytes // 2))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._lines: List[str] = []
        self._buffered = 0
        self._names: Dict[str, str] = {}      # queue name -> its JSON string
        #: closed segments, oldest first, and their bytes together
        self._closed: Deque[Segment] = deque(self._existing())
        self._closed_bytes = sum(segment.size for segment in self._closed)
        self._current: Optional[Segment] = None   # the segment being written
        self._file: Optional[int] = None
        self._file_started = 0.0
        self._seq = 0
        self._wake = Event()
        self._closing = False
        self.records = 0
        self.write_errors = 0
        self.dropped = 0           # segments retention removed
        self.unread_dropped = 0    # ... of which the checkpoint had not read all
        log.info("shard %d history: %d segments, %d bytes in %s; kept within %s and %s", shard,
                 len(self._closed), self._closed_bytes, directory,
                 f"{self.max_bytes} bytes" if self.max_bytes else "any size",
                 f"{self.max_age:g} s" if self.max_age else "any age")
        self._flusher = gevent.spawn(self._flush_loop)

    def _existing(self) -> List[Segment]:
        """The segments earlier runs left, oldest first."""
        found: List[Tuple[Tuple[int, int], Segment]] = []
        for entry in os.scandir(self.directory):
            match = SEGMENT_NAME.match(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                found.append(((int(match[1]), int(match[2])), Segment(entry.path, st.st_size, st.st_mtime)))
        return [segment for _, segment in sorted(found, key=lambda item: item[0])]

    @property
    def bytes(self) -> int:
        """Bytes of every segment on disk."""
        return self._closed_bytes + (self._current.size if self._current is not None else 0)

    @property
    def segments(self) -> int:
        """Segments on disk, the one being written included."""
        return len(self._closed) + (self._current is not None)

    def stats(self) -> Dict[str, int]:
        """For ``/metrics``."""
        return {"history_bytes": self.bytes, "history_segments": self.segments,
                "history_dropped": self.dropped, "history_unread_dropped": self.unread_dropped}

    # ------------------------------------------------------------- recording
    def record(self, entries: Sequence[Tuple[Any, ...]], now: int, context: Context,
               lessee: Callable[[Any], Context]) -> None:
        """One line per entry of an engine step's ``history``; ``lessee(token)``
        is the context of the request a lease went to."""
        head = f'[{SCHEMA_VERSION},{now},{self.shard},"'
        names = self._names
        for kind, id, name, number, attempts, priority, size, state, token in entries:
            who = lessee(token) if kind == "lease" else context
            protocol, conn = who if who is not None else (None, None)
            event = history_event(kind, state)
            if event is None:
                continue
            queue = names.get(name)
            if queue is None:
                queue = names[name] = json.dumps(name)
                if len(names) > 100_000:
                    names.clear()
            line = (f'{head}{event}",{_str(protocol)},{queue},"{id}",{number},{attempts},'
                    f'{priority},{size},{_str(conn)}]\n')
            self._lines.append(line)
            self._buffered += len(line)
        if self._buffered > self._wake_bytes:
            self._wake.set()

    # --------------------------------------------------------------- writing
    def _flush_loop(self) -> None:
        while not self._closing:
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            self._flush()

    def _flush(self) -> None:
        """Write what is buffered once retention has made room for it; close a
        segment that is due, and drop the segments past their age, written or not."""
        data = "".join(self._lines).encode() if self._lines else b""
        self._lines = []
        self._buffered = 0
        try:
            current = self._current
            if current is not None and (current.size + len(data) > self.rotate_bytes
                                        or time.monotonic() - self._file_started >= self.rotate_seconds):
                self._close_current()
            self._retain(len(data))
            if not data:
                return
            if self._file is None:
                self._open()
            file, current = self._file, self._current
            assert file is not None and current is not None   # open together
            gevent.get_hub().threadpool.apply(write_all, (file, data))
            current.size += len(data)
            current.mtime = time.time()
            self.records += data.count(b"\n")
        except OSError as err:
            self.write_errors += 1
            if self._file is not None and self._current is not None:   # a write cut short counts what reached the file
                self._current.size = os.fstat(self._file).st_size
            log.error("shard %d: history write failed (%s); %d bytes of history dropped",
                      self.shard, err, len(data))

    def _open(self) -> None:
        self._seq += 1
        path = os.path.join(self.directory,
                            f"history-{time.time_ns() // 1000}-{self._seq:06d}.jsonl")
        self._file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._current = Segment(path, 0, time.time())
        self._file_started = time.monotonic()

    def _close_current(self) -> None:
        file, current = self._file, self._current
        assert file is not None and current is not None   # open together
        os.close(file)
        self._file = None
        self._closed.append(current)
        self._closed_bytes += current.size
        self._current = None

    # ------------------------------------------------------------- retention
    def _retain(self, incoming: int) -> None:
        """Drop the closed segments past ``max_age``, then the oldest while the
        directory with ``incoming`` more bytes would pass ``max_bytes``."""
        closed = self._closed
        drops: List[Tuple[Segment, str]] = []

        def drop_oldest(reason: str) -> None:
            segment = closed.popleft()
            self._closed_bytes -= segment.size
            drops.append((segment, reason))

        if self.max_age:
            oldest = time.time() - self.max_age
            while closed and closed[0].mtime < oldest:
                drop_oldest(f"older than max_age {self.max_age:g} s")
        if self.max_bytes:
            while closed and self.bytes + incoming > self.max_bytes:
                drop_oldest(f"over max_bytes {self.max_bytes}")
        if drops:
            self._drop(drops)

    def _drop(self, drops: List[Tuple[Segment, str]]) -> None:
        """Remove ``drops`` (in the threadpool: a checkpoint to read, files to
        unlink) and say so, one line per segment."""
        done: List[Tuple[Segment, str, bool, str, Optional[OSError]]] = gevent.get_hub().threadpool.apply(
            _remove, (drops, self.checkpoint))
        for segment, reason, unread, note, error in done:
            name = os.path.basename(segment.path)
            if error is not None:
                log.error("shard %d: history retention could not remove %s (%s)", self.shard,
                          segment.path, error)
                continue
            self.dropped += 1
            if unread:
                self.unread_dropped += 1
                log.warning("shard %d: history retention dropped %s (%d bytes, %s) before queueserver "
                            "history read it: %s", self.shard, name, segment.size, reason, note)
            else:
                log.info("shard %d: history retention dropped %s (%d bytes, %s); %s", self.shard, name,
                         segment.size, reason, note)

    def close(self) -> None:
        """Write what is buffered and close the current file."""
        self._closing = True
        self._wake.set()
        self._flusher.join()
        self._flush()
        if self._file is not None:
            self._close_current()


def _remove(drops: List[Tuple[Segment, str]], checkpoint: Optional[str]
            ) -> List[Tuple[Segment, str, bool, str, Optional[OSError]]]:
    """Unlink each segment, and tell whether ``checkpoint`` had read all of it:
    ``(segment, reason, unread, what the checkpoint says, error)``."""
    consumed, problem = _read_checkpoint(checkpoint) if checkpoint is not None else ({}, None)
    out: List[Tuple[Segment, str, bool, str, Optional[OSError]]] = []
    for segment, reason in drops:
        if checkpoint is None:
            unread, note = False, "no [history] checkpoint to tell whether queueserver history read it"
        elif problem is not None:
            unread, note = True, problem
        else:
            read = consumed.get(_tail(segment.path))
            unread = read is None or read < segment.size
            note = (f"{checkpoint} has not read it" if read is None else
                    f"{checkpoint} has read {read} of its {segment.size} bytes" if unread else
                    f"read by queueserver history ({checkpoint})")
        try:
            os.unlink(segment.path)
            error = None
        except FileNotFoundError:   # gone already: what retention wanted
            error = None
        except OSError as err:
            error = err
        out.append((segment, reason, unread, note, error))
    return out


def _read_checkpoint(checkpoint: str) -> Tuple[Dict[str, int], Optional[str]]:
    """Bytes read per segment (by :func:`_tail`) according to the checkpoint of
    ``queueserver history``, or what is wrong with it."""
    path = os.path.join(checkpoint, CHECKPOINT_NAME) if os.path.isdir(checkpoint) else checkpoint
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}, f"{path} does not exist (queueserver history has not run yet)"
    except (OSError, UnicodeDecodeError) as err:
        return {}, f"{path} cannot be read ({err})"
    try:
        files = Checkpoint.from_json(text, path).files
    except HistoryError as err:
        return {}, str(err)
    consumed: Dict[str, int] = {}
    for name, mark in files.items():
        tail = _tail(name)
        consumed[tail] = max(consumed.get(tail, 0), mark.consumed)
    return consumed, None


def _tail(path: str) -> str:
    """``shard-N/history-...jsonl``: how a segment is known in a checkpoint,
    whose paths are Spark's (``file:/...``, ``hdfs://...``, a copy's)."""
    return "/".join(path.rstrip("/").rsplit("/", 2)[-2:])


def _str(value: Optional[str]) -> str:
    return "null" if value is None else f'"{value}"'
