"""A primary shard's followers: its log, streamed to shards on other nodes.

Why: a job acknowledged by one host is lost with that host's disk. With
``replicas`` set in the cluster file, each shard (the primary of its group)
streams every event it appends to its log to followers on other nodes
(:mod:`.follower`), which apply it to an engine of their own and append it
to a log of their own. A change is acknowledged to its client only once it
is in the primary's log and in the log of every *in-sync* follower, each
under its fsync policy (Kafka's ``acks=all``).

The stream, as control frames (request id 0) of the link a follower opened
and authenticated as any router does::

    follower -> primary  [0, "replicate", [node]]
    primary  -> follower [0, "snap", [base, events, last]]  the live state, in parts
    primary  -> follower [0, "rec", [upto, events]]         each loop turn's events
    follower -> primary  [0, "ack", upto]                   durable up to there

Positions count the events the primary appended since it started (its
``Durability.appended``). A follower that connects (or reconnects, or
falls behind) gets the whole live state again (``engine.snapshot()``, the
same events a compacted log starts with), written by a forked child while
the primary serves (:mod:`.snapshotsend`), then the events logged since
the fork; it is *catching up* until it acknowledged the snapshot (it may
take ``CATCH_UP_LIMIT`` seconds without taking any of it); it then is *in
sync*. An in-sync follower that leaves
(its link closes) or has left an event unacknowledged for ``lag_limit``
seconds drops out of the in-sync set, and the answers waiting for it are
released: the group goes on with fewer copies rather than stop, each drop
one log line, and the follower catches up again from a new snapshot.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import gevent

from ..engine.effects import Event
from ..net.channel import FrameChannel
from .snapshotsend import SnapshotSend

log = logging.getLogger("queueserver.shard")

#: Seconds an in-sync follower may leave an event unacknowledged.
LAG_LIMIT = 2.0
#: Seconds a catching-up follower may take none of its snapshot, or leave it
#: unacknowledged once sent (it installs the whole state first).
CATCH_UP_LIMIT = 60.0
#: Events kept for a follower still taking its snapshot (the cluster file's
#: ``replica_backlog``): past it, it starts over, so a slow follower cannot
#: grow the primary's memory without bound.
BACKLOG_LIMIT = 1_000_000
#: Positions no follower holds back (nobody in sync).
UNBOUNDED = 1 << 62

CATCHING_UP = "catching-up"
IN_SYNC = "in-sync"
LEAVING = "leaving"    # dropped, still waited for until etcd's in-sync set no longer lists it

#: Writes the in-sync set (node names) to the group's record in etcd: True once
#: written, False if this shard is no longer the group's primary (deposed);
#: raises while etcd cannot be reached. Called from a thread.
IsrStore = Callable[[List[str]], bool]


class Follower:
    """One follower's stream, as the primary sees it."""

    __slots__ = ("node", "channel", "state", "base", "acked", "sent", "waiting_since", "pending",
                 "snapshot")

    def __init__(self, node: str, channel: FrameChannel, base: int) -> None:
        self.node = node
        self.channel = channel
        self.state = CATCHING_UP
        self.base = base            # the position its snapshot stands for
        self.acked = -1             # durable on the follower up to here (-1: nothing yet)
        self.sent = base            # streamed up to here
        self.waiting_since: Optional[float] = None   # since when something sent is unacknowledged
        self.pending: List[Event] = []               # events logged, not yet sent
        self.snapshot: Optional[SnapshotSend] = None  # its snapshot, while being sent


