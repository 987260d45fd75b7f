"""The router process: client connections in front, shard links behind.
Run it with ``python -m queueserver.router`` (the supervisor does)."""
from ..placement import shard_for
from .router import Router

__all__ = ["Router", "shard_for"]
