"""Which shard owns a queue: the one rule routers and shards must share."""
from __future__ import annotations

from typing import Final

import xxhash

_hash: Final = xxhash.xxh64_intdigest


def shard_for(name: str, shards: int) -> int:
    """The shard (of ``shards``) that owns queue ``name``."""
    return _hash(name.encode()) % shards
