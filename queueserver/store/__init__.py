"""Durability: each shard's append-only log.

Every state change of a shard's engine is a plain event tuple; the shard
appends each one to its log and answers a request only once the records it
caused are as durable as the fsync policy promises. On start the shard
replays its log into a fresh engine.

Files
    ``DATA/shard-N/`` holds numbered segments ``00000001.log``,
    ``00000002.log``, ... Each starts with a 40-byte header: the magic bytes
    ``QSJOBLOG``, the format version (2; version 1 is still read), flags
    (bit 0: a *snapshot*), the shard index and the shard count it belongs
    to, its sequence number, its creation time (µs) and an xxh32 of all
    that. Then records, each framed as body length (u32), a check of the
    length (u32: its xxh32), a checksum of the body (u32: the low half of
    its xxh3_64, seeded with the length and the epoch), the epoch of the
    shard group's primary that wrote it (u32; 0 outside a replicated
    cluster) and the msgpack body (the event tuple). The length's own check
    lets a torn write be told from damage: a record whose verified length
    runs past the end of the file was cut short, whatever its payload
    holds. A segment is created under a ``.tmp`` name and renamed once its
    header is on disk; a new segment begins when the current one reaches
    its size limit (64 MiB by default) and at every start.

Fsync policy
    ``always`` (the default): a request is answered after its records were
    written and fsynced. Appends are grouped: while one write + fsync runs
    in a thread, the shard keeps serving, and everything appended meanwhile
    is covered by the next single write + fsync. ``interval``: answered
    after the write, fsynced every ``interval`` ms. ``never``: answered
    after the write; the OS decides. All three survive ``kill -9`` of the
    process with every answered change; only ``always`` also survives a
    power loss with every answered change.

Errors
    When a write or fsync fails (disk full, I/O error), every request
    waiting for it is answered with an error, and so is every request while
    the disk keeps failing. Nothing is acknowledged that is not on disk.
    The file is cut back to its last whole record, the records stay in
    memory in order and are written again every second until the disk
    allows; after a failed fsync everything since the last good one is
    written again from memory. An error answer therefore means "not known
    to be on disk": the change is in memory and is written once the disk
    recovers.

Recovery
    On start every segment from the newest snapshot on is read in order.
    A torn tail - the newest segment ending in an incomplete or damaged
    record with nothing valid after it, as a crash in mid-write leaves - is
    cut off with one warning naming the file and the offset, and every
    earlier record is kept. Anything else stops the shard with one line
    naming the file and offset: a damaged record followed by valid ones, a
    damaged snapshot or older segment (they were fsynced when complete), an
    unknown format version, or a file of another shard or shard count
    (start with the same ``--shards``, or move the directory away). The log
    reports how many records it replayed and how long that took.

Compaction
    Disk use follows the live jobs, not the history. When the log grows
    past max(64 MiB, 2 × the last snapshot) the shard writes a snapshot: a
    segment, marked as such, of records that rebuild the live state. It is
    written under a ``.tmp`` name in chunks (the shard keeps serving),
    fsynced, renamed into place, the directory fsynced, and only then are
    the older segments removed. Changes made while it is written go to the
    segment after it. A crash at any step recovers: before the rename, from
    the full history (the ``.tmp`` is removed); after it, from the snapshot
    and what follows (older segments are removed).

API (for the shard)::

    rec = recover(shard_dir(data_dir, index), index, shards)
    engine.replay(rec)                      # rec.records, rec.seconds after
    wal = AppendLog(rec, policy="always").start()
    engine.journal = wal.append             # each event, as it happens
    wal.commit(lambda err: reply(err))      # after a request's events
    if wal.needs_compaction():              # from a greenlet of its own
        wal.compact(snapshot_records)       # state as of this call, unchanging
    wal.close()
"""
from .compaction import should_compact
from .errors import CorruptLog, StoreError, UnknownVersion, WriteFailed, WrongShard
from .segments import Recovery, recover, shard_dir
from .writer import POLICIES, AppendLog

__all__ = [
    "AppendLog", "CorruptLog", "POLICIES", "Recovery", "StoreError", "UnknownVersion",
    "WriteFailed", "WrongShard", "recover", "shard_dir", "should_compact",
]
