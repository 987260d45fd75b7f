"""The shard process: one engine, its timers, its Unix socket.
Run it with ``python -m queueserver.shard`` (the supervisor does)."""
from .shard import Shard

__all__ = ["Shard"]
