"""Where a router last saw each job: learnt from the answers it carries.

A router hears of no job it does not touch. The answer to an ``add`` it
forwarded says where that job went, a lease's answer where the leased job
lives; a request for a job it never saw asks the job id's home shard
(:mod:`queueserver.shard.idhome`). What it learnt is a hint, not a fact: a
job may have left since, so a shard that answers NOT_FOUND to a hinted
request is checked against the home.

Two generations of :class:`~queueserver.links.directory.JobDirectory` (about 6 bytes a job):
new entries go to the young one; when it holds ``limit`` entries, the old
one is dropped and the young one ages. Memory stays bounded whatever the
traffic, and a job forgotten that way costs one question to its home.
"""
from __future__ import annotations

from typing import Final, Optional

from ..links.directory import SHARED, JobDirectory

DEFAULT_LIMIT: Final = 1 << 18   # entries per generation: at most ~3 MB for both


class JobCache:
    __slots__ = ("_young", "_old", "limit")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._young = JobDirectory()
        self._old = JobDirectory()
        self.limit = limit

    def shard_of(self, id: str) -> Optional[int]:
        """The shard the job was last seen on; None when not known (or two
        jobs' hashes meet: then its home is asked)."""
        shard = self._young.shard_of(id)
        if shard is None:
            shard = self._old.shard_of(id)
        return None if shard == SHARED else shard

    def place(self, id: str, shard: int) -> None:
        young = self._young
        seen = young.shard_of(id)
        if seen is not None and seen != shard:
            young.forget(id, seen)   # it moved: the newer word wins
        young.place(id, shard)
        if len(young) >= self.limit:
            self._old, self._young = young, JobDirectory()

    def forget(self, id: str, shard: int) -> None:
        self._young.forget(id, shard)
        self._old.forget(id, shard)

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
