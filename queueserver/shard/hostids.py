"""The id of every job on this host, in memory all its shards share.

Why: a job id must be unique server-wide, and any shard must find a job by
its id. Between hosts that takes messages (an id's *home* shard keeps it:
:mod:`.idhome`); between the shards of one host, a framed message per add
(the claim) and per finished job (the forget) made each shard's cost per
job grow with the number of shards: every message wakes another process.
Shards of one host share memory instead: a claim is a lookup and a write
under a lock, with no message and no other process woken.

The table lives in one memory file (``memfd``) that the supervisor makes
and hands to every shard it starts, and keeps open, so it outlives a shard
that restarts. It is a hash table keyed by an id's 64-bit xxhash (the
router's :class:`~queueserver.links.directory.JobDirectory` key), cut into
:data:`STRIPES` stripes by the key's top bits. Each stripe is its own open
addressing table (linear probing) of 8-byte entries, the key's low 48 bits
and the shard holding the job (+1; 0 is an empty slot, ``0xFFFF`` a slot
whose entry was removed), and grows on its own, twice as large, into a new
region of the file. Each stripe is guarded by a POSIX record lock on one
byte of the file, held for a few microseconds; the kernel releases it if
its holder dies, so a shard killed mid-claim blocks nobody.

An entry says "this shard has (or had) a job whose key is this". A key is
not proof of an id: two ids may share one (rarely), and a shard that
restarted may have left entries of jobs it lost. So a claim that meets
another shard's entry asks that shard whether it holds the id before it
refuses (:meth:`HostIds.claim` with ``checked``); those are the only
messages left, and they come only with a real duplicate, a twin key, or a
shard's crash. A shard that starts puts its own entries right (drops the
ones of jobs it no longer has, adds its jobs) before it serves
(:meth:`HostIds.replace_owner`).
"""
from __future__ import annotations

import fcntl
import mmap
import os
import struct
from typing import Dict, Final, Iterable, List, Sequence

import xxhash

MAGIC: Final = 0x31534449_53515551       # "QUQSIDS1", little-endian
STRIPE_BITS: Final = 12
STRIPES: Final = 1 << STRIPE_BITS
_STRIPE_SHIFT: Final = 64 - STRIPE_BITS
FIRST_CAPACITY: Final = 64               # entries of a stripe's first region (512 bytes)
_ENTRY: Final = 8
_FP_MASK: Final = (1 << 48) - 1          # the key's bits an entry keeps (its top bits chose the stripe)
_OWNER_MASK: Final = 0xFFFF
_EMPTY: Final = 0
_REMOVED: Final = 0xFFFF                 # an owner field: the slot's entry was removed
MAX_OWNER: Final = 0xFFFD                # shards 0..MAX_OWNER (the field holds shard + 1)

# The header: magic, stripes, file size, end of the allocated part; the
# free lists of regions (one per power-of-two capacity) follow.
_MAGIC_AT: Final = 0
_STRIPES_AT: Final = 8
_FILE_SIZE_AT: Final = 16
_END_AT: Final = 24
_FREE_AT: Final = 64
_FREE_CLASSES: Final = 48
_DIRECTORY_AT: Final = 4096
# A stripe's directory entry: its region's offset, capacity (entries),
# slots used (entries and removed ones), live entries.
_DIR_ENTRY: Final = 32
_REGIONS_AT: Final = _DIRECTORY_AT + STRIPES * _DIR_ENTRY
# Lock bytes (record locks are advisory: these offsets say nothing of the data there).
_ALLOCATOR_LOCK: Final = STRIPES

_U64: Final = struct.Struct("<Q")
_DIR: Final = struct.Struct("<QQQQ")
_PAGE: Final = mmap.PAGESIZE


def key_of(id: str) -> int:
    """The table's key for job id ``id``."""
    return xxhash.xxh64_intdigest(id.encode())


def _class_of(capacity: int) -> int:
    return capacity.bit_length() - 1


