"""Which shard holds which job, for commands that name only a job id.

Queues live on the shard their name hashes to, but ``complete``, ``delete``
or ``result`` name just a job. The router notes the shard of every job it
creates, shards report each job that leaves them, and a (re)connecting shard
lists all it holds, so the directory stays exact.

To cost little per queued job (about 6 bytes at a million jobs, where a
dict of int to int cost about 90), no Python object is kept per job: an id
is reduced to its 64-bit xxhash, whose top bits pick one of :data:`BUCKETS`
buckets. A bucket is one ``bytes`` of 5-byte entries, each the hash's low
32 bits followed by the shard, found with ``bytes.find`` (in C) and
replaced whole on a change (a bucket holds ~60 entries at a million jobs).
Two live ids that share those 46 bits (or one id that really is on two
shards) are marked :data:`SHARED`; commands for them ask every shard. Such
twins are rare: at a million live ids, one id in about 70 million has one.
A twin costs speed (the id whose entry left with its twin's is unknown, so
asked of every shard), or, for an id a shard made an instant before the
directory heard of it, a lookup sent to the twin's shard only.

Job numbers (goqueue's ids) are not kept here: the shards take them in
blocks, and the block table says which shard made a number
(:mod:`queueserver.jobnumbers`).
"""
from __future__ import annotations

from typing import Final, Iterable, List, Optional, Sequence, Set

import xxhash

SHARED: Final = -1

_hash: Final = xxhash.xxh64_intdigest

_BUCKET_BITS: Final = 14
BUCKETS: Final = 1 << _BUCKET_BITS
_BUCKET_SHIFT: Final = 64 - _BUCKET_BITS
_PREFIX_MASK: Final = 0xFFFF_FFFF  # an entry's first 4 bytes: the hash's low 32 bits, below the bucket's
_SLOT_MASK: Final = 16383          # the hash's low 14 bits: the id's cluster slot (placement.slot_of)
_ENTRY: Final = 5
_SHARED_CODE: Final = 0xFF         # an entry's last byte: its shard, or this
_CODES: Final = [bytes((code,)) for code in range(256)]


def _find(bucket: bytes, prefix: bytes) -> int:
    """Offset of the entry starting with ``prefix`` (4 bytes), or -1."""
    i = bucket.find(prefix)
    return i if i <= 0 or not i % _ENTRY else _aligned(bucket, prefix, i)


def _aligned(bucket: bytes, prefix: bytes, i: int) -> int:
    """A match at ``i`` spans two entries (rare): the next one that does not."""
    while i % _ENTRY and i >= 0:
        i = bucket.find(prefix, i + 1)
    return i


