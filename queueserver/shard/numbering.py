"""How a shard numbers its jobs (goqueue's ids), and which numbers are its own.

On one host the shards take blocks of numbers from the server's file
(:mod:`queueserver.jobnumbers`): a fresh block whenever the engine has
used up the last one, before the request that makes a job, so the first
job of a fresh server is 1 whichever shard holds it. Without that file
(and in a cluster, where jobs move with their slots) each shard numbers
its jobs in its own residue class, striding over every shard there may be.
"""
from __future__ import annotations

import logging
import time
from typing import Final, Optional

from ..engine import Engine
from ..engine.status import SERVER_ERROR, Reply
from ..jobnumbers import Blocks, NumberFile, NumbersError

log: Final = logging.getLogger("queueserver.shard")


class Numbering:
    """The job numbers of shard ``index`` of ``shards``: from blocks of the
    file ``numbers`` (None: its residue class; ``clustered``: a cluster's
    shard, whose jobs may have been numbered elsewhere)."""

    def __init__(self, index: int, shards: int, engine: Engine, numbers: Optional[str], durable: bool,
                 clustered: bool) -> None:
        self.index = index
        self.shards = shards
        self.engine = engine
        self.clustered = clustered
        #: where this shard takes blocks of job numbers (None: its residue class, as in a cluster)
        self.blocks: Optional[Blocks] = None
        if numbers is not None and not clustered:
            self.blocks = Blocks(NumberFile(numbers, durable=durable), index)
            engine.give_numbers(0, 0)   # the first job that needs one takes a block
        self._refused = 0.0

    def take(self) -> Optional[Reply]:
        """A fresh block of job numbers, before a request that makes a job;
        the request's error when none can be had."""
        blocks = self.blocks
        assert blocks is not None   # the engine needs numbers only where blocks give them
        try:
            self.engine.give_numbers(*blocks.take(self.engine.last_number))
        except (NumbersError, OSError) as err:
            now = time.monotonic()
            if now - self._refused > 10:
                self._refused = now
                log.error("shard %d cannot take job numbers: %s", self.index, err)
            return [SERVER_ERROR, "Cannot number jobs now; try again"]
        return None

    def makes(self, number: int) -> bool:
        """Whether job ``number`` would be here (a goqueue DELETE served directly)."""
        blocks = self.blocks
        if blocks is None:   # numbers of this shard's residue class; in a cluster, maybe moved here
            return (number - 1) % self.shards == self.index and (
                not self.clustered or self.engine.has_number(number))
        if blocks.numbers.is_old(number):
            return self.engine.has_number(number)
        return blocks.numbers.owner(number) == self.index

    def recovered(self) -> None:
        """The log was replayed: an older data directory (made before blocks)
        says the highest number made here."""
        if self.blocks is not None and self.blocks.numbers.upgrading():
            self.blocks.numbers.raise_floor(self.engine.last_number, self.index)
