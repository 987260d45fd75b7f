"""The writer: appends records to the current segment under an fsync policy.

``append`` encodes a record into memory and returns; ``commit(callback)``
calls back once everything appended so far is as durable as the policy
promises, so a shard answers a request only then:

- ``always``: after write + fsync. Group commit: one greenlet (the flusher)
  takes everything appended so far and writes and fsyncs it; what is
  appended meanwhile is covered by the next single write + fsync. Where:
  in the event loop's own thread while fsyncs are fast (as Redis's
  ``appendfsync always`` does): a threadpool round trip per commit (a
  thread woken, the loop woken back) cost ~100 µs of CPU per job cycle,
  more than all the rest of the durable path, to save a wait of well under
  a millisecond. Once an fsync takes longer than ``slow_sync_ms`` (or
  fails), the next ones go to the threadpool, so a slow or failing disk
  never stalls the loop's timers and reads for long; the first fast one
  brings them back.
- ``interval``: after the write; a background greenlet asks for an fsync
  every ``interval_ms``. A crash of the process loses nothing written; a
  power loss may lose up to the last interval.
- ``never``: after the write; the OS decides when it reaches the disk.

A write or fsync error (ENOSPC, EIO, EFBIG) goes to every waiting callback
as a :class:`WriteFailed`, and to callers that commit while the log is
failing. Nothing is dropped: the file is cut back to its last good offset
(no half-written record stays in the middle of a file), the records stay in
memory in order, and they are written again every ``retry_ms`` until the
disk allows. After a failed fsync everything since the last good fsync is
written again from memory, since the kernel may have dropped those pages.

Segments rotate at ``segment_bytes``; the old one is fsynced first, so
only the newest segment can ever end in a torn record.

Why one module, though over 600 lines: the policies, the group commit, the
retries after a failed write and the rotation all move one file's offsets
and one in-memory tail, and each is only right together with the others.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, Final, Iterable, List, Optional, Sequence,
                    Tuple, TypeVar, TypedDict, Union, final)

import gevent
from gevent.event import AsyncResult, Event

from . import format as F
from .compaction import DEFAULT_FACTOR, DEFAULT_MIN_BYTES, install_snapshot, should_compact, write_snapshot
from .errors import StoreError, WriteFailed
from .segments import Recovery, create_segment, remove_segments, segment_name
from ..metrics import FSYNC_BUCKETS
from ..metrics.histogram import Histogram

if TYPE_CHECKING:
    from gevent.threadpool import ThreadPool

log: Final = logging.getLogger("queueserver.store")

POLICIES: Final = ("always", "interval", "never")
MIB: Final = 1024 * 1024
#: An fsync slower than this (ms) sends the following ones to the threadpool.
SLOW_SYNC_MS: Final = 5.0

Callback = Callable[[Optional[StoreError]], None]
_T = TypeVar("_T")
#: A pool thread's outcome: ``(result, None)``, or ``(None, the OSError)``.
Outcome = Union[Tuple[_T, None], Tuple[None, OSError]]


class CompactionStats(TypedDict):
    """What :meth:`AppendLog.finish_compaction` did."""
    snapshot: str     # its path
    records: int
    bytes: int
    freed: int        # bytes of history removed
    seconds: float


@final
class _Chunk:
    """Encoded records waiting to be written (or, under ``interval``, to be fsynced).

    Once handed to a write it is ``sealed``: appends go to a new chunk, even
    if a failed write puts it back, since the write's buffer views may live on.
    """

    __slots__ = ("data", "records", "sealed")

    def __init__(self) -> None:
        self.data = bytearray()
        self.records = 0
        self.sealed = False


@final
class _Rotate:
    """A cut in the pending records: what follows goes to segment ``seq``."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = seq


class _Segment:
    __slots__ = ("seq", "path", "fd", "size", "synced", "unsynced")

    def __init__(self, seq: int, path: str, fd: int, size: int) -> None:
        self.seq = seq
        self.path = path
        self.fd = fd
        self.size = size            # bytes written
        self.synced = size          # bytes known on disk
        self.unsynced: List[_Chunk] = []   # written since the last fsync (interval)


def _catching(func: Callable[..., _T], *args: Any) -> Outcome[_T]:
    """Run in a pool thread: an OSError comes back as a value, not a printed traceback."""
    try:
        return func(*args), None
    except OSError as err:
        return None, err


def _pwrite_all(fd: int, data: bytearray, offset: int) -> None:
    with memoryview(data) as view:
        done, size = 0, len(view)
        while done < size:
            done += os.pwrite(fd, view[done:], offset + done)


