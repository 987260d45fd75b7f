"""Job numbers (goqueue's ids) for a server of several shards: handed out in
blocks from one counter, so the first job of a fresh server is 1 whichever
shard holds it, and the small table of blocks says which shard made a number.

The original goqueue hands out ids from one counter and ``DELETE <id>``
names no queue. Shards here make jobs at once, without asking anyone, so
each takes a *block* of numbers when it needs one and numbers its jobs from
it. The blocks live in one file (the data directory's, or for a server that
keeps jobs in memory only, the runtime directory's), appended under an
exclusive ``flock``:

* numbers are unique server-wide (every block begins after every block
  before it) and increase within a queue (a queue lives on one shard, whose
  blocks only go up); a restarted shard takes a fresh block, so no number
  is ever made twice;
* a block is on disk (fsynced, with a durable server) before any number of
  it is used: a crash never hands a number out again;
* ``DELETE <number>`` goes straight to the shard whose block holds it.
  Numbers at or below the file's *floor* were made before blocks existed
  (an older data directory, or a change of the shard count): those are
  asked of every shard.

A data directory written before blocks has no numbers file: it gets one
that asks each shard for the highest number in its log as it recovers, and
no block is handed out until every shard has said (a job number made twice
would delete the wrong job).

Blocks grow while one shard keeps taking them (from 64 numbers up to
:data:`MAX_BLOCK`), so a busy shard adds a record a few times a minute
and the table stays small. Each record is 24 bytes with a checksum; a
record torn by a crash is cut off by the next writer.
"""
from __future__ import annotations

import bisect
import fcntl
import os
import struct
import zlib
from typing import List, Optional, Set, Tuple

FILE_NAME = "numbers"
MIN_BLOCK = 64
MAX_BLOCK = 1 << 20
#: a record's shard field, for records that are not blocks
FLOOR = 0xFFFF          # numbers up to ``end`` are older than blocks (``start``: 1 + the shard that said so)
UPGRADE = 0xFFFE        # an older data directory: its ``end`` shards must each say their floor first
_RECORD = struct.Struct("<2sBxQQHH")   # magic, version, start, end (exclusive), shard, crc
_MAGIC = b"QN"
_VERSION = 1


class NumbersError(Exception):
    """The numbers file cannot be used (one line saying why)."""


def _record(start: int, end: int, shard: int) -> bytes:
    body = _RECORD.pack(_MAGIC, _VERSION, start, end, shard, 0)[:-2]
    return body + struct.pack("<H", zlib.crc32(body) & 0xFFFF)


def _parse(data: bytes) -> Tuple[List[Tuple[int, int, int]], int]:
    """The whole, intact records of ``data`` and how many bytes they take."""
    records = []
    size = _RECORD.size
    good = 0
    for offset in range(0, len(data) - size + 1, size):
        chunk = data[offset:offset + size]
        magic, version, start, end, shard, crc = _RECORD.unpack(chunk)
        if magic != _MAGIC or version != _VERSION or zlib.crc32(chunk[:-2]) & 0xFFFF != crc:
            break
        records.append((start, end, shard))
        good = offset + size
    return records, good


class BlockTable:
    """Which shard made each number: the blocks of the file, in order."""

    def __init__(self, records: List[Tuple[int, int, int]]) -> None:
        self.floor = 0
        self.upgrading = 0                 # shards that must say their floor (an older directory)
        self.said: Set[int] = set()        # the shards that did
        self._starts: List[int] = []
        self._ends: List[int] = []
        self._shards: List[int] = []
        for start, end, shard in records:
            if shard == FLOOR:
                self.floor = max(self.floor, end)
                if start:
                    self.said.add(start - 1)
                continue
            if shard == UPGRADE:
                self.upgrading = max(self.upgrading, end)
                continue
            self._starts.append(start)
            self._ends.append(end)
            self._shards.append(shard)
        self.top = max(self._ends, default=0)   # the first number no block holds yet

    def waiting_for(self) -> List[int]:
        """The shards an upgrade still waits for (empty: blocks may be handed out)."""
        return [shard for shard in range(self.upgrading) if shard not in self.said]

    def owner(self, number: int) -> Optional[int]:
        """The shard whose block holds ``number``; None if no block does."""
        i = bisect.bisect_right(self._starts, number) - 1
        if i >= 0 and number < self._ends[i]:
            return self._shards[i]
        return None

    def __len__(self) -> int:
        return len(self._starts)