class JobDirectory:
    """Where each job id lives. (Job numbers are found by their block:
    :mod:`queueserver.jobnumbers`.)"""

    __slots__ = ("_buckets", "_count")

    def __init__(self) -> None:
        self._buckets: List[bytes] = [b""] * BUCKETS   # 128 KiB while empty
        self._count = 0

    def shard_of(self, id: str) -> Optional[int]:
        """The shard holding ``id``, :data:`SHARED`, or ``None`` when no shard has it."""
        h = _hash(id.encode())
        bucket = self._buckets[h >> _BUCKET_SHIFT]
        if bucket:
            prefix = (h & _PREFIX_MASK).to_bytes(4, "little")
            i = bucket.find(prefix)       # _find, inlined: this is every complete's path
            if i > 0 and i % _ENTRY:
                i = _aligned(bucket, prefix, i)
            if i >= 0:
                code = bucket[i + 4]
                return SHARED if code == _SHARED_CODE else code
        return None

    def place(self, id: str, shard: int) -> bool:
        """Record ``id`` on ``shard``; False if the entry was there already."""
        if not 0 <= shard < _SHARED_CODE:
            raise ValueError(f"shard {shard} out of range")
        h = _hash(id.encode())
        b = h >> _BUCKET_SHIFT
        bucket = self._buckets[b]
        prefix = (h & _PREFIX_MASK).to_bytes(4, "little")
        i = bucket.find(prefix)           # _find, inlined: this is every add's path
        if i > 0 and i % _ENTRY:
            i = _aligned(bucket, prefix, i)
        if i < 0:
            self._buckets[b] = b"".join((bucket, prefix, _CODES[shard]))
            self._count += 1
            return True
        if bucket[i + 4] != shard:   # on two shards: ask every shard
            self._buckets[b] = b"".join((bucket[:i + 4], _CODES[_SHARED_CODE], bucket[i + _ENTRY:]))
        return False

    def forget(self, id: str, shard: int) -> None:
        h = _hash(id.encode())
        b = h >> _BUCKET_SHIFT
        bucket = self._buckets[b]
        if bucket:
            i = _find(bucket, (h & _PREFIX_MASK).to_bytes(4, "little"))
            if i >= 0 and bucket[i + 4] == shard:
                self._buckets[b] = bucket[:i] + bucket[i + _ENTRY:]
                self._count -= 1

    def forget_all(self, ids: Iterable[str], shard: int) -> None:
        forget = self.forget
        for id in ids:
            forget(id, shard)

    def forget_shard(self, shard: int) -> None:
        """A shard restarted empty: none of its jobs exist any more."""
        buckets = self._buckets
        for b, bucket in enumerate(buckets):
            if bucket:
                kept = b"".join(bucket[i:i + _ENTRY] for i in range(0, len(bucket), _ENTRY)
                                if bucket[i + 4] != shard)
                self._count -= (len(bucket) - len(kept)) // _ENTRY
                buckets[b] = kept

    def learn(self, shard: int, ids: Iterable[str]) -> None:
        for id in ids:
            self.place(id, shard)

    def set(self, id: str, shard: int) -> None:
        """``id`` is on ``shard`` now, whatever was known before."""
        known = self.shard_of(id)
        if known == shard:
            return
        if known is not None:
            self._drop(id)
        self.place(id, shard)

    def _drop(self, id: str) -> None:
        h = _hash(id.encode())
        b = h >> _BUCKET_SHIFT
        bucket = self._buckets[b]
        i = _find(bucket, (h & _PREFIX_MASK).to_bytes(4, "little"))
        if i >= 0:
            self._buckets[b] = bucket[:i] + bucket[i + _ENTRY:]
            self._count -= 1

    def export(self, slots: Set[int], drop: bool = False) -> List[List[int]]:
        """``[bucket, low 32 bits of the hash, shard code]`` of every entry
        whose id's slot (the hash's low 14 bits) is in ``slots`` (the entries
        of slots moving to another shard); ``drop``: and forget them here."""
        out: List[List[int]] = []
        buckets = self._buckets
        for b, bucket in enumerate(buckets):
            if not bucket:
                continue
            kept = []
            for i in range(0, len(bucket), _ENTRY):
                prefix = int.from_bytes(bucket[i:i + 4], "little")
                if prefix & _SLOT_MASK in slots:
                    out.append([b, prefix, bucket[i + 4]])
                elif drop:
                    kept.append(bucket[i:i + _ENTRY])
            if drop and len(kept) * _ENTRY != len(bucket):
                self._count -= (len(bucket) - len(kept) * _ENTRY) // _ENTRY
                buckets[b] = b"".join(kept)
        return out

    def import_(self, entries: Iterable[Sequence[int]]) -> None:
        """Take entries :meth:`export` gave (an entry already here stays)."""
        buckets = self._buckets
        for b, prefix, code in entries:
            raw = int(prefix).to_bytes(4, "little")
            bucket = buckets[b]
            if _find(bucket, raw) < 0:
                buckets[b] = bucket + raw + _CODES[code]
                self._count += 1

    def __len__(self) -> int:
        return self._count
