"""The shard process: parse its arguments, make the shard, recover its log,
join its cluster (taking its group's record on etcd when replicated),
serve its socket and control socket until told to stop, and say what its
log and history did. Run with ``python -m queueserver.shard`` (the
supervisor does).

The one module that knows the shard and the parts that read it from
outside (the console's requests, the statistics' answer), so that they
import the shard and the shard imports none of them back.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Final, List, Optional

import gevent

from .. import memwatch
from ..cluster.clusterfile import ClusterSpec, ShardSpec, load_cluster
from ..lifecycle import (EXIT_DEPOSED, EXIT_REFUSED, die_with_supervisor, raise_descriptor_limit, settle_gc,
                         setup_logging, stop_event)
from ..metrics.control import control_path, serve_control
from ..net import linkauth
from ..net.handoff import handoff_path
from ..net.tls import DEFAULT_HANDSHAKE_TIMEOUT, TLSFiles
from ..store import StoreError
from ..store.writer import SLOW_SYNC_MS
from .clustering import ShardInCluster
from .console import ShardConsole
from .durability import Durability
from .hostids import HostIds
from .shard import Shard

log: Final = logging.getLogger("queueserver.shard")


def take_group(durability: Durability, spec: ClusterSpec, ordinal: int, node: str, copy: bool) -> None:
    """A replicated cluster on etcd: say in the group's record that this node
    is its primary, with no follower in sync yet, and take its epoch (never
    older than the newest its log holds: a record lost with etcd starts
    again past it); its log's records and its stream's frames carry it from
    now on. Deposed if another node is the primary."""
    replicator = durability.replicator
    assert replicator is not None   # a replicated cluster's shard
    if spec.etcd is None:
        return
    from ..cluster.coordination import CoordinationError, Etcd   # etcd's client: only where it is used
    from ..cluster.groups import isr_store, take_primary
    etcd = Etcd(spec.etcd)
    while True:
        try:
            epoch = take_primary(etcd, ordinal, node, copy, durability.wal.epoch)
            break
        except CoordinationError as err:
            log.warning("shard %d: etcd does not answer (%s); waiting to take the group's record",
                        ordinal, err)
            time.sleep(1.0)
    replicator.epoch = durability.wal.epoch = epoch
    replicator.isr_store = isr_store(etcd, ordinal, node, epoch)
    log.info("shard %d is its group's primary at epoch %d%s", ordinal, epoch,
             " (serving its copy on this node)" if copy else "")


def main(argv: Optional[List[str]] = None) -> None:
    die_with_supervisor()   # first: a supervisor gone before we run must not leave us behind
    parser = argparse.ArgumentParser(prog="queueserver-shard")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--max-queues", type=int, default=None,
                        help="queues this shard may hold (default: no cap)")
    parser.add_argument("--queue-idle-timeout", type=float, default=0.0, metavar="SECONDS",
                        help="remove a queue with no jobs and no waiters after this long (0: never)")
    parser.add_argument("--shards", type=int, default=1, help="how many shards the server runs")
    parser.add_argument("--direct-path", action="store_true",
                        help="take client connections that routers hand over")
    parser.add_argument("--data-dir", metavar="DIR", help="this shard's log directory (default: none, "
                                                          "jobs live in memory only)")
    parser.add_argument("--fsync", choices=("always", "interval", "never"), default="always")
    parser.add_argument("--fsync-interval", type=float, default=1000.0, metavar="MS")
    parser.add_argument("--fsync-in-loop", type=float, default=SLOW_SYNC_MS, metavar="MS")
    parser.add_argument("--compact-after-bytes", type=int, default=64 << 20, metavar="BYTES")
    parser.add_argument("--no-metrics", action="store_true",
                        help="count nothing for /metrics (spares the per-event hooks)")
    parser.add_argument("--cluster", metavar="FILE", help="the cluster file (with --node)")
    parser.add_argument("--node", metavar="NAME", help="this shard's node in the cluster file")
    parser.add_argument("--ordinal", type=int, metavar="N",
                        help="serve the cluster's shard N from this node's copy of it (a follower "
                             "promoted when N's primary failed), instead of --index of this node")
    parser.add_argument("--numbers", metavar="FILE",
                        help="the server's file of job number blocks (default: numbers of this "
                             "shard's residue class)")
    parser.add_argument("--history-dir", metavar="DIR",
                        help="write the job history (JSON Lines) here (default: none)")
    parser.add_argument("--history-max-bytes", type=int, metavar="BYTES",
                        help="keep this shard's history files within BYTES (default: any size)")
    parser.add_argument("--history-max-age", type=float, metavar="SECONDS",
                        help="drop history files last written more than SECONDS ago (default: never)")
    parser.add_argument("--history-checkpoint", metavar="PATH",
                        help="the checkpoint of `queueserver history`: dropping a file it has not "
                             "read is a warning")
    parser.add_argument("--host-ids-fd", type=int, metavar="FD",
                        help="the memory file of the host's job ids, which the supervisor shares with "
                             "every shard (default: ids are claimed at their homes by messages)")
    parser.add_argument("--access", metavar="FILE",
                        help="the access file: connections moved here are checked against it")
    parser.add_argument("--tls-certificate", metavar="FILE",
                        help="terminate TLS connections the routers hand over with this certificate")
    parser.add_argument("--tls-key", metavar="FILE")
    parser.add_argument("--tls-client-ca", metavar="FILE")
    parser.add_argument("--tls-handshake-timeout", type=float, default=DEFAULT_HANDSHAKE_TIMEOUT,
                        metavar="SECONDS")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, f"shard-{args.index}")
    raise_descriptor_limit()
    cluster: Optional[ShardInCluster] = None
    try:
        if args.cluster:
            spec = load_cluster(args.cluster)
            if args.ordinal is not None:   # a copy taken over: served where this node serves copies
                home = spec.shards()[args.ordinal]
                me = ShardSpec(home.ordinal, home.node, home.index, *spec.address(args.node, home.ordinal))
            else:
                me = spec.shards_of(args.node)[args.index]
            cluster = ShardInCluster(spec, me, linkauth.load_secret(spec.secret_file))
            cluster.node = args.node
        shard = Shard(args.index, args.socket, args.max_queues, args.queue_idle_timeout, args.shards,
                      args.direct_path, args.data_dir, args.fsync, args.fsync_interval,
                      args.compact_after_bytes, args.history_dir, cluster,
                      {"max_bytes": args.history_max_bytes, "max_age": args.history_max_age,
                       "checkpoint": args.history_checkpoint}, args.numbers,
                      HostIds(args.host_ids_fd) if args.host_ids_fd is not None else None, args.fsync_in_loop)
        if args.access is not None:
            shard.direct.use_access(args.access)
        if args.tls_certificate is not None and args.tls_key is not None:
            shard.direct.use_tls(TLSFiles(args.tls_certificate, args.tls_key, args.tls_client_ca),
                                 args.tls_handshake_timeout)
        if args.access is not None or args.tls_certificate is not None:
            gevent.signal_handler(signal.SIGHUP, shard.direct.reload)   # the supervisor passes SIGHUP on
        if shard.durability is not None:
            shard.recover()
        if cluster is not None:
            assert shard.cluster_ops is not None   # a cluster's shard has them
            shard.cluster_ops.join()
            cluster.bind()
            if shard.durability is not None and shard.durability.replicator is not None:
                try:
                    take_group(shard.durability, cluster.spec, cluster.me.ordinal, args.node,
                               args.ordinal is not None)
                except ValueError as err:   # groups.Deposed: another node was promoted meanwhile
                    log.warning("shard %d does not start here: %s", cluster.me.ordinal, err)
                    sys.exit(EXIT_DEPOSED)
    # a bad access file or TLS file (ValueError), a damaged or unusable log, a bad cluster file, secret or cert
    except (StoreError, ValueError, OSError) as err:
        log.error("shard %d cannot start: %s", args.index, err)
        with open(args.socket + ".refused", "w") as f:
            f.write(str(err))   # for the supervisor's one line
        sys.exit(EXIT_REFUSED)
    if not args.no_metrics:
        shard.stats.attach(shard.engine)   # from here on; replaying the log counted nothing
    serve_control(control_path(args.socket), lambda: shard.stats.snapshot(shard), ShardConsole(shard).handle,
                  shard.homes.cluster_view)
    stop = stop_event()
    settle_gc()
    memwatch.start(f"shard-{args.index}")
    server = gevent.spawn(shard.serve)
    server.link(lambda g: stop.set())
    stop.wait()
    shard.say_stopping()
    server.kill()
    shard.stop()
    if shard.history is not None:
        shard.history.close()
        log.info("shard %d history: %d records written, %d write errors", args.index,
                 shard.history.records, shard.history.write_errors)
    if shard.durability is not None:
        shard.durability.close()
        stats = shard.durability.stats()
        log.info("shard %d log: %d records appended, %d fsyncs, %d records fsynced (at most %d "
                 "in one), %d write errors, %d compactions, worst compaction pause %.1f ms; "
                 "%d fsyncs in a thread (fsync_in_loop %g ms)",
                 args.index, stats["appended_records"], stats["fsyncs"], stats["fsynced_records"],
                 stats["max_records_per_fsync"], stats["write_errors"], stats["compactions"],
                 stats["worst-compaction-pause-ms"], stats["pooled_fsyncs"], args.fsync_in_loop)
    for path in (args.socket, handoff_path(args.socket), args.socket + ".ready", control_path(args.socket)):
        if os.path.exists(path):
            os.unlink(path)
    log.info("shard %d exiting", args.index)
