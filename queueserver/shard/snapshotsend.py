"""A follower's first state: written by a forked child, streamed by the primary.

Why: a follower that connects (or falls out of sync) starts from the whole
live state. Packed in the primary's event loop, that paused every client of
the shard in proportion to its jobs (seconds at a million). Here a child
forked at one instant between two log records (:mod:`.forked`) packs the
state, as the stream's ``snap`` frames, into a pipe; the primary forwards
each frame whole to the follower as it comes, without unpacking it, and
reads no further ahead than the follower takes (``HIGH_WATER`` bytes queued
on its link), so neither the primary's memory nor its loop pays for the
state's size. Records logged after the fork wait for the follower behind
the snapshot (:class:`.replication.Replicator`).

In the pipe each frame follows its length (4 bytes, big-endian); a length
of 0 and the count of events (8 bytes) end a complete snapshot: a pipe that
ends without them is a child that died, and the follower has not been told
the snapshot is complete (its ``last`` part never came), so it never
installs it.
"""
from __future__ import annotations

import logging
import struct
import time
from itertools import islice
from typing import Callable, Iterator, Optional

import gevent
import msgpack
from gevent.event import Event as Signal

from ..engine.effects import Event
from ..net.channel import FrameChannel
from ..store.segments import write_all
from .forked import Child, describe, fork_child

log = logging.getLogger("queueserver.shard")

#: Events per part of a snapshot (a frame stays a few MiB at most).
SNAPSHOT_PART = 2000
#: Bytes queued on the follower's link beyond which no more is read from the child.
HIGH_WATER = 4 << 20

_LENGTH = struct.Struct(">I")
_COUNT = struct.Struct(">Q")


def write_frames(pipe: int, events: Iterator[Event], base: int, epoch: int) -> None:
    """In the child: ``events`` as ``snap`` frames, each behind its length, then the end."""
    pack = msgpack.Packer(use_bin_type=True).pack
    count = 0
    while True:
        part = list(islice(events, SNAPSHOT_PART))
        count += len(part)
        last = len(part) < SNAPSHOT_PART
        frame = pack([0, "snap", [base, part, last, epoch]])
        write_all(pipe, _LENGTH.pack(len(frame)) + frame)
        if last:
            break
    write_all(pipe, _LENGTH.pack(0) + _COUNT.pack(count))


class SnapshotSend:
    """One follower's snapshot under way: the child writing it, the greenlet forwarding it.

    ``progress()`` is called as the follower takes what is queued for it;
    ``done(error)`` once, when the snapshot is sent whole (``error`` None)
    or cannot be (a line saying why). :meth:`cancel` stops both (the
    follower is gone)."""

    def __init__(self, channel: FrameChannel, events: Callable[[], Iterator[Event]], base: int,
                 epoch: int, progress: Callable[[], None],
                 done: Callable[[Optional[str]], None]) -> None:
        self.channel = channel
        self.base = base
        self.events = 0       # events sent, once complete
        self.bytes = 0        # bytes forwarded so far
        self.started = time.monotonic()
        self._progress = progress
        self._done = done
        self.child: Child = fork_child(lambda pipe: write_frames(pipe, events(), base, epoch))
        self._greenlet = gevent.spawn(self._forward)

    def cancel(self) -> None:
        """The follower is gone: stop forwarding, kill the child (its pipe closed, it reaped)."""
        if self._greenlet is not gevent.getcurrent():
            self._greenlet.kill()
        if self.child.status is None:
            self.child.kill()

    def _forward(self) -> None:
        child = self.child
        error: Optional[str] = "forwarding stopped"
        try:
            error = self._frames(child.chunks())
        except OSError as err:
            error = f"reading its pipe failed: {err}"
        finally:
            if error is not None:   # a part sent, never the last: the follower installs nothing
                child.kill()
        status = child.reap()
        if error is not None:
            error = f"the snapshot writer (pid {child.pid}) {describe(status)}; {error}"
        self._done(error)

    def _frames(self, chunks: Iterator[bytes]) -> Optional[str]:
        """Forward each whole frame; None once the end came, else what went wrong."""
        buffer = bytearray()
        send = self.channel.send_packed
        for chunk in chunks:
            buffer += chunk
            at = 0
            while len(buffer) - at >= _LENGTH.size:
                (size,) = _LENGTH.unpack_from(buffer, at)
                if size == 0:   # the end: the count of events follows
                    if len(buffer) - at < _LENGTH.size + _COUNT.size:
                        break
                    (self.events,) = _COUNT.unpack_from(buffer, at + _LENGTH.size)
                    return None
                end = at + _LENGTH.size + size
                if end > len(buffer):
                    break
                send(bytes(buffer[at + _LENGTH.size:end]))
                self.bytes += size
                at = end
            del buffer[:at]
            self._drain()
        return "the pipe ended before the snapshot did"

    def _drain(self) -> None:
        """Wait (yielding) while much is queued for the follower; it is alive
        (``progress()``) as long as it takes what is queued."""
        writer = self.channel.writer
        if writer.queued > HIGH_WATER:
            drained = Signal()
            writer.when_drained(drained.set)
            try:
                while writer.queued > HIGH_WATER and not writer.closed:
                    drained.clear()
                    drained.wait()
                    self._progress()
            finally:
                writer.when_drained(None)
        self._progress()
