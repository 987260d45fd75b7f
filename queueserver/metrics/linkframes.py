"""Frames a process exchanged over the links it opened, for ``/status``.

Every link between two processes of a server is opened by one of them: a
router opens one to each shard, a shard one to each other shard (its id
homes' traffic, :mod:`queueserver.shard.peers`). So the frames sent and
received on the links a process opened, summed over the routers, are
every frame between routers and shards, and summed over the shards, every
frame between shards, each counted once. ``make bench-cores`` divides the
latter by the jobs done: the messaging a job costs between shards.

Nothing is counted on the way: each :class:`~queueserver.net.channel.FrameChannel`
already keeps its ``sent`` and ``received`` counts, read here when asked.
A link that reconnects gets a new channel; the old one is kept until the
next read, which adds its final counts to those of channels gone before
(a link that came and went entirely between two reads is not seen).
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Protocol


class CountedChannel(Protocol):
    """A link's channel as read here: its frames sent and received so far
    (a :class:`~queueserver.net.channel.FrameChannel`; metrics lie below
    the net and import nothing of it)."""

    @property
    def sent(self) -> int: ...

    @property
    def received(self) -> int: ...


class LinkFrames:
    """Frames sent and received over a process's own links, across reconnects."""

    def __init__(self) -> None:
        self._seen: Dict[int, CountedChannel] = {}   # id(channel) -> channel, as of the last read
        self._gone = 0                             # frames of channels since replaced or closed

    def count(self, channels: Iterable[Optional[CountedChannel]]) -> int:
        """Frames so far over ``channels`` (the links' current ones; None:
        a link down now) and every channel of theirs seen before."""
        now = {id(channel): channel for channel in channels if channel is not None}
        for key, channel in self._seen.items():
            if key not in now:
                self._gone += channel.sent + channel.received
        self._seen = now
        return self._gone + sum(channel.sent + channel.received for channel in now.values())
