"""The bytes of a segment: a versioned header, then framed records. Pure: no I/O.

Header (40 bytes, little-endian)::

    magic "QSJOBLOG" | version u16 | flags u16 | shard u32 | shards u32 |
    seq u64 | created µs u64 | xxh32 of the 36 bytes before it

Record frame (16 bytes, then the body)::

    body length u32 | xxh32 of the length u32 | checksum u32 | epoch u32 | msgpack body

The checksum is the low 32 bits of xxh3_64(body, seed=length + epoch << 32).
The epoch is the shard group's (see :mod:`queueserver.cluster.groups`) under
which the record was written: 0 outside a replicated cluster, else the
epoch of the primary that logged it (a follower's copy keeps the epoch of
the stream it came in). A log thus says which primary wrote each record,
and a process knows from its own log the newest epoch it has seen, so a
restarted follower refuses the stream of a primary deposed before it
(fencing), and a group record lost with etcd starts again past it.
Version 1 segments (12-byte frames, no epoch: epoch 0) are still read. The length
has a check of its own so that a verified length can be trusted: a record
whose verified length runs past the end of the file is a torn write, and
nothing inside it (a payload may hold any bytes, even frames) is mistaken
for records that follow. Only a damaged length makes the scanner search
byte by byte for valid records after it. Zero-filled space (a file extended
but not written before a crash) fails the length check and reads as
garbage, not as records.

:class:`Scan` walks a buffer and says exactly where and why it stopped: the
end, a torn tail (an incomplete or damaged last record with nothing valid
after it), corruption (a damaged record followed by valid data), an unknown
version, or another shard's file.
"""
from __future__ import annotations

import mmap
import struct
from typing import Any, Dict, Final, Generator, NamedTuple, Optional, Sequence, Tuple, Union

import msgpack
import xxhash

MAGIC: Final = b"QSJOBLOG"
VERSION: Final = 2                        # what is written
READABLE: Final = (1, 2)                  # what is read: version 1 frames have no epoch
FLAG_BASE: Final = 1                      # a snapshot: replay starts at the newest one

_HEAD: Final = struct.Struct("<8sHHIIQQ")  # magic, version, flags, shard, shards, seq, created
_HEAD_SUM: Final = struct.Struct("<I")
HEADER_SIZE: Final = _HEAD.size + _HEAD_SUM.size
_VERSION_END: Final = 10                  # bytes needed to read the version

FRAME: Final = struct.Struct("<IIII")     # body length, length check, body checksum, epoch
FRAME_SIZE: Final = FRAME.size
FRAME_V1: Final = struct.Struct("<III")   # version 1: no epoch
MAX_EPOCH: Final = 0xFFFFFFFF
MAX_RECORD: Final = 256 * 1024 * 1024     # a sane bound for a length field

# Why a scan stopped.
END = "end"                # every byte was a valid record
TORN = "torn"              # the tail is incomplete or damaged, nothing valid follows
CORRUPT = "corrupt"        # a damaged record with valid records after it
VERSION_UNKNOWN = "version"
OTHER_SHARD = "shard"
NOT_A_LOG = "header"       # no magic, or a damaged header

#: What a segment is read from: a file's bytes, or its map (recovery scans an mmap).
Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]

_packer: Final = msgpack.Packer(use_bin_type=True)


class Header(NamedTuple):
    version: int
    base: bool           # a snapshot segment
    shard: int
    shards: int
    seq: int
    created_us: int


class Stop(NamedTuple):
    """Where valid data ends (``offset``), why (``kind``, ``detail``), and for
    corruption where valid records resume."""

    kind: str
    offset: int
    detail: str
    resume: Optional[int] = None


def encode_header(shard: int, shards: int, seq: int, created_us: int, base: bool = False) -> bytes:
    head = _HEAD.pack(MAGIC, VERSION, FLAG_BASE if base else 0, shard, shards, seq, created_us)
    return head + _HEAD_SUM.pack(xxhash.xxh32_intdigest(head))