class NumberFile:
    """The file of blocks, shared by a server's shards (which take blocks)
    and routers (which read where numbers are)."""

    def __init__(self, path: str, durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        self._table: Optional[BlockTable] = None
        self._size = -1

    # ------------------------------------------------------------- reading
    def table(self, refresh: bool = False) -> BlockTable:
        """The blocks as last read; ``refresh`` reads them again if the file grew."""
        if self._table is None or refresh:
            try:
                size = os.stat(self.path).st_size
            except FileNotFoundError:
                size = 0
            if self._table is None or size != self._size:
                self._table = BlockTable(self._read()[0])
                self._size = size
        return self._table

    def owner(self, number: int) -> Optional[int]:
        """The shard that made ``number`` (the file is read again for a
        number above every block known); None if no block holds it."""
        table = self.table()
        if number >= table.top:
            table = self.table(refresh=True)
        return table.owner(number)

    def is_old(self, number: int) -> bool:
        """Whether ``number`` was made before blocks (ask every shard for it)."""
        return number <= self.table().floor

    def _read(self) -> Tuple[List[Tuple[int, int, int]], int]:
        try:
            with open(self.path, "rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH)
                return _parse(f.read())
        except FileNotFoundError:
            return [], 0

    # ------------------------------------------------------------- writing
    def allocate(self, shard: int, size: int, above: int = 0) -> Tuple[int, int]:
        """A new block of ``size`` numbers for ``shard``, above every block
        and the floor (and above ``above``): ``(start, end)``, end exclusive."""
        with self._locked() as (fd, records):
            table = BlockTable(records)
            waiting = table.waiting_for()
            if waiting:
                raise NumbersError(f"job numbers wait for shards {', '.join(map(str, waiting))} to "
                                   f"recover (the data directory is being upgraded); try again")
            start = max(table.top, table.floor + 1, above + 1, 1)
            self._append(fd, _record(start, start + size, shard))
        return start, start + size

    def raise_floor(self, number: int, shard: Optional[int] = None) -> None:
        """Numbers up to ``number`` were made before blocks: ask every shard
        for them. ``shard``: the shard that says so, as an upgrade asks."""
        with self._locked() as (fd, records):
            table = BlockTable(records)
            if number > table.floor or (shard is not None and shard not in table.said):
                self._append(fd, _record(0 if shard is None else shard + 1, max(number, table.floor), FLOOR))

    def upgrading(self) -> bool:
        """Whether this shard must say its floor (an older data directory)."""
        return bool(self.table(refresh=True).waiting_for())

    def start_upgrade(self, shards: int) -> None:
        """An older data directory: each of its ``shards`` says its highest number first."""
        with self._locked() as (fd, records):
            if not records:
                self._append(fd, _record(0, shards, UPGRADE))

    def _append(self, fd: int, record: bytes) -> None:
        os.write(fd, record)
        if self.durable:
            os.fsync(fd)
        self._table = None   # read again when next asked

    def _locked(self) -> "_Locked":
        return _Locked(self.path, self.durable)


class _Locked:
    """The file opened and locked for a writer, a torn tail cut off."""

    def __init__(self, path: str, durable: bool) -> None:
        self.path = path
        self.durable = durable
        self.fd = -1

    def __enter__(self) -> Tuple[int, List[Tuple[int, int, int]]]:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise NumbersError(f"cannot open {self.path}: {(err.strerror or str(err)).lower()}") from None
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        data = b""
        while True:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                break
            data += chunk
        records, good = _parse(data)
        if good < len(data):   # a record torn by a crash: it was never used
            os.ftruncate(self.fd, good)
            if self.durable:
                os.fsync(self.fd)
        return self.fd, records

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)   # the lock goes with it


class Blocks:
    """One shard's supply of numbers: the block it numbers jobs from, and
    the next block, sized by how fast the last one went."""

    def __init__(self, numbers: NumberFile, shard: int) -> None:
        self.numbers = numbers
        self.shard = shard
        self.size = MIN_BLOCK

    def take(self, above: int) -> Tuple[int, int]:
        """A fresh block above ``above`` (the shard's highest number so far)."""
        start, end = self.numbers.allocate(self.shard, self.size, above)
        self.size = min(self.size * 2, MAX_BLOCK)
        return start, end