class HostIds:
    """One process's view of the host's table (the memory file ``fd``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        size = os.fstat(fd).st_size
        self._mm = mmap.mmap(fd, size)
        self._mapped = size
        if _U64.unpack_from(self._mm, _MAGIC_AT)[0] != MAGIC:
            raise ValueError("not a table of job ids (wrong magic)")
        if _U64.unpack_from(self._mm, _STRIPES_AT)[0] != STRIPES:
            raise ValueError("a table of job ids with another stripe count")

    @staticmethod
    def create(name: str = "queueserver-ids") -> int:
        """A new, empty table in a new memory file: its descriptor (inheritable)."""
        fd = os.memfd_create(name, 0)   # (no MFD_CLOEXEC: the shards inherit it)
        end = _REGIONS_AT + STRIPES * FIRST_CAPACITY * _ENTRY
        size = -(-end // _PAGE) * _PAGE
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            _U64.pack_into(mm, _MAGIC_AT, MAGIC)
            _U64.pack_into(mm, _STRIPES_AT, STRIPES)
            _U64.pack_into(mm, _FILE_SIZE_AT, size)
            _U64.pack_into(mm, _END_AT, end)
            region = _REGIONS_AT
            for stripe in range(STRIPES):
                _DIR.pack_into(mm, _DIRECTORY_AT + stripe * _DIR_ENTRY, region, FIRST_CAPACITY, 0, 0)
                region += FIRST_CAPACITY * _ENTRY
        return fd

    # ------------------------------------------------------------ the API
    def claim(self, key: int, owner: int, checked: Sequence[int] = ()) -> List[int]:
        """Take ``key`` for ``owner``'s new job: ``[]`` once it is taken (it
        was free, or ``owner``'s already), else the other shards whose
        entries have this key, and nothing is written. ``checked``: shards
        whose entries were found (asked) not to hold the id: they no longer
        stand in the way, and the key is taken beside them."""
        stripe = key >> _STRIPE_SHIFT
        self._lock(stripe)
        try:
            return self._take(stripe, key, owner, checked)
        finally:
            self._unlock(stripe)

    def _take(self, stripe: int, key: int, owner: int, checked: Sequence[int]) -> List[int]:
        """:meth:`claim`, the stripe locked."""
        mm = self._view()
        at = _DIRECTORY_AT + stripe * _DIR_ENTRY
        region, capacity, used, live = _DIR.unpack_from(mm, at)
        fp = key & _FP_MASK
        mask = capacity - 1
        slot = key & mask
        free = -1
        others: List[int] = []
        while True:
            offset = region + slot * _ENTRY
            entry: int = _U64.unpack_from(mm, offset)[0]
            if entry == _EMPTY:
                break
            code = entry & _OWNER_MASK
            if code == _REMOVED:
                if free < 0:
                    free = offset
            elif entry >> 16 == fp:
                if code - 1 == owner:
                    return []
                if code - 1 not in checked:
                    others.append(code - 1)
            slot = (slot + 1) & mask
        if others:
            return others
        value = (fp << 16) | (owner + 1)
        if free >= 0:   # a removed entry's slot
            _U64.pack_into(mm, free, value)
            _DIR.pack_into(mm, at, region, capacity, used, live + 1)
            return []
        _U64.pack_into(mm, offset, value)
        _DIR.pack_into(mm, at, region, capacity, used + 1, live + 1)
        if (used + 1) * 4 > capacity * 3:
            self._rebuild(stripe)
        return []

    def forget(self, key: int, owner: int) -> None:
        """``owner``'s job with ``key`` is gone."""
        stripe = key >> _STRIPE_SHIFT
        self._lock(stripe)
        try:
            mm = self._view()
            at = _DIRECTORY_AT + stripe * _DIR_ENTRY
            region, capacity, used, live = _DIR.unpack_from(mm, at)
            value = ((key & _FP_MASK) << 16) | (owner + 1)
            mask = capacity - 1
            slot = key & mask
            while True:
                offset = region + slot * _ENTRY
                entry: int = _U64.unpack_from(mm, offset)[0]
                if entry == _EMPTY:
                    return
                if entry == value:
                    _U64.pack_into(mm, offset, entry | _REMOVED)
                    _DIR.pack_into(mm, at, region, capacity, used, live - 1)
                    return
                slot = (slot + 1) & mask
        finally:
            self._unlock(stripe)

    def owners(self, key: int) -> List[int]:
        """The shards whose entries have ``key`` (usually none or one)."""
        stripe = key >> _STRIPE_SHIFT
        self._lock(stripe)
        try:
            mm = self._view()
            region, capacity, _, _ = _DIR.unpack_from(mm, _DIRECTORY_AT + stripe * _DIR_ENTRY)
            fp = key & _FP_MASK
            mask = capacity - 1
            slot = key & mask
            found: List[int] = []
            while True:
                entry: int = _U64.unpack_from(mm, region + slot * _ENTRY)[0]
                if entry == _EMPTY:
                    return found
                code = entry & _OWNER_MASK
                if code != _REMOVED and entry >> 16 == fp:
                    found.append(code - 1)
                slot = (slot + 1) & mask
        finally:
            self._unlock(stripe)

    def replace_owner(self, owner: int, keys: Iterable[int]) -> None:
        """``owner`` holds exactly the jobs of ``keys`` now (a shard that
        starts, with what it recovered): its other entries go, these are
        added; one stripe at a time, so others' claims go on meanwhile."""
        by_stripe: Dict[int, List[int]] = {}
        for key in keys:
            by_stripe.setdefault(key >> _STRIPE_SHIFT, []).append(key)
        code = owner + 1
        anyone = range(MAX_OWNER + 1)
        for stripe in range(STRIPES):
            mine = by_stripe.get(stripe, ())
            self._lock(stripe)
            try:
                mm = self._view()
                at = _DIRECTORY_AT + stripe * _DIR_ENTRY
                region, capacity, used, live = _DIR.unpack_from(mm, at)
                entries = struct.unpack_from(f"<{capacity}Q", mm, region)
                for slot, entry in enumerate(entries):
                    if entry != _EMPTY and entry & _OWNER_MASK == code:
                        _U64.pack_into(mm, region + slot * _ENTRY, entry | _REMOVED)
                        live -= 1
                _DIR.pack_into(mm, at, region, capacity, used, live)
                self._rebuild(stripe, len(mine))
                for key in mine:
                    self._take(stripe, key, owner, anyone)   # beside anyone's entry
            finally:
                self._unlock(stripe)

    def counts(self) -> Dict[str, int]:
        """Live entries, slots in use, and the memory file's size (for /status)."""
        mm = self._view()
        live = used = 0
        for stripe in range(STRIPES):
            _, _, stripe_used, stripe_live = _DIR.unpack_from(mm, _DIRECTORY_AT + stripe * _DIR_ENTRY)
            used += stripe_used
            live += stripe_live
        return {"entries": live, "slots_used": used, "bytes": self._mapped}

    def close(self) -> None:
        self._mm.close()

    # ---------------------------------------------------------- the parts
    def _lock(self, byte: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, byte)

    def _unlock(self, byte: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, byte)

    def _view(self) -> mmap.mmap:
        """The mapping, made anew if the file grew since (another shard grew a stripe)."""
        mm = self._mm
        size: int = _U64.unpack_from(mm, _FILE_SIZE_AT)[0]
        if size != self._mapped:
            mm.close()
            mm = self._mm = mmap.mmap(self.fd, size)
            self._mapped = size
        return mm

    def _rebuild(self, stripe: int, more: int = 0) -> None:
        """Copy a stripe's live entries into a fresh region (removed slots
        dropped), twice as large if they (and ``more`` to come) fill half of
        it. The stripe is locked by the caller."""
        mm = self._view()
        at = _DIRECTORY_AT + stripe * _DIR_ENTRY
        region, capacity, used, live = _DIR.unpack_from(mm, at)
        if used == live and (live + more) * 4 <= capacity * 3:
            return   # nothing removed to drop, and room enough
        size = capacity
        while (live + more) * 2 > size:
            size *= 2
        entries = struct.unpack_from(f"<{capacity}Q", mm, region)
        fresh = self._allocate(size)
        mm = self._view()
        mask = size - 1
        for entry in entries:
            if entry == _EMPTY or entry & _OWNER_MASK == _REMOVED:
                continue
            slot = (entry >> 16) & mask
            while _U64.unpack_from(mm, fresh + slot * _ENTRY)[0] != _EMPTY:
                slot = (slot + 1) & mask
            _U64.pack_into(mm, fresh + slot * _ENTRY, entry)
        _DIR.pack_into(mm, at, fresh, size, live, live)
        self._free(region, capacity)

    def _allocate(self, capacity: int) -> int:
        """A zeroed region of ``capacity`` entries: a freed one of that size,
        or a new one at the end of the file (which grows by at least half)."""
        size = capacity * _ENTRY
        self._lock(_ALLOCATOR_LOCK)
        try:
            mm = self._view()
            head_at = _FREE_AT + _class_of(capacity) * 8
            head: int = _U64.unpack_from(mm, head_at)[0]
            if head:
                _U64.pack_into(mm, head_at, _U64.unpack_from(mm, head)[0])
                mm[head:head + size] = bytes(size)
                return head
            start: int = _U64.unpack_from(mm, _END_AT)[0]
            end = start + size
            file_size: int = _U64.unpack_from(mm, _FILE_SIZE_AT)[0]
            if end > file_size:
                grown = -(-max(end, file_size + file_size // 2) // _PAGE) * _PAGE
                os.ftruncate(self.fd, grown)   # (new bytes read as zeros)
                _U64.pack_into(mm, _FILE_SIZE_AT, grown)
            _U64.pack_into(mm, _END_AT, end)
            return start
        finally:
            self._unlock(_ALLOCATOR_LOCK)

    def _free(self, region: int, capacity: int) -> None:
        """A region no stripe uses any more, for the next of its size."""
        self._lock(_ALLOCATOR_LOCK)
        try:
            mm = self._view()
            head_at = _FREE_AT + _class_of(capacity) * 8
            _U64.pack_into(mm, region, _U64.unpack_from(mm, head_at)[0])
            _U64.pack_into(mm, head_at, region)
        finally:
            self._unlock(_ALLOCATOR_LOCK)