def checksum(body: Buffer, length: int, epoch: int = 0) -> int:
    return xxhash.xxh3_64_intdigest(body, seed=length + (epoch << 32)) & 0xFFFFFFFF


#: length -> its check: records of a kind have a handful of lengths, and the
#: check is a hash call per record written and read otherwise
_LENGTH_CHECKS: Final[Dict[int, int]] = {}


def length_check(length: int) -> int:
    check = _LENGTH_CHECKS.get(length)
    if check is None:
        if len(_LENGTH_CHECKS) >= 65536:   # many distinct lengths: start over rather than grow
            _LENGTH_CHECKS.clear()
        check = xxhash.xxh32_intdigest(length.to_bytes(4, "little"), seed=0x51534C47)
        _LENGTH_CHECKS[length] = check
    return check


def encode_record(record: Sequence[Any], epoch: int = 0) -> bytes:
    """One frame: length, checksum, epoch, msgpack body (bytes stay bytes, str stays str)."""
    body: bytes = _packer.pack(record)
    length = len(body)
    if length > MAX_RECORD:
        raise ValueError(f"record of {length} bytes exceeds the log's limit of {MAX_RECORD}")
    return FRAME.pack(length, length_check(length), checksum(body, length, epoch), epoch) + body


def decode_body(body: Buffer) -> Any:
    """Records come back as tuples (msgpack arrays, nested ones too); what a
    log holds is whatever was written to it (Any: checked by its reader)."""
    return msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=False)


def read_header(buf: Buffer) -> Tuple[Optional[Header], Optional[Stop]]:
    """The header at the start of ``buf``, or why there is none."""
    size = len(buf)
    head = bytes(buf[:HEADER_SIZE])
    if size < len(MAGIC):
        if MAGIC.startswith(head):
            return None, Stop(TORN, 0, f"file of {size} bytes is shorter than its header")
        return None, Stop(NOT_A_LOG, 0, "not a queueserver log (no magic bytes)")
    if head[:len(MAGIC)] != MAGIC:
        return None, Stop(NOT_A_LOG, 0, "not a queueserver log (no magic bytes)")
    if size < _VERSION_END:
        return None, Stop(TORN, 0, f"file of {size} bytes is shorter than its header")
    version = int.from_bytes(head[8:10], "little")
    if version not in READABLE:
        return None, Stop(VERSION_UNKNOWN, 0,
                          f"log format version {version}, but this build reads versions "
                          f"{', '.join(map(str, READABLE))} only")
    if size < HEADER_SIZE:
        return None, Stop(TORN, 0, f"file of {size} bytes is shorter than its header")
    (expected,) = _HEAD_SUM.unpack_from(head, _HEAD.size)
    if xxhash.xxh32_intdigest(head[:_HEAD.size]) != expected:
        return None, Stop(NOT_A_LOG, 0, "damaged header (checksum mismatch)")
    _, version, flags, shard, shards, seq, created = _HEAD.unpack_from(head)
    return Header(version, bool(flags & FLAG_BASE), shard, shards, seq, created), None


def check_owner(header: Header, shard: int, shards: int) -> Optional[Stop]:
    """A file of another shard, or of a server with another shard count, is refused:
    jobs are placed by hashing over the shard count, so mixing would misplace them."""
    if header.shard == shard and header.shards == shards:
        return None
    return Stop(OTHER_SHARD, 0, f"belongs to shard {header.shard} of {header.shards}, "
                                f"but this is shard {shard} of {shards}")


class Layout(NamedTuple):
    """How a segment's frames are laid out (by its header's version)."""
    frame: struct.Struct
    epochs: bool       # the frame's fourth field is the epoch


LAYOUTS: Final = {1: Layout(FRAME_V1, False), 2: Layout(FRAME, True)}


