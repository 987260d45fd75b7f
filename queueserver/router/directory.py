"""Which shard holds which job, for commands that name only a job id.

Queues live on the shard their name hashes to, but ``complete``, ``delete``
or ``result`` name just a job. The router notes the shard of every job it
creates, shards report each job that leaves them, and a (re)connecting shard
lists all it holds, so the directory stays exact.

To cost little per queued job, an id is kept as its 64-bit xxhash, one small
int per job. Two live ids that share a hash (or one id that really is on two
shards) are marked :data:`SHARED`; commands for them ask every shard. Job
numbers (goqueue's ids) are not kept at all: a delete by number asks every
shard, and only the owner answers.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import xxhash

SHARED = -1

_hash = xxhash.xxh64_intdigest


def id_key(id: str) -> int:
    return _hash(id.encode())


class JobDirectory:
    """``routers``/``router``: each of several routers makes numbers of its own
    residue class, so numbers stay unique; one router counts 1, 2, 3..."""

    __slots__ = ("_where", "last_number", "_stride", "_residue")

    def __init__(self, routers: int = 1, router: int = 0) -> None:
        self._where: Dict[int, int] = {}
        self.last_number = 0
        self._stride = routers
        self._residue = router

    def new_number(self) -> int:
        number = self.last_number + 1
        number += (self._residue - (number - 1)) % self._stride
        self.last_number = number
        return number

    def shard_of(self, id: str) -> Optional[int]:
        """The shard holding ``id``, :data:`SHARED`, or ``None`` when no shard has it."""
        return self._where.get(_hash(id.encode()))

    def place(self, id: str, shard: int) -> bool:
        """Record ``id`` on ``shard``; False if the entry was there already."""
        key = _hash(id.encode())
        where = self._where
        known = where.get(key)
        if known is None:
            where[key] = shard
            return True
        if known != shard:
            where[key] = SHARED
        return False

    def forget(self, id: str, shard: int) -> None:
        key = _hash(id.encode())
        if self._where.get(key) == shard:
            del self._where[key]

    def forget_all(self, ids: Iterable[str], shard: int) -> None:
        where = self._where
        for id in ids:
            key = _hash(id.encode())
            if where.get(key) == shard:
                del where[key]

    def forget_shard(self, shard: int) -> None:
        """A shard restarted empty: none of its jobs exist any more."""
        self._where = {k: s for k, s in self._where.items() if s != shard}

    def learn(self, shard: int, last_number: int, ids: Iterable[str]) -> None:
        for id in ids:
            self.place(id, shard)
        self.last_number = max(self.last_number, last_number)

    def __len__(self) -> int:
        return len(self._where)
