"""A follower: a copy of another node's shard, kept from its primary's stream.

The process a node's supervisor runs for each shard of another node that
the cluster file's ``replicas`` places on it (``ClusterSpec.followers_of``).
It dials the primary's link port like any router (TLS, then the HMAC
handshake), asks for the stream (:mod:`.replication`), and keeps what it
gets as a shard log of its own, in ``DATA/replicas/<ordinal>/``, in the
same format as the primary's (its ordinal of the cluster's 250, so the copy
is what that shard recovers from),
compacted the same way. Each "rec" frame's events are applied to an engine
(the copy's live state, which compaction snapshots) and appended to the log;
once the log holds them under the fsync policy, the position is
acknowledged.

A new stream starts with the primary's live state: it is written into
``replicas/<ordinal>.new/`` and only once complete and on disk does it
replace the copy (two renames), so the copy is never a half-received state.
A lost link is dialled again, with backoff, and starts a new stream.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from typing import Any, List, Optional

import gevent
from gevent import socket

from ..cluster.clusterfile import MAX_SHARDS, ClusterSpec, ShardSpec, load_cluster
from ..engine import Engine
from ..lifecycle import die_with_supervisor, settle_gc, setup_logging, stop_event
from ..net import faults, linkauth
from ..net.channel import FrameChannel
from ..store import StoreError
from ..store.segments import newest_epoch
from ..store.writer import SLOW_SYNC_MS
from .durability import Durability

log = logging.getLogger("queueserver.follower")

#: Seconds between dials of an unreachable primary (doubling up to the last).
BACKOFF = (0.2, 0.5, 1.0, 2.0)


class Copy:
    """The follower's copy of one shard: a log (and its engine) in ``directory``."""

    def __init__(self, directory: str, primary: ShardSpec, fsync: str, compact_after_bytes: int,
                 fsync_in_loop_ms: float = SLOW_SYNC_MS) -> None:
        self.directory = directory
        self.primary = primary
        self.fsync = fsync
        self.fsync_in_loop_ms = fsync_in_loop_ms
        self.compact_after_bytes = compact_after_bytes
        self.engine: Optional[Engine] = None
        self.durability: Optional[Durability] = None
        self.position = -1          # the primary's position the copy holds durably
        self._incoming: Optional[Durability] = None   # a snapshot being received
        self._appended = -1         # the position of what was appended (durable or not)
        self._committed = -1
        self._live = False          # this stream's snapshot is in place: its records apply
        #: the newest epoch of the copy kept on disk (a follower restarted refuses older streams)
        self._kept_epoch = newest_epoch(directory, primary.ordinal, MAX_SHARDS)

    def _log(self, directory: str) -> Durability:
        return Durability(directory, self.primary.ordinal, MAX_SHARDS, self.fsync, 1000.0,
                          self.compact_after_bytes, self.fsync_in_loop_ms)

    def _engine(self) -> Engine:
        return Engine(shard=self.primary.ordinal, shards=MAX_SHARDS)

    # -------------------------------------------------------- a new stream
    @property
    def epoch(self) -> int:
        """The newest epoch the copy's log holds records of (0: none)."""
        return self.durability.wal.epoch if self.durability is not None else self._kept_epoch

    def snapshot_part(self, base: int, events: List[Any], last: bool, epoch: int) -> bool:
        """A part of the primary's live state (its stream's ``epoch``); True once the last is in place."""
        new = self.directory + ".new"
        if self._incoming is None:
            shutil.rmtree(new, ignore_errors=True)
            self._incoming = self._log(new)
            self._incoming.recover(self._engine())   # an empty log, opened for writing
        wal = self._incoming.wal
        wal.epoch = epoch
        for event in events:
            wal.append(event)
        if not last:
            return False
        incoming, self._incoming = self._incoming, None
        incoming.wal.sync()    # every record on disk before the copy is replaced
        incoming.close()
        self.close()
        old = self.directory + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(self.directory):
            os.rename(self.directory, old)
        os.rename(new, self.directory)
        shutil.rmtree(old, ignore_errors=True)
        self.engine = self._engine()
        self.durability = self._log(self.directory)
        self.durability.recover(self.engine)
        self.position = self._appended = self._committed = base
        self._live = True
        return True

    def abandon_snapshot(self) -> None:
        """A new stream starts: what an earlier one's unfinished snapshot
        brought is not the state of any instant (the new snapshot starts
        afresh), and nothing is acknowledged on the new stream before its
        own snapshot is in place (a position an earlier stream left
        unacknowledged would tell the primary its snapshot is held)."""
        if self._incoming is not None:
            self._incoming.close()
            self._incoming = None
        self._live = False

    # ------------------------------------------------------- the stream
    def apply(self, upto: int, events: List[Any], epoch: int) -> None:
        engine, durability = self.engine, self.durability
        if engine is None or durability is None or not self._live:
            raise StoreError("events before the live state")   # the stream is broken: dial again
        events = [_as_tuples(event) for event in events]   # as a log's reader gives them
        engine.replay(events)
        durability.wal.epoch = epoch
        append = durability.wal.append
        for event in events:
            append(event)
        self._appended = upto

    def commit(self, acknowledge: Any) -> None:
        """Once the log holds everything appended: ``acknowledge(position)``."""
        durability = self.durability
        if durability is None or not self._live or self._appended <= self._committed:
            return
        upto = self._committed = self._appended

        def done(error: Optional[BaseException]) -> None:
            if error is not None:
                log.error("shard %s's copy: log write failed: %s", self.primary.name, error)
                return   # unacknowledged: the primary drops this follower, which resyncs
            self.position = max(self.position, upto)
            acknowledge(upto)

        durability.wal.commit(done)
        assert self.engine is not None
        durability.maybe_compact(self.engine)

    def close(self) -> None:
        if self._incoming is not None:
            self._incoming.close()
            self._incoming = None
        if self.durability is not None:
            self.durability.close()
            self.durability = None
        self.engine = None


