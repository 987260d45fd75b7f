"""A durable shard's rule: nobody hears of a change before the log holds it.

Every event the engine returns goes to the shard's append-only log
(:mod:`queueserver.store`) as it happens. An answer (to a client, a router,
or a parked request) is sent at once when the log holds everything
appended so far; otherwise it is held, in order, until the commit that
covers what came before it. One commit per loop turn gathers all that turn
appended, so many requests share one write and one fsync (group commit).

If a write fails (a full disk, an I/O error), the answers waiting for it
become errors: nothing is acknowledged that is not on disk. Those changes
stay in the engine and in the log's memory, in order, and are written as
soon as the disk allows (for them, an error means "not known to be on
disk", as a timeout would). From then on, until the log writes again,
requests that would change state are refused before they change anything.

Compaction writes the live state as a snapshot from a forked child (the
way Redis rewrites its AOF): the child sees the state as of the fork, frozen,
while the shard keeps serving; the fork is the only pause.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Final, Optional, Tuple

import gevent
import msgpack

from ..engine import Engine
from ..engine.effects import Effects
from ..engine.ops import REFUSED_WHILE_LOG_FAILS
from ..engine.status import SERVER_ERROR, Reply
from ..store import AppendLog, StoreError, recover
from ..store.compaction import write_snapshot
from ..store.segments import write_all
from ..store.writer import SLOW_SYNC_MS
from .forked import Child, describe, fork_child
from .replication import Replicator

log: Final = logging.getLogger("queueserver.shard")

#: Seconds between tries of a compaction whose fork failed (no memory, no
#: process slot): each failure is one log line, not one a loop turn.
FORK_RETRY_SECONDS: Final = 60


def _no_pause() -> None:
    """A forked snapshot writer is alone: it never yields."""


class Durability:
    """The log of one shard, and the answers waiting for it."""

    #: the log, open once :meth:`recover` has replayed it (unset until then:
    #: a durable shard recovers before it serves, and nothing is logged before)
    wal: AppendLog

    def __init__(self, directory: str, shard: int, shards: int, fsync: str = "always",
                 fsync_interval_ms: float = 1000.0, compact_after_bytes: int = 64 << 20,
                 fsync_in_loop_ms: float = SLOW_SYNC_MS) -> None:
        self.directory = directory
        self.fsync_in_loop_ms = fsync_in_loop_ms
        self.shard = shard
        self.shards = shards
        self.fsync = fsync
        self.fsync_interval_ms = fsync_interval_ms
        self.compact_after_bytes = compact_after_bytes
        self.recovered = False   # whether the log is open (``wal`` set)
        self.appended = 0      # events given to the log
        self._committed = 0    # events a commit has been asked for
        self._durable = 0      # events the log has confirmed
        self._held: Deque[Tuple[int, Callable[[Reply], None], Reply]] = deque()
        self.worst_pause = 0.0   # seconds: the longest fork of a compaction
        self._no_fork_until = 0.0   # (monotonic) a failed fork is not tried again before this
        #: the followers every answer also waits for (a replicated cluster's primary; None: none)
        self.replicator: Optional[Replicator] = None

    # ------------------------------------------------------------ recovery
    def recover(self, engine: Engine) -> Tuple[int, float]:
        """Replay the log into ``engine`` and open it for writing; how many
        records it held and how long replaying took (StoreError if unusable)."""
        recovery = recover(self.directory, self.shard, self.shards)
        engine.replay(recovery)
        self.wal = AppendLog(recovery, policy=self.fsync, interval_ms=int(self.fsync_interval_ms),
                             compact_min_bytes=self.compact_after_bytes,
                             slow_sync_ms=self.fsync_in_loop_ms).start()
        self.recovered = True
        return recovery.records, recovery.seconds

    # ------------------------------------------------------------- writing
    def refusal(self, op: str) -> Optional[Reply]:
        """While the disk is failing, a request that would change state is
        refused before it changes anything (it could not be made durable;
        the table of operations says which: give-backs the server makes
        itself are never refused, they undo)."""
        error = self.wal.error
        if error is None or op not in REFUSED_WHILE_LOG_FAILS:
            return None
        return [SERVER_ERROR, f"Log write failed: {getattr(error, 'strerror', None) or error}"]

    def record(self, fx: Effects) -> None:
        events = fx.events
        if events:
            append = self.wal.append
            for event in events:
                append(event)
            self.appended += len(events)
            if self.replicator is not None:
                self.replicator.publish(events)

    def answer(self, send: Callable[[Reply], None], reply: Reply) -> None:
        """``send(reply)`` now, or once everything appended before it is
        durable (and, with followers, held by every in-sync follower)."""
        if self.appended > self._durable or (self.replicator is not None
                                             and self.appended > self.replicator.replicated()):
            self._held.append((self.appended, send, reply))
        else:
            send(reply)

    def commit(self) -> None:
        """At the end of a loop turn: one commit for everything it appended
        (and one frame of it to each follower)."""
        if self.appended > self._committed:
            upto = self._committed = self.appended
            if self.replicator is not None:
                self.replicator.flush()
            self.wal.commit(lambda error: self._done(upto, error))

    def release(self) -> None:
        """Send the held answers whose changes are now durable everywhere they must be."""
        upto = self._durable
        if self.replicator is not None:
            upto = min(upto, self.replicator.replicated())
        held = self._held
        while held and held[0][0] <= upto:
            _, send, reply = held.popleft()
            send(reply)

    def _done(self, upto: int, error: Optional[BaseException]) -> None:
        held = self._held
        if error is None:
            if upto > self._durable:
                self._durable = upto
            if self.replicator is not None:
                self.release()
                return
            while held and held[0][0] <= upto:
                _, send, reply = held.popleft()
                send(reply)
            return
        failed = [SERVER_ERROR, f"Log write failed: {getattr(error, 'strerror', None) or error}"]
        count = 0
        while held and held[0][0] <= upto:
            _, send, _reply = held.popleft()
            send(failed)
            count += 1
        # Those changes are no longer waited for: later answers need only later ones.
        if upto > self._durable:
            self._durable = upto
        log.error("shard %d: %s; %d answers became errors (the changes are written once the "
                  "disk allows)", self.shard, error, count)

    # ---------------------------------------------------------- compaction
    def maybe_compact(self, engine: Engine) -> None:
        """When history dominates the log, rewrite it as the live state."""
        if not self.recovered:
            return
        wal = self.wal
        if not wal.needs_compaction() or time.monotonic() < self._no_fork_until:
            return
        started = time.perf_counter()
        seq = wal.begin_compaction()
        now = time.time_ns() // 1000
        directory, shard, shards, epoch = self.directory, self.shard, self.shards, wal.epoch

        def write(pipe: int) -> None:   # in the child: write the frozen state, say where
            tmp, size, count = write_snapshot(directory, shard, shards, seq, engine.snapshot(), now,
                                              pause=_no_pause, epoch=epoch)
            write_all(pipe, msgpack.packb([tmp, size, count]))

        try:
            child = fork_child(write)
        except OSError as err:   # no memory or no process slot for the child: try again later
            wal.abort_compaction()
            self._no_fork_until = time.monotonic() + FORK_RETRY_SECONDS
            log.error("shard %d: cannot fork the snapshot writer: %s; the log is not compacted "
                      "(trying again in %d s)", self.shard, err, FORK_RETRY_SECONDS)
            return
        paused = time.perf_counter() - started
        self.worst_pause = max(self.worst_pause, paused)
        gevent.spawn(self._finish, wal, child, seq, started, paused)

    def _finish(self, wal: AppendLog, child: Child, seq: int, started: float, paused: float) -> None:
        try:
            data = child.read_all()
        finally:
            status = child.reap()
        if not data:
            wal.abort_compaction()
            log.error("shard %d: the snapshot writer (pid %d) %s; the log is unchanged", self.shard,
                      child.pid, describe(status))
            return
        tmp, size, count = msgpack.unpackb(data)
        try:
            stats = wal.finish_compaction(seq, tmp, size, count, started)
        except StoreError as err:
            log.error("shard %d: installing the snapshot failed: %s (the log is unchanged)",
                      self.shard, err)
            return
        log.info("shard %d: log compacted to %d live records (%d bytes, %d bytes freed) in %.2f s; "
                 "the shard paused %.1f ms to fork", self.shard, count, size, stats["freed"],
                 stats["seconds"], paused * 1000)

    def stats(self) -> Dict[str, Any]:
        info = self.wal.stats() if self.recovered else {}
        info["held-answers"] = len(self._held)
        info["worst-compaction-pause-ms"] = round(self.worst_pause * 1000, 1)
        return info

    def close(self) -> None:
        if self.recovered:
            self.wal.close()
