"""The router process: client connections in front, shard links behind.
Run it with ``python -m queueserver.router`` (the supervisor does)."""
from .router import Router, shard_for

__all__ = ["Router", "shard_for"]