def _as_tuples(value: Any) -> Any:
    """A frame's event (msgpack arrays decoded as lists) as the log's reader
    decodes it (tuples all the way down): the compiled engine's event types
    are tuples."""
    if isinstance(value, list):
        return tuple(_as_tuples(item) for item in value)
    return value


class Follower:
    """The dialling loop: one stream at a time from the primary."""

    def __init__(self, spec: ClusterSpec, node: str, primary: ShardSpec, copy: Copy) -> None:
        self.spec = spec
        self.node = node
        self.primary = primary
        self.copy = copy
        self.secret, self.tls = linkauth.client_credentials(spec.secret_file, spec.tls)
        # Where the group's primary may be: its home, or a node that took it
        # over (never this node's own address: it is not the primary while it follows).
        mine = spec.address(node, primary.ordinal)
        self.addresses = [a for a in spec.candidates(primary.ordinal) if a != mine]
        self._at = 0
        self._channel: Optional[FrameChannel] = None
        #: the highest epoch a stream came with, or the copy's log holds: older ones are refused
        self.epoch = copy.epoch

    def run(self) -> None:
        if faults.CUT_OFF_FILE is not None:
            gevent.spawn(faults.watch, self._cut)
        failures = 0
        while True:
            host, port = self.addresses[self._at]
            try:
                self._stream(host, port)
                failures = 0
            except (OSError, linkauth.LinkAuthError, StoreError, ValueError) as err:
                if failures % len(self.addresses) == 0 and failures < 3 * len(self.addresses):
                    log.warning("following shard %s at %s:%d: %s; dialling again", self.primary.name,
                                host, port, err)
                failures += 1
                self._at = (self._at + 1) % len(self.addresses)   # the primary may have moved
            gevent.sleep(BACKOFF[min(failures // len(self.addresses), len(BACKOFF) - 1)])

    def _check(self, epoch: int) -> None:
        if epoch < self.epoch:
            raise ValueError(f"a stream of epoch {epoch}, older than {self.epoch}: a deposed primary")
        self.epoch = epoch

    def _cut(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def _stream(self, host: str, port: int) -> None:
        if faults.cut_off():
            raise faults.CutOff()
        sock = socket.create_connection((host, port), timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = linkauth.connect_link(sock, self.secret, self.tls)
        sock.settimeout(None)
        channel = self._channel = FrameChannel(sock)
        copy = self.copy
        copy.abandon_snapshot()
        channel.send([0, "replicate", [self.node]])

        def acknowledge(upto: int) -> None:
            channel.send([0, "ack", upto])

        def handle(frame: Any) -> None:
            try:
                take(frame)
            except Exception as err:   # a frame not applied: the copy would miss it; start over
                log.warning("following shard %s: %s: %s; leaving this stream (a new one starts "
                            "from the live state)", self.primary.name, type(err).__name__, err)
                channel.close()

        def take(frame: Any) -> None:
            if frame[0] != 0:
                return
            op, args = frame[1], frame[2]
            if op == "rec":
                self._check(args[2])
                copy.apply(args[0], args[1], args[2])
            elif op == "snap":
                self._check(args[3])
                if copy.snapshot_part(args[0], args[1], args[2], args[3]):
                    log.info("following shard %s: the live state is in place at position %d",
                             self.primary.name, args[0])
                    acknowledge(args[0])

        try:
            channel.receive(handle, lambda: copy.commit(acknowledge))
        finally:
            channel.close()
        raise ConnectionError("the primary closed the stream")


def main(argv: Optional[List[str]] = None) -> None:
    die_with_supervisor()
    parser = argparse.ArgumentParser(prog="queueserver-follower")
    parser.add_argument("--cluster", required=True, metavar="FILE")
    parser.add_argument("--node", required=True, metavar="NAME", help="this node")
    parser.add_argument("--ordinal", type=int, required=True, help="the shard followed")
    parser.add_argument("--data-dir", required=True, metavar="DIR", help="where the copy's log lives")
    parser.add_argument("--fsync", choices=("always", "interval", "never"), default="always")
    parser.add_argument("--fsync-in-loop", type=float, default=SLOW_SYNC_MS, metavar="MS")
    parser.add_argument("--compact-after-bytes", type=int, default=64 << 20, metavar="BYTES")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, f"follower-{args.ordinal}")
    try:
        spec = load_cluster(args.cluster)
        primary = spec.shards()[args.ordinal]
        copy = Copy(args.data_dir, primary, args.fsync, args.compact_after_bytes, args.fsync_in_loop)
        follower = Follower(spec, args.node, primary, copy)
    except (ValueError, OSError, IndexError) as err:
        log.error("follower of shard %d cannot start: %s", args.ordinal, err)
        sys.exit(2)
    log.info("following shard %s (ordinal %d) at %s:%d into %s", primary.name, primary.ordinal,
             primary.host, primary.port, args.data_dir)
    stop = stop_event()
    settle_gc()
    runner = gevent.spawn(follower.run)
    runner.link(lambda g: stop.set())
    stop.wait()
    runner.kill()
    copy.close()
    log.info("follower of shard %s exiting at position %d", primary.name, copy.position)


if __name__ == "__main__":
    main()
