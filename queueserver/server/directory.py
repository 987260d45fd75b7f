"""Which shard holds which job, for commands that name only an id.

Queues live on the shard their name hashes to, but ``complete``, ``delete``
or goqueue's ``DELETE <number>`` name just a job. The router notes the shard
of every job it creates (by UUID and by number), shards report each job that
leaves them, and a (re)connecting shard lists all the jobs it holds, so the
directory stays exact. Being exact, it also de-duplicates ids across shards.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Sequence, Union

Key = Union[str, int]


class JobDirectory:
    __slots__ = ("_where", "last_number")

    def __init__(self) -> None:
        self._where: Dict[Key, int] = {}
        self.last_number = 0

    def new_number(self) -> int:
        self.last_number += 1
        return self.last_number

    def shard_of(self, key: Key) -> Optional[int]:
        return self._where.get(key)

    def __contains__(self, key: Key) -> bool:
        return key in self._where

    def place(self, id: str, number: int, shard: int) -> None:
        self._where[id] = shard
        self._where[number] = shard

    def forget(self, id: str, number: int) -> None:
        where = self._where
        where.pop(id, None)
        where.pop(number, None)

    def forget_all(self, pairs: Iterable[Sequence]) -> None:
        where = self._where
        for id, number in pairs:
            where.pop(id, None)
            where.pop(number, None)

    def forget_shard(self, shard: int) -> None:
        """A shard restarted empty: none of its jobs exist any more."""
        self._where = {k: s for k, s in self._where.items() if s != shard}

    def learn(self, shard: int, last_number: int, pairs: Iterable[Sequence]) -> None:
        for id, number in pairs:
            self.place(id, number, shard)
        self.last_number = max(self.last_number, last_number)

    def __len__(self) -> int:
        return len(self._where) // 2