def frame_at(buf: memoryview, pos: int, layout: Layout = LAYOUTS[VERSION]) -> Tuple[int, Any, str, int, int]:
    """Decode the frame at ``pos``: ``(end, record, "", end, epoch)`` or, when
    it is not valid, ``(-1, None, why, where it ends: -1 if its length is damaged, 0)``."""
    size = len(buf)
    frame = layout.frame
    if size - pos < frame.size:
        return -1, None, f"incomplete record frame ({size - pos} of {frame.size} bytes)", -1, 0
    if layout.epochs:
        length, check, expected, epoch = frame.unpack_from(buf, pos)
    else:
        (length, check, expected), epoch = frame.unpack_from(buf, pos), 0
    if check != length_check(length):
        return -1, None, "damaged record length", -1, 0
    if length == 0 or length > MAX_RECORD:
        return -1, None, f"impossible record length {length}", -1, 0
    end = pos + frame.size + length
    if end > size:
        return -1, None, f"incomplete record ({size - pos} of {frame.size + length} bytes)", end, 0
    body = buf[pos + frame.size:end]
    try:
        if checksum(body, length, epoch) != expected:
            return -1, None, "checksum mismatch", end, 0
        try:
            record = decode_body(body)
        except Exception as err:  # msgpack raises several kinds for bad input
            return -1, None, f"undecodable record ({type(err).__name__})", end, 0
    finally:
        body.release()
    return end, record, "", end, epoch


def next_valid(buf: memoryview, start: int, layout: Layout = LAYOUTS[VERSION]) -> Optional[int]:
    """The first offset from ``start`` on where a valid record starts, if any.

    This tells a torn tail (nothing valid after the damage: the last write
    was cut short) from corruption (valid records follow, so acknowledged
    data would be lost by cutting there).
    """
    size = len(buf)
    unpack = FRAME_V1.unpack_from   # the length and its check lead every layout's frame
    frame_size = layout.frame.size
    for p in range(start, size - frame_size):
        length, check, _ = unpack(buf, p)
        if 0 < length <= size - p - frame_size and check == length_check(length) \
                and frame_at(buf, p, layout)[0] > 0:
            return p
    return None


class Scan:
    """The records of one segment's bytes, then :attr:`stop` says why it ended.

    Iterating yields ``(offset, record)``; :attr:`header` is known once the
    first record (or the stop) comes. ``end`` is the offset just past the
    last valid record: where a torn tail would be cut.
    """

    def __init__(self, buf: Buffer, shard: int, shards: int) -> None:
        self._buf = buf
        self.shard = shard
        self.shards = shards
        self.header: Optional[Header] = None
        self.stop: Optional[Stop] = None
        self.end = 0
        self.records = 0
        self.epoch = 0        # the epoch of the record just yielded
        self.max_epoch = 0    # the highest epoch of the records yielded so far

    def __iter__(self) -> Generator[Tuple[int, Any], None, None]:
        buf = memoryview(self._buf)
        try:
            self.header, self.stop = read_header(buf)
            if self.header is not None:
                self.stop = check_owner(self.header, self.shard, self.shards)
            if self.stop is not None:
                return
            assert self.header is not None   # read_header gives a header or a stop
            layout = LAYOUTS[self.header.version]
            pos = self.end = HEADER_SIZE
            size = len(buf)
            while pos < size:
                end, record, why, span, epoch = frame_at(buf, pos, layout)
                if end < 0:
                    if span > size:     # a verified length past the end: a cut write
                        resume = None
                    else:               # after the bad record, or anywhere if its length is bad
                        resume = next_valid(buf, span if span > 0 else pos + 1, layout)
                    kind = TORN if resume is None else CORRUPT
                    self.stop = Stop(kind, pos, why, resume)
                    return
                self.records += 1
                self.epoch = epoch
                if epoch > self.max_epoch:
                    self.max_epoch = epoch
                yield pos, record
                pos = self.end = end
            self.stop = Stop(END, pos, "end of file")
        finally:
            buf.release()
