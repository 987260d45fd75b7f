"""Segment files on disk, and recovery: the records of a shard's directory, in order.

A shard's directory (``DATA/shard-N/``) holds numbered segments
``00000001.log``, ``00000002.log``, ... Replay starts at the newest
snapshot (a segment whose header has the base flag) and reads every later
segment in order; older ones are obsolete and removed. Files are created
under a ``.tmp`` name, fsynced and renamed, so a ``.log`` name always has a
whole header; a leftover ``.tmp`` is an unfinished creation and removed.
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import format as F
from .errors import CorruptLog, StoreError, UnknownVersion, WrongShard

log = logging.getLogger("queueserver.store")

SEGMENT_RE = re.compile(r"^(\d{8,})\.log$")
TMP_SUFFIX = ".tmp"


def shard_dir(data_dir: str, shard: int) -> str:
    return os.path.join(data_dir, f"shard-{shard}")


def segment_name(seq: int) -> str:
    return f"{seq:08d}.log"


def list_segments(directory: str) -> List[Tuple[int, str]]:
    """``(seq, path)`` of every segment, oldest first."""
    found = []
    for name in os.listdir(directory):
        match = SEGMENT_RE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    found.sort()
    return found


def fsync_dir(directory: str) -> None:
    """Make creations, renames and removals in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may be short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def make_dirs(directory: str) -> None:
    """Create ``directory`` and its missing parents, durably (each new entry's
    parent fsynced), so a power loss cannot take a fresh shard directory away."""
    directory = os.path.abspath(directory)
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        os.makedirs(path, exist_ok=True)
        fsync_dir(os.path.dirname(path))


def create_segment(directory: str, seq: int, header: bytes) -> int:
    """Create segment ``seq`` holding ``header``, durably; an fd open for writing.

    Written under a temporary name, fsynced, renamed, then the directory
    fsynced: a crash leaves either no segment or a whole header.
    """
    path = os.path.join(directory, segment_name(seq))
    tmp = path + TMP_SUFFIX
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, header)
        os.fsync(fd)
        os.rename(tmp, path)
        fsync_dir(directory)
    except BaseException:
        abandon(fd, tmp)
        raise
    return fd


def abandon(fd: int, tmp: str) -> None:
    """Close and remove a temporary file that could not be finished."""
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass


def remove_segments(directory: str, paths: List[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if paths:
        fsync_dir(directory)


def _refuse(path: str, stop: F.Stop) -> StoreError:
    """The one-line error for a stop that must keep the shard from starting."""
    if stop.kind == F.VERSION_UNKNOWN:
        return UnknownVersion(f"{path}: {stop.detail}; refusing to start "
                              f"(run a queueserver that reads it, or move the directory away)")
    if stop.kind == F.OTHER_SHARD:
        return WrongShard(f"{path}: {stop.detail}; refusing to start (a data directory serves "
                          f"one shard layout: start with the same --shards, or move it away)")
    if stop.kind == F.CORRUPT:
        return CorruptLog(f"{path}: corrupt record at byte {stop.offset} ({stop.detail}) with valid "
                          f"records from byte {stop.resume} on; refusing to start (to give up "
                          f"everything from there, cut the file to {stop.offset} bytes and remove "
                          f"later segments)")
    return CorruptLog(f"{path}: {stop.detail} at byte {stop.offset}; refusing to start")


class Recovery:
    """The records of a shard's directory, read once, oldest first.

    Iterating replays: it yields each record (a tuple), cuts a torn tail of
    the newest segment (one warning naming the file and offset), and raises
    a :class:`StoreError` for anything else that is wrong. Afterwards
    :attr:`records`, :attr:`seconds` (the whole replay, the caller's work
    included) and :attr:`files` describe what was read, and
    :class:`~queueserver.store.writer.AppendLog` can continue the log.
    """

    def __init__(self, directory: str, shard: int, shards: int) -> None:
        self.directory = directory
        self.shard = shard
        self.shards = shards
        self.records = 0
        self.seconds = 0.0
        self.bytes = 0
        self.truncated: Optional[str] = None      # the torn-tail warning, if any
        self.max_epoch = 0   # the highest epoch a record was written under (see .format)
        #: seq -> (size, is snapshot) of every segment kept, after recovery
        self.files: Dict[int, Tuple[int, bool]] = {}
        self.max_seq = 0
        self.base_seq = 0                          # the snapshot replay started at (0: none)
        self.done = False
        self._started = False

    def __iter__(self) -> Iterator[Any]:
        if self._started:
            raise StoreError(f"{self.directory}: a recovery is read once")
        self._started = True
        started = time.perf_counter()
        make_dirs(self.directory)
        self._remove_leftovers()
        segments = self._headers(list_segments(self.directory))
        for index, (seq, path, header) in enumerate(segments):
            yield from self._replay(seq, path, header, index == len(segments) - 1)
        self.seconds = time.perf_counter() - started
        self.done = True
        log.info("shard %d: replayed %d records (%d bytes, %d segments) from %s in %.3f s",
                 self.shard, self.records, self.bytes, len(self.files), self.directory,
                 self.seconds)

    # --------------------------------------------------------------- helpers
    def _remove_leftovers(self) -> None:
        leftovers = [os.path.join(self.directory, name) for name in os.listdir(self.directory)
                     if name.endswith(TMP_SUFFIX) and SEGMENT_RE.match(name[:-len(TMP_SUFFIX)])]
        for path in leftovers:
            log.info("%s: removing an unfinished segment or snapshot", path)
        remove_segments(self.directory, leftovers)

    def _headers(self, segments: List[Tuple[int, str]]) -> List[Tuple[int, str, F.Header]]:
        """Check every header first, and drop what the newest snapshot made obsolete
        (a torn header, only the newest segment's, is removed)."""
        checked: List[Tuple[int, str, F.Header]] = []
        for index, (seq, path) in enumerate(segments):
            with open(path, "rb") as f:
                head = f.read(F.HEADER_SIZE)
            header, stop = F.read_header(head)
            if header is not None:
                stop = F.check_owner(header, self.shard, self.shards)
                if stop is None and header.seq != seq:
                    raise CorruptLog(f"{path}: its header says segment {header.seq}; "
                                     f"refusing to start (a renamed or copied file?)")
            if stop is not None:
                if stop.kind == F.TORN and index == len(segments) - 1:
                    log.warning("%s: %s (created when the server stopped); removing it",
                                path, stop.detail)
                    remove_segments(self.directory, [path])
                    continue
                raise _refuse(path, stop)
            assert header is not None   # read_header gives a header or a stop
            checked.append((seq, path, header))
        if checked:
            self.max_seq = checked[-1][0]
        bases = [i for i, (_, _, header) in enumerate(checked) if header.base]
        if bases:
            first = bases[-1]
            obsolete = [path for _, path, _ in checked[:first]]
            if obsolete:
                log.info("%s: removing %d segments older than snapshot %s", self.directory,
                         len(obsolete), segment_name(checked[first][0]))
                remove_segments(self.directory, obsolete)
            checked = checked[first:]
            self.base_seq = checked[0][0]
        return checked

    def _replay(self, seq: int, path: str, header: F.Header, last: bool) -> Iterator[Any]:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as data:
                scan = F.Scan(data, self.shard, self.shards)
                records = iter(scan)
                try:
                    for _, record in records:
                        self.records += 1
                        yield record
                finally:
                    records.close()  # releases its view of the map before the map closes
                    self.max_epoch = max(self.max_epoch, scan.max_epoch)
        stop = scan.stop
        assert stop is not None   # set when the scan ends
        if stop.kind == F.END:
            self.files[seq] = (size, header.base)
            self.bytes += size
            return
        if stop.kind != F.TORN:
            raise _refuse(path, stop)
        if not last or header.base:
            what = "a snapshot" if header.base else "a segment with later segments after it"
            raise CorruptLog(f"{path}: {stop.detail} at byte {stop.offset} in {what}, which "
                             f"was complete when written; refusing to start")
        self.truncated = (f"{path}: torn tail at byte {stop.offset} ({stop.detail}, "
                          f"{size - stop.offset} bytes cut); the {scan.records} records "
                          f"before it are kept")
        log.warning("%s", self.truncated)
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, stop.offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.files[seq] = (stop.offset, header.base)
        self.bytes += stop.offset


def newest_epoch(directory: str, shard: int, shards: int) -> int:
    """The epoch of the newest record in ``directory``'s log (0: none), read
    from its newest segment that holds a valid record, without a replay: a
    log's epochs never decrease."""
    for _, path in reversed(list_segments(directory) if os.path.isdir(directory) else []):
        with open(path, "rb") as f:
            scan = F.Scan(f.read(), shard, shards)
        for _ in scan:
            pass
        if scan.records:
            return scan.max_epoch
    return 0


def recover(directory: str, shard: int, shards: int) -> Recovery:
    """The records of ``directory`` (a shard's), to iterate once: see :class:`Recovery`."""
    return Recovery(directory, shard, shards)