def _pwrite_sync(fd: int, data: bytearray, offset: int) -> float:
    _pwrite_all(fd, data, offset)
    return _timed_fdatasync(fd)


def _timed_fdatasync(fd: int) -> float:
    """fdatasync ``fd``; the seconds it took (for the fsync histogram of /metrics)."""
    started = time.perf_counter()
    os.fdatasync(fd)
    return time.perf_counter() - started


class AppendLog:
    """A shard's append-only log, continued after a :class:`Recovery` was replayed."""

    def __init__(self, recovery: Recovery, policy: str = "always", interval_ms: int = 1000,
                 segment_bytes: int = 64 * MIB, retry_ms: int = 1000,
                 compact_min_bytes: int = DEFAULT_MIN_BYTES, compact_factor: float = DEFAULT_FACTOR,
                 threadpool: Optional[ThreadPool] = None, slow_sync_ms: float = SLOW_SYNC_MS) -> None:
        if policy not in POLICIES:
            raise ValueError(f"fsync policy {policy!r}: expected one of {', '.join(POLICIES)}")
        if not recovery.done:
            raise StoreError(f"{recovery.directory}: replay the log before writing to it")
        self.directory = recovery.directory
        self.shard = recovery.shard
        self.shards = recovery.shards
        self.policy = policy
        self.interval = interval_ms / 1000.0
        self.segment_bytes = segment_bytes
        self.retry = retry_ms / 1000.0
        self.compact_min_bytes = compact_min_bytes
        self.compact_factor = compact_factor
        self._pool = threadpool
        self.slow_sync = slow_sync_ms / 1000.0
        self._sync_in_loop = slow_sync_ms > 0   # (see the module's docstring)
        #: seq -> size of every closed segment and snapshot on disk
        self._files: Dict[int, int] = {seq: size for seq, (size, _) in recovery.files.items()}
        self._base_seq = recovery.base_seq
        self._base_bytes = self._files.get(recovery.base_seq, 0)
        self._next_seq = recovery.max_seq + 1
        self._seg: Optional[_Segment] = None
        self._pending: Deque[Union[_Chunk, _Rotate]] = deque()   # in order
        self._cuts = 0                          # _Rotate entries pending
        self._waiters: Deque[Tuple[int, Callback]] = deque()
        self._appended = 0    # logical bytes: appended, written, known on disk
        self._written = 0
        self._durable = 0
        self._repair: Optional[int] = None      # cut the current segment back to this first
        self._sync_due = False
        self._in_flight = 0                     # records being written now
        self._wake = Event()
        self._retry_now = Event()
        self._retry_at = 0.0
        self._flusher: Optional[gevent.Greenlet[[], None]] = None
        self._ticker: Optional[gevent.Greenlet[[], None]] = None
        self._closing = False
        self._closed = False
        self._compacting = False
        #: the epoch records are written under (see .format): the newest the log holds
        #: until its owner says otherwise (a primary takes its group's, a copy its stream's)
        self.epoch = recovery.max_epoch
        #: the error the log is failing with, None while it works
        self.error: Optional[WriteFailed] = None
        # counters
        self.appended_records = 0
        self.written_bytes = 0
        self.fsyncs = 0
        self.pooled_fsyncs = 0     # of those, in the threadpool (the disk was slow)
        self.fsynced_records = 0
        self.max_records_per_fsync = 0
        self.write_errors = 0
        self.compactions = 0
        self.segments_created = 0
        self.fsync_seconds = Histogram(FSYNC_BUCKETS)   # one count per fsync counted in `fsyncs`

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "AppendLog":
        """Open a new segment and start writing (call from a greenlet or the main one)."""
        if self._pool is None:
            self._pool = gevent.get_hub().threadpool
        seq = self._next_seq
        self._seg = self._run_raising(self._new_segment, seq)
        self.segments_created += 1
        self._next_seq = seq + 1
        self._flusher = gevent.spawn(self._flush_loop)
        if self.policy == "interval":
            self._ticker = gevent.spawn(self._tick)
        return self

    def close(self) -> None:
        """Write what is pending (one attempt if the log is failing), fsync, close."""
        if self._closed or self._seg is None:
            return
        self._closing = True
        self._wake.set()
        self._retry_now.set()
        if self._flusher is not None:
            self._flusher.join()
        if self._ticker is not None:
            self._ticker.kill()
        seg = self._seg
        if seg.synced < seg.size and self._repair is None:
            _, err = self._run(os.fdatasync, seg.fd)
            if err is not None:
                log.warning("%s: fsync at close failed: %s", seg.path, err)
        os.close(seg.fd)
        self._closed = True

    # -------------------------------------------------------------- writing
    def append(self, record: Sequence[Any]) -> None:
        """Buffer one record (a msgpack-able tuple); it is written soon, in order."""
        if self._closing:
            raise StoreError(f"{self.directory}: the log is closed")
        frame = F.encode_record(record, self.epoch)
        pending = self._pending
        tail = pending[-1] if pending else None
        if tail is None or type(tail) is not _Chunk or tail.sealed:
            tail = _Chunk()
            pending.append(tail)
        tail.data += frame
        tail.records += 1
        self._appended += len(frame)
        self.appended_records += 1
        self._wake.set()

    def commit(self, callback: Callback) -> None:
        """Call ``callback(None)`` once all appended records are durable under
        the policy, or ``callback(error)`` if they could not be written.

        Callbacks run in the flusher greenlet (or at once, before this
        returns, when there is nothing to wait for) and must not block.
        """
        target = self._appended
        if target <= (self._durable if self.policy == "always" else self._written):
            callback(None)
        elif self._closing:
            callback(StoreError(f"{self.directory}: the log is closed"))
        elif self.error is not None:
            callback(self.error)
        else:
            self._waiters.append((target, callback))
            self._wake.set()

    def sync(self) -> None:
        """Block this greenlet until :meth:`commit` would call back; raise its error."""
        done: AsyncResult[None] = AsyncResult()
        self.commit(lambda err: done.set_exception(err) if err is not None else done.set(None))
        done.get()

    # ----------------------------------------------------------- compaction
    def needs_compaction(self) -> bool:
        """True when the log has outgrown its last snapshot (see :func:`should_compact`)."""
        return not self._compacting and should_compact(
            self.disk_bytes(), self._base_bytes, self.compact_min_bytes, self.compact_factor)

    def compact(self, snapshot_records: Iterable[Sequence[Any]],
                chunk_records: int = 1000) -> CompactionStats:
        """Replace the history with a snapshot; blocks the calling greenlet only.

        ``snapshot_records`` must rebuild the state as of this call (every
        record appended before it included) and must not change while it is
        consumed: it is read in chunks with the event loop running between
        them. Records appended from this call on go to a new segment after
        the snapshot and are kept.
        """
        snap_seq = self.begin_compaction()
        started = time.perf_counter()
        try:
            tmp, size, count = write_snapshot(
                self.directory, self.shard, self.shards, snap_seq, snapshot_records,
                time.time_ns() // 1000, run=self._run_raising, chunk_records=chunk_records,
                epoch=self.epoch)
        except OSError as err:
            self._compacting = False
            raise WriteFailed(os.path.join(self.directory, segment_name(snap_seq)), err) from err
        except BaseException:
            self._compacting = False
            raise
        return self.finish_compaction(snap_seq, tmp, size, count, started)

    def begin_compaction(self) -> int:
        """Cut the log here for a snapshot: records appended so far stay
        before it, later ones go to a segment after it. The snapshot's
        sequence number, for :func:`write_snapshot` (by this process, or by a
        forked child that sees the state as of this call)."""
        if self._compacting:
            raise StoreError(f"{self.directory}: a compaction is already running")
        if self._closing or self._seg is None:
            raise StoreError(f"{self.directory}: the log is not open")
        self._compacting = True
        snap_seq, next_seq = self._next_seq, self._next_seq + 1
        self._next_seq += 2
        self._pending.append(_Rotate(next_seq))
        self._cuts += 1
        self._wake.set()
        return snap_seq

    def abort_compaction(self) -> None:
        """The snapshot was not written (its ``.tmp`` is removed at the next
        recovery); the log goes on as it was."""
        self._compacting = False

    def finish_compaction(self, snap_seq: int, tmp: str, size: int, count: int,
                          started: float) -> CompactionStats:
        """Install a written snapshot and drop the history it replaces."""
        path = os.path.join(self.directory, segment_name(snap_seq))
        try:
            self._run_raising(install_snapshot, tmp)
            self._base_seq, self._base_bytes = snap_seq, size
            obsolete = sorted(seq for seq in self._files if seq < snap_seq)
            freed = sum(self._files.pop(seq) for seq in obsolete)
            self._files[snap_seq] = size
            # The segment still being written, if older, goes when it is closed.
            self._run_raising(remove_segments, self.directory,
                              [os.path.join(self.directory, segment_name(seq)) for seq in obsolete])
        except OSError as err:
            raise WriteFailed(path, err) from err
        finally:
            self._compacting = False
        self.compactions += 1
        seconds = time.perf_counter() - started
        log.info("%s: compacted into snapshot %s (%d records, %d bytes; %d bytes of history "
                 "freed) in %.3f s", self.directory, segment_name(snap_seq), count, size, freed,
                 seconds)
        return {"snapshot": path, "records": count, "bytes": size, "freed": freed,
                "seconds": seconds}

    # --------------------------------------------------------------- counters
    def disk_bytes(self) -> int:
        """Bytes of the segments the log keeps. The segment still being
        written when a snapshot replaced it is already obsolete (it goes at
        its rotation, moments later): counting it would call for a second
        compaction at once."""
        seg = self._seg
        live = seg.size if seg is not None and seg.seq >= self._base_seq else 0
        return sum(self._files.values()) + live

    def stats(self) -> Dict[str, Any]:
        """A report (msgpack to the control socket; the shard adds its own keys)."""
        return {
            "policy": self.policy,
            "appended_records": self.appended_records,
            "written_bytes": self.written_bytes,
            "pending_bytes": self._appended - self._written,
            "in_flight_records": self._in_flight,
            "fsyncs": self.fsyncs,
            "pooled_fsyncs": self.pooled_fsyncs,
            "fsynced_records": self.fsynced_records,
            "max_records_per_fsync": self.max_records_per_fsync,
            "write_errors": self.write_errors,
            "error": str(self.error) if self.error is not None else None,
            "segments_created": self.segments_created,
            "segment": self._seg.seq if self._seg is not None else None,
            "disk_bytes": self.disk_bytes(),
            "snapshot_bytes": self._base_bytes,
            "compactions": self.compactions,
        }

    # ---------------------------------------------------------------- flusher
    def _run(self, func: Callable[..., _T], *args: Any) -> Outcome[_T]:
        """Run blocking file work in the threadpool: the event loop keeps serving."""
        pool = self._pool
        assert pool is not None   # set by start()
        return pool.apply(_catching, (func,) + args)

    def _run_raising(self, func: Callable[..., _T], *args: Any) -> _T:
        outcome = self._run(func, *args)
        if outcome[1] is not None:
            raise outcome[1]
        return outcome[0]

    def _work_left(self) -> bool:
        return bool(self._pending) or self._repair is not None or self._sync_due

    def _flush_loop(self) -> None:
        while True:
            if not self._work_left():
                if self._closing:
                    return
                self._wake.clear()
                self._wake.wait()
                continue
            if self.error is not None and not self._closing:
                delay = self._retry_at - time.monotonic()
                if delay > 0:
                    self._retry_now.clear()
                    self._retry_now.wait(delay)
                    continue
            try:
                wrote = self._step()
            except Exception as err:
                if not isinstance(err, OSError):   # a bug: still acknowledge nothing unwritten
                    log.exception("%s: unexpected error in the log writer", self.directory)
                    err = OSError(errno.EIO, f"internal error: {err!r}")
                self._fail(err)
                if self._closing:
                    self._abandon()
                    return
            else:
                if wrote and self.error is not None:
                    seg = self._seg
                    assert seg is not None   # (a segment is open from start() on, here and below)
                    log.warning("%s: writing again; the log is healthy", seg.path)
                    self.error = None

    def _step(self) -> bool:
        """One unit of file work, in order: repair, fsync, rotation, or a write;
        True when records reached the file."""
        seg = self._seg
        assert seg is not None
        if self._repair is not None:
            self._run_raising(os.ftruncate, seg.fd, self._repair)
            self._repair = None
            return False
        if self._sync_due:
            self._sync_due = False
            if seg.synced < seg.size:
                self._sync()
            return True
        head = self._pending[0]
        if type(head) is _Rotate:
            self._rotate(head.seq)
            self._pending.popleft()
            self._cuts -= 1
            return True
        if seg.size >= self.segment_bytes and not self._cuts:
            self._rotate(self._next_seq)
            self._next_seq += 1
            return True
        self._pending.popleft()   # head
        self._write(seg, head)
        return True

    def _write(self, seg: _Segment, chunk: _Chunk) -> None:
        offset = seg.size
        chunk.sealed = True
        if self.policy == "always":
            self._in_flight = chunk.records
            pooled = not self._sync_in_loop
            try:
                if pooled:
                    took, err = self._run(_pwrite_sync, seg.fd, chunk.data, offset)
                else:
                    took, err = _catching(_pwrite_sync, seg.fd, chunk.data, offset)
            finally:
                self._in_flight = 0
            self._sync_in_loop = took is not None and took < self.slow_sync
            self.pooled_fsyncs += pooled
        else:
            try:
                _pwrite_all(seg.fd, chunk.data, offset)
                err = None
            except OSError as error:
                err = error
        if err is not None:
            self._pending.appendleft(chunk)
            self._repair = offset     # nothing after the last whole record may stay
            raise err
        size = len(chunk.data)
        seg.size += size
        self._written += size
        self.written_bytes += size
        if self.policy == "always":
            assert took is not None   # written and fsynced: how long that took
            seg.synced = seg.size
            self._durable = self._written
            self._count_fsync(chunk.records)
            self.fsync_seconds.observe(took)
            self._ack(self._durable)
        else:
            if self.policy == "interval":
                seg.unsynced.append(chunk)
            self._ack(self._written)

    def _sync(self) -> None:
        """fsync the current segment; on failure write its unsynced part again."""
        seg = self._seg
        assert seg is not None
        target = seg.size
        took, err = self._run(_timed_fdatasync, seg.fd)
        if err is not None:
            if self.policy == "never":   # nothing kept to write again; the OS decides anyway
                log.warning("%s: fsync failed: %s", seg.path, err)
                return
            # The kernel may have dropped the failed pages: cut back to what an
            # fsync confirmed and write the rest again from memory.
            for chunk in reversed(seg.unsynced):
                self._pending.appendleft(chunk)
            self._written -= target - seg.synced
            seg.unsynced = []
            seg.size = seg.synced
            self._repair = seg.synced
            raise err
        seg.synced = target
        self._count_fsync(sum(chunk.records for chunk in seg.unsynced))
        assert took is not None   # fsynced: how long that took
        self.fsync_seconds.observe(took)
        seg.unsynced = []
        self._durable = self._written

    def _rotate(self, seq: int) -> None:
        """Close the current segment (fsynced) and continue in a new one, ``seq``."""
        old = self._seg
        assert old is not None
        if old.synced < old.size:
            self._sync()
        self._seg = self._run_raising(self._new_segment, seq)
        self.segments_created += 1
        os.close(old.fd)
        self._files[old.seq] = old.size
        if old.seq < self._base_seq:   # a snapshot made it obsolete while it was written
            del self._files[old.seq]
            _, err = self._run(remove_segments, self.directory, [old.path])
            if err is not None:
                log.warning("%s: cannot remove an obsolete segment: %s", old.path, err)

    def _new_segment(self, seq: int) -> _Segment:   # runs in a pool thread
        header = F.encode_header(self.shard, self.shards, seq, time.time_ns() // 1000)
        fd = create_segment(self.directory, seq, header)
        return _Segment(seq, os.path.join(self.directory, segment_name(seq)), fd, len(header))

    def _count_fsync(self, records: int) -> None:
        self.fsyncs += 1
        self.fsynced_records += records
        if records > self.max_records_per_fsync:
            self.max_records_per_fsync = records

    def _ack(self, level: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= level:
            self._call(waiters.popleft()[1], None)

    def _call(self, callback: Callback, err: Optional[StoreError]) -> None:
        try:
            callback(err)
        except Exception:
            log.exception("%s: a commit callback failed", self.directory)

    def _fail(self, err: OSError) -> None:
        """Tell every waiter; cut the file back at once if possible; retry later."""
        seg = self._seg
        assert seg is not None
        self.write_errors += 1
        failed = WriteFailed(seg.path, err)
        if self.error is None:
            log.error("%s; keeping the records in memory, retrying every %.3f s",
                      failed, self.retry)
        self.error = failed
        self._retry_at = time.monotonic() + self.retry
        if self._repair is not None:
            _, cut_err = self._run(os.ftruncate, seg.fd, self._repair)
            if cut_err is None:
                self._repair = None
        waiters, self._waiters = self._waiters, deque()
        for _, callback in waiters:
            self._call(callback, failed)

    def _abandon(self) -> None:
        """Closing while the disk fails: what is pending is lost (and was never acknowledged)."""
        lost = sum(item.records for item in self._pending if type(item) is _Chunk)
        self._pending.clear()
        self._sync_due = False
        if lost:
            log.error("%s: closing with %d records that could not be written", self.directory, lost)

    def _tick(self) -> None:
        while True:
            gevent.sleep(self.interval)
            seg = self._seg
            assert seg is not None
            if seg.synced < seg.size:
                self._sync_due = True
                self._wake.set()