class Replicator:
    """The primary's side: followers, their positions, and what they hold back."""

    def __init__(self, snapshot: Callable[[], Iterator[Event]], position: Callable[[], int],
                 released: Callable[[], None], name: str, lag_limit: float = LAG_LIMIT,
                 isr_store: Optional[IsrStore] = None, epoch: int = 0,
                 backlog_limit: int = BACKLOG_LIMIT) -> None:
        """``snapshot()``: the engine's live state as events; ``position()``:
        events appended so far; ``released()``: called when the in-sync set's
        position moved (held answers may go); ``isr_store``: where the in-sync
        set is recorded (etcd), which a follower must have left before an
        answer goes without it (None: nowhere, it leaves at once);
        ``epoch``: the group's epoch, sent in every frame; ``backlog_limit``:
        events kept for a follower still taking its snapshot, past which it
        starts over (the primary's memory stays bounded)."""
        self._snapshot = snapshot
        self._position = position
        self._released = released
        self.name = name
        self.lag_limit = lag_limit
        self.isr_store = isr_store
        self.epoch = epoch
        self.backlog_limit = backlog_limit
        self.followers: Dict[int, Follower] = {}   # by id(channel)
        self.drops = 0
        #: deposed: another node is the group's primary; nothing is released any more
        self.fenced = False
        self._watch: Optional[gevent.Greenlet[[], None]] = None
        self._writer: Optional[gevent.Greenlet[[], None]] = None
        self._isr_dirty = False

    def start(self) -> None:
        self._watch = gevent.spawn(self._watch_lag)

    def stop(self) -> None:
        for greenlet in (self._watch, self._writer):
            if greenlet is not None:
                greenlet.kill(block=False)
        for follower in self.followers.values():
            if follower.snapshot is not None:
                follower.snapshot.cancel()
                follower.snapshot = None

    # ---------------------------------------------------------- followers
    def attach(self, channel: FrameChannel, node: str) -> None:
        """A follower asked for the stream: the live state as of now, then every event since."""
        base = self._position()
        follower = Follower(str(node), channel, base)
        old = [key for key, f in self.followers.items() if f.node == follower.node and f.state != LEAVING]
        for key in old:   # a reconnect: its former stream is over
            self._drop(self.followers[key], "reconnected")
        forking = time.perf_counter()
        try:
            follower.snapshot = SnapshotSend(channel, self._snapshot, base, self.epoch,
                                             lambda: self._taking(follower),
                                             lambda error: self._snapshot_sent(follower, error))
        except OSError as err:   # no memory or no process slot for the child
            log.error("shard %s: cannot fork the snapshot writer for the follower on node %s: %s; "
                      "closing its stream (it dials again)", self.name, follower.node, err)
            channel.close()
            return
        follower.waiting_since = time.monotonic()
        self.followers[id(channel)] = follower
        log.info("shard %s: follower on node %s attached at position %d; process %d writes it the "
                 "live state (the shard paused %.1f ms to fork it)", self.name, follower.node, base,
                 follower.snapshot.child.pid, (time.perf_counter() - forking) * 1000)

    def _taking(self, follower: Follower) -> None:
        """The follower took all of its snapshot queued so far: it is alive."""
        follower.waiting_since = time.monotonic()

    def _snapshot_sent(self, follower: Follower, error: Optional[str]) -> None:
        """Its snapshot is sent (then so are the events logged since), or failed."""
        snapshot, follower.snapshot = follower.snapshot, None
        if self.followers.get(id(follower.channel)) is not follower or snapshot is None:
            return
        if error is not None:
            log.warning("shard %s: the snapshot for the follower on node %s failed: %s; closing its "
                        "stream (it dials again and takes a new snapshot)", self.name, follower.node,
                        error)
            self._drop(follower, "its snapshot failed")
            return
        log.info("shard %s: follower on node %s was sent the live state (%d events, %d bytes) at "
                 "position %d in %.1f s", self.name, follower.node, snapshot.events, snapshot.bytes,
                 snapshot.base, time.monotonic() - snapshot.started)
        # From now on it owes the snapshot's acknowledgement (and then each
        # record's), unless it came already: the follower may install the last
        # part and answer before the writer's end is seen here.
        follower.waiting_since = time.monotonic() if follower.acked < follower.base else None
        self._send(follower, self._position())

    def detach(self, channel: FrameChannel) -> None:
        follower = self.followers.get(id(channel))
        if follower is not None and follower.state != LEAVING:
            self._drop(follower, "its link closed")

    def acked(self, channel: FrameChannel, upto: Any) -> None:
        follower = self.followers.get(id(channel))
        if follower is None or not isinstance(upto, int) or upto <= follower.acked:
            return
        follower.acked = upto
        follower.waiting_since = None if upto >= follower.sent else time.monotonic()
        if follower.state == CATCHING_UP:
            if upto >= follower.base:
                follower.state = IN_SYNC
                log.info("shard %s: follower on node %s is in sync at position %d", self.name,
                         follower.node, upto)
                self._record_isr()
            return
        self._released()

    # ------------------------------------------------------------ the stream
    def publish(self, events: List[Event]) -> None:
        """Events just appended to the log: each follower's next frame (one
        still taking its snapshot keeps them until then, at most about
        ``backlog_limit``: past it, :meth:`_watch_lag` makes it start over)."""
        for follower in self.followers.values():
            follower.pending += events

    def flush(self) -> None:
        """At the end of a loop turn: each follower gets the turn's events in one frame
        (one still being sent its snapshot keeps them until then)."""
        upto = self._position()
        for follower in self.followers.values():
            if follower.pending and follower.snapshot is None:
                self._send(follower, upto)

    def _send(self, follower: Follower, upto: int) -> None:
        if follower.pending:
            follower.channel.send([0, "rec", [upto, follower.pending, self.epoch]])
            follower.pending = []
            follower.sent = upto
            if follower.waiting_since is None:
                follower.waiting_since = time.monotonic()

    def replicated(self) -> int:
        """The position every in-sync follower holds durably (UNBOUNDED: none
        in sync; -1 once deposed: nothing more is acknowledged)."""
        if self.fenced:
            return -1
        lowest = UNBOUNDED
        for follower in self.followers.values():
            if follower.state != CATCHING_UP and follower.acked < lowest:
                lowest = follower.acked
        return lowest

    def in_sync(self) -> List[str]:
        return sorted(f.node for f in self.followers.values() if f.state == IN_SYNC)

    def status(self) -> List[Dict[str, Any]]:
        """Each follower's state and lag (events), for /status and ``cluster status``."""
        upto = self._position()
        return [{"node": f.node, "state": f.state, "acked": f.acked, "lag": max(0, upto - f.acked)}
                for f in self.followers.values()]

    # ------------------------------------------------------------- leaving
    def _watch_lag(self) -> None:
        while True:
            gevent.sleep(min(0.1, self.lag_limit / 4))
            now = time.monotonic()
            for follower in list(self.followers.values()):
                if follower.snapshot is not None and len(follower.pending) > self.backlog_limit:
                    self._drop(follower, f"more than {self.backlog_limit} events logged while it took "
                                         f"its snapshot: the cluster file's replica_backlog; it starts over",
                               logging.WARNING)
                    continue
                since = follower.waiting_since
                if since is None:
                    continue
                if follower.state != CATCHING_UP:
                    if now - since > self.lag_limit:
                        self._drop(follower, f"left events unacknowledged for over {self.lag_limit:g} s")
                elif now - since > CATCH_UP_LIMIT:
                    self._drop(follower, f"took none of its snapshot, or left it unacknowledged, for "
                                         f"over {CATCH_UP_LIMIT:g} s")

    def _drop(self, follower: Follower, why: str, level: int = logging.INFO) -> None:
        """End ``follower``'s stream; ``level``: how a catching-up one's end is
        logged (an in-sync one leaving is always a warning)."""
        was = follower.state
        if follower.snapshot is not None:   # its writer dies with it: nothing is left behind
            follower.snapshot.cancel()
            follower.snapshot = None
        follower.channel.close()
        if was == IN_SYNC and self.isr_store is not None:
            # Still waited for until etcd's in-sync set no longer lists it:
            # else it could be promoted without what is acknowledged now.
            follower.state = LEAVING
            follower.waiting_since = None
            self.drops += 1
            log.warning("shard %s: follower on node %s is leaving the in-sync set (%s)", self.name,
                        follower.node, why)
            self._record_isr()
            return
        del self.followers[id(follower.channel)]
        if was == IN_SYNC:
            self.drops += 1
            log.warning("shard %s: follower on node %s left the in-sync set (%s); acknowledging "
                        "with %d in-sync followers", self.name, follower.node, why, len(self.in_sync()))
            self._released()
        else:
            log.log(level, "shard %s: follower on node %s stopped catching up (%s)", self.name,
                    follower.node, why)

    # ------------------------------------------------------ the in-sync set in etcd
    def _record_isr(self) -> None:
        """Write the in-sync set to etcd (one writer at a time; a change made
        meanwhile is written right after)."""
        if self.isr_store is None:
            return
        self._isr_dirty = True
        if self._writer is None or self._writer.dead:
            self._writer = gevent.spawn(self._write_isr)

    def _write_isr(self) -> None:
        store = self.isr_store
        assert store is not None
        pool = gevent.get_hub().threadpool
        while self._isr_dirty and not self.fenced:
            self._isr_dirty = False
            members = self.in_sync()
            leaving = [f for f in self.followers.values() if f.state == LEAVING]
            written, error = pool.apply(_calling, (store, members))
            if error is not None:   # etcd unreachable: answers wait for the leaving ones
                log.warning("shard %s: cannot record the in-sync set %s in etcd: %s; retrying",
                            self.name, members, error)
                self._isr_dirty = True
                gevent.sleep(0.5)
                continue
            if not written:
                self.fenced = True
                log.error("shard %s is no longer its group's primary (epoch %d): it acknowledges "
                          "nothing more", self.name, self.epoch)
                return
            for follower in leaving:
                if self.followers.get(id(follower.channel)) is follower:
                    del self.followers[id(follower.channel)]
                    log.warning("shard %s: follower on node %s left the in-sync set; acknowledging "
                                "with %d in-sync followers", self.name, follower.node, len(members))
            if leaving:
                self._released()


def _calling(store: IsrStore, members: List[str]) -> Tuple[bool, Optional[str]]:
    """``store(members)`` in a pool thread, its failure returned rather than
    raised (a raise there would be printed as a traceback by the pool)."""
    try:
        return store(members), None
    except Exception as err:   # etcd unreachable (CoordinationError), or its answer unreadable
        return False, str(err) or type(err).__name__
