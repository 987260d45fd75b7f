"""The supervisor: binds the client ports, starts the shard and router
processes, restarts any that dies, and stops them all on SIGTERM/SIGINT.
In a replicated cluster on etcd, which processes it runs for each shard
group (and when its primaries must stop) is :mod:`.cluster.failover`'s to say.

It runs no event loop and touches no client traffic. It owns the listening
sockets and hands them to every router, so several routers share the ports
(the kernel gives each new connection to one of them) and a restarted router
serves the very same ports. Routers and shards talk over Unix sockets in a
private runtime directory (mode 0700, sockets 0600: :mod:`.runtimedir`)
that the supervisor locks for its whole life. A failure to start is a
:class:`StartupError`: one line for the operator, raised before anything
another server uses is touched.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from .cluster.clusterfile import ClusterError, ClusterSpec, load_cluster
from .config import DEFAULT_METRICS_PORT, Config
from .net import linkauth
from .protocols import DEFAULT_PORTS
from .datadir import DataDir, LayoutError
from .cluster.roles import FOLLOWER, PRIMARY_COPY, PRIMARY_HOME
from .lifecycle import EXIT_DEPOSED, EXIT_REFUSED, SUPERVISOR_PID, python_command
from .listening import BindError, bind_failure, bind_listeners, tls_protocol
from .jobnumbers import FILE_NAME as NUMBERS_FILE
from .runtimedir import RuntimeDir, RuntimeDirError

if TYPE_CHECKING:   # imported where used (etcd's client, prometheus_client: only when needed), or types
    from .cluster.coordination import Membership
    from .cluster.failover import Failover
    from .cluster.resumer import Resumer
    from .cluster.watch import ClusterWatch
    from .console.http import NodeMetrics
    from .router.config import ClusterPlace, RouterConfig, TLSSettings

log = logging.getLogger("queueserver.supervisor")

STOP_GRACE = 5.0
MAX_BACKOFF = 5.0


def own_index(cluster: ClusterSpec, node: str, ordinal: int) -> int:
    """Shard ``ordinal``'s index on ``node`` (0 for another node's shard)."""
    return next((s.index for s in cluster.shards_of(node) if s.ordinal == ordinal), 0)


class Child:
    """One supervised process and its restart bookkeeping."""

    def __init__(self, name: str, argv: List[str], pass_fds: Tuple[int, ...] = ()) -> None:
        self.name = name
        self.argv = argv
        self.pass_fds = pass_fds
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.backoff = 0.1
        self.restart_at = 0.0
        self.started_at = 0.0
        #: not restarted while set (a primary stopped because its node lost its etcd lease)
        self.held = False

    def start(self) -> None:
        # Its own process group: a terminal's Ctrl-C reaches only the
        # supervisor, which then stops the children in order. It learns our
        # pid, to die with us (lifecycle.die_with_supervisor).
        env = dict(os.environ, **{SUPERVISOR_PID: str(os.getpid())})
        self.process = subprocess.Popen(self.argv, process_group=0, pass_fds=self.pass_fds, env=env)
        self.started_at = time.monotonic()
        log.info("%s started (pid %d)", self.name, self.process.pid)


class StartupError(Exception):
    """The server cannot start; ``str()`` is one line saying why and what to change."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class Supervisor:
    def __init__(self, config: Config, listeners: Optional[Dict[str, socket.socket]] = None) -> None:
        """``listeners``: the client ports, if already bound (see :mod:`.listening`)."""
        self.config = config
        self.children: List[Child] = []
        self._stopping = False
        self._reload = False
        self.runtime = RuntimeDir(config.runtime_dir)
        self.data: Optional[DataDir] = (DataDir(config.data_dir)
                                        if config.durable and config.data_dir is not None else None)
        self.listeners: Dict[str, socket.socket] = dict(listeners or {})
        #: the memory file of the host's job ids its shards share (one host only)
        self.host_ids_fd: Optional[int] = None
        self._failure: Optional[StartupError] = None   # a child that must not be restarted
        #: in a cluster: the cluster file and this node's entry (None: one host)
        self.cluster: Optional[ClusterSpec] = None
        self.metrics: Optional[NodeMetrics] = None   # the HTTP port of /metrics and /status (None: off)
        #: this node's lease in etcd (a cluster file with [etcd] only)
        self.membership: Optional[Membership] = None
        #: a replicated cluster on etcd: what this node runs in each shard group, its failover and fencing
        self.failover: Optional[Failover] = None
        #: a cluster on etcd: the watch that tells this node's routers where slots and primaries are
        self.cluster_watch: Optional[ClusterWatch] = None
        #: a cluster on etcd: the watch that finishes slot moves whose driver died
        self.resumer: Optional[Resumer] = None

    @property
    def runtime_dir(self) -> str:
        return self.runtime.path

    def _children(self) -> List[Child]:
        config = self.config
        python = python_command()
        level = config.log_level
        sockets = [self.runtime.file(f"shard-{i}.sock") for i in range(config.shards)]
        place: Optional[ClusterPlace] = None
        if self.cluster is not None:
            assert config.node is not None   # _join_cluster refuses a cluster without --node
            place = {"file": self.cluster.path, "node": config.node}
        placement = (["--cluster", place["file"], "--node", place["node"]] if place is not None
                     else ["--numbers", self._numbers_file(), "--host-ids-fd", str(self._host_ids())])
        children = [Child(f"shard-{i}", [*python, "-m", "queueserver.shard", "--index", str(i),
                                         "--socket", path, "--max-queues", str(config.shard_max_queues()),
                                         "--queue-idle-timeout", repr(config.queue_idle_timeout),
                                         "--shards", str(config.shards), "--log-level", level]
                          + (["--direct-path"] if config.direct_path else [])
                          + self._access_args() + self._shard_tls_args()
                          + ([] if config.metrics.enabled else ["--no-metrics"])
                          + (["--data-dir", self.data.shard_dir(i), "--fsync", config.fsync,
                              "--fsync-interval", repr(config.fsync_interval),
                              "--fsync-in-loop", repr(config.fsync_in_loop),
                              "--compact-after-bytes", str(config.compact_after_bytes)]
                             if self.data else [])
                          + (["--history-dir", self.data.history_dir(i), *config.history_shard_args()]
                             if self.data is not None and config.keeps_history else [])
                          + placement)
                    for i, path in enumerate(sockets)]
        if self.cluster is not None and self.cluster.replicas and self.data is not None:
            assert config.node is not None
            roles = self.failover.roles if self.failover is not None else {   # without etcd: no failover
                shard.ordinal: FOLLOWER for shard in self.cluster.shards()
                if config.node in self.cluster.followers_of(shard.ordinal)}
            own = {shard.ordinal: shard.index for shard in self.cluster.shards_of(config.node)}
            children = [child for i, child in enumerate(children)
                        if roles.get(self.cluster.shards_of(config.node)[i].ordinal, PRIMARY_HOME) == PRIMARY_HOME]
            for ordinal, role in sorted(roles.items()):
                if role != PRIMARY_HOME:
                    children.append(self._group_child(ordinal, role, own.get(ordinal, 0)))
        fds = {name: sock.fileno() for name, sock in self.listeners.items()}
        plain = {name: fd for name, fd in fds.items() if tls_protocol(name) is None}
        over_tls = {protocol: fd for protocol, fd in ((tls_protocol(name), fd) for name, fd in fds.items())
                    if protocol is not None}
        tls = self._tls_settings()
        # Every child holds the directories' locks too, so that they stay
        # locked while any process of this server lives (a next server waits
        # for the last one, rather than opening a log that one still writes).
        locks = tuple(fd for fd in (self.runtime.lock_fd, self.data.lock_fd if self.data else None)
                      if fd is not None)
        shared = locks if place is not None else locks + (self._host_ids(),)
        for child in children:
            child.pass_fds = shared
        for i in range(config.routers):
            router_config: RouterConfig = {
                "sockets": sockets,
                "listen_fds": plain,
                "tls_fds": over_tls,
                "options": config.router_options(),
                "limits": config.limits(),
                "direct_path": config.direct_path,
                "history": config.keeps_history,
                "index": i,
                "routers": config.routers,
                "ready_file": self.runtime.file(f"router-{i}.ready"),
                "control": self.runtime.file(f"router-{i}.ctl"),   # for /metrics
            }
            access = config.access_file()
            if access is not None:
                router_config["access"] = access
            if tls is not None:
                router_config["tls"] = tls
            if place is not None:
                router_config["cluster"] = place
            else:
                router_config["numbers"] = self._numbers_file()
            name = "router" if config.routers == 1 else f"router-{i}"
            children.append(Child(name, [*python, "-m", "queueserver.router",
                                         "--config", json.dumps(router_config), "--log-level", level],
                                  pass_fds=tuple(fds.values()) + locks))
        return children

    def _access_args(self) -> List[str]:
        """A shard's access file: it checks the requests of connections moved to it."""
        access = self.config.access_file()
        return ["--access", access] if access is not None else []
    def _shard_tls_args(self) -> List[str]:
        """A shard's TLS files: with the direct path, the routers hand it TLS
        connections before their handshake, and it terminates them."""
        settings = self._tls_settings() if self.config.direct_path else None
        if settings is None:
            return []
        return ["--tls-certificate", settings["certificate"], "--tls-key", settings["key"],
                "--tls-handshake-timeout", repr(settings["handshake_timeout"])] \
            + (["--tls-client-ca", settings["client_ca"]] if settings["client_ca"] else [])

    def _tls_settings(self) -> Optional[TLSSettings]:
        """What the routers need to serve TLS (None when no port speaks it)."""
        config = self.config
        if not config.speaks_tls:
            return None
        assert config.tls_certificate is not None and config.tls_key is not None   # Config.check_tls
        return {"certificate": os.path.abspath(config.tls_certificate), "key": os.path.abspath(config.tls_key),
                "client_ca": os.path.abspath(config.tls_client_ca) if config.tls_client_ca else None,
                "handshake_timeout": config.tls_handshake_timeout}

    def _check_tls(self) -> None:
        """The TLS files can be used, or the start ends in one line naming the one that cannot."""
        settings = self._tls_settings()
        if settings is None:
            return
        from .net.tls import TLSConfigError, TLSFiles, server_context
        try:
            server_context(TLSFiles(settings["certificate"], settings["key"], settings["client_ca"]))
        except TLSConfigError as err:
            raise StartupError(str(err)) from None

    def _host_ids(self) -> int:
        """The memory file of this host's job ids, made once and kept open
        while the server runs: a shard that restarts finds its table there
        (see :mod:`.shard.hostids`)."""
        if self.host_ids_fd is None:
            from .shard.hostids import HostIds
            self.host_ids_fd = HostIds.create()
        return self.host_ids_fd

    def _group_child(self, ordinal: int, role: str, index: int) -> Child:
        """The process of this node's role in shard ``ordinal``'s group other
        than its own shard: a follower keeping the copy, or the shard served
        from that copy (a primary by failover)."""
        config, cluster, data = self.config, self.cluster, self.data
        assert cluster is not None and data is not None and config.node is not None
        copy = os.path.join(data.path, "replicas", str(ordinal))
        common = ["--cluster", cluster.path, "--node", config.node, "--data-dir", copy,
                  "--fsync", config.fsync, "--fsync-in-loop", repr(config.fsync_in_loop),
                  "--compact-after-bytes", str(config.compact_after_bytes),
                  "--log-level", config.log_level]
        python = python_command()
        if role == FOLLOWER:
            return Child(f"follower-{ordinal}", [*python, "-m", "queueserver.shard.follower",
                                                 "--ordinal", str(ordinal), *common])
        return Child(f"takeover-{ordinal}", [
            *python, "-m", "queueserver.shard", "--index", str(index), "--ordinal", str(ordinal),
            "--socket", self.runtime.file(f"takeover-{ordinal}.sock"),
            "--max-queues", str(config.shard_max_queues()),
            "--queue-idle-timeout", repr(config.queue_idle_timeout),
            "--fsync-interval", repr(config.fsync_interval), *common, *self._access_args(),
            *self._shard_tls_args()]
            + ([] if config.metrics.enabled else ["--no-metrics"]))

    def _coordinate(self) -> None:
        """A replicated cluster on etcd: before any process starts, read each
        group's record and so what this node runs in each (etcd must answer)."""
        cluster = self.cluster
        if cluster is None or not cluster.replicas or cluster.etcd is None:
            return
        from .cluster.coordination import AuthenticationError   # etcd's client: only where it is used
        from .cluster.failover import Failover
        assert self.config.node is not None
        try:
            self.failover = Failover.coordinate(cluster, self.config.node, lambda: self._stopping)
        except AuthenticationError as err:   # etcd came back, and refuses the file's credentials
            raise StartupError(str(err)) from None

    def _watch_cluster(self) -> None:
        """A cluster on etcd: its routers follow the slot map and primaries
        etcd holds, and its shards the primaries, as this thread tells them
        on their control sockets (they have no etcd client)."""
        if self.cluster is not None and self.cluster.etcd is not None:
            from .cluster.watch import ClusterWatch
            self.cluster_watch = ClusterWatch(self.cluster.etcd, self._control_sockets).start()

    def _control_sockets(self) -> List[str]:
        """Every control socket of this node's processes now: its routers',
        its shards' and those of the copies it serves (``takeover-<ordinal>``)."""
        try:
            names = os.listdir(self.runtime.path)
        except OSError:
            return []
        return [self.runtime.file(name) for name in sorted(names) if name.endswith(".ctl")]

    def _take_over(self) -> None:
        """Promotions the failover watch won: stop the follower, serve its copy."""
        if self.failover is None:
            return
        for ordinal in self.failover.promotions():
            follower = next((c for c in self.children if c.name == f"follower-{ordinal}"), None)
            if follower is not None:
                if follower.process is not None and follower.process.poll() is None:
                    follower.process.terminate()
                self._reap(follower, time.monotonic() + STOP_GRACE)
                self.children.remove(follower)
            self.failover.runs(ordinal, PRIMARY_COPY)
            assert self.cluster is not None and self.config.node is not None
            own = {s.ordinal: s.index for s in self.cluster.shards_of(self.config.node)}
            child = self._group_child(ordinal, PRIMARY_COPY, own.get(ordinal, 0))
            self.children.append(child)
            child.start()

    def _ready_files(self) -> List[str]:
        """What says every router and every shard this node serves is ready
        (a replicated node's shards are as etcd planned them: they may change)."""
        ready = [self.runtime.file(f"router-{i}.ready") for i in range(self.config.routers)]
        ready += [self.runtime.file(f"{c.name}.sock.ready") for c in self.children
                  if c.name.startswith(("shard-", "takeover-"))]
        return ready

    def _replan(self, child: Child) -> bool:
        """A shard that found another node its group's primary (a promotion
        raced this node's start): run what etcd says for that group instead."""
        cluster, node, failover = self.cluster, self.config.node, self.failover
        if cluster is None or node is None or failover is None:
            return False
        own = {s.index: s.ordinal for s in cluster.shards_of(node)}
        name = child.name
        ordinal = own.get(int(name[6:]), -1) if name.startswith("shard-") else int(name.split("-")[1])
        role = failover.replan(ordinal)
        if role is None:
            return False   # restarted as usual; it finds out again
        self.children.remove(child)
        fresh = self._group_child(ordinal, role, own_index(cluster, node, ordinal))
        self.children.append(fresh)
        fresh.start()
        failover.runs(ordinal, role)
        return True

    def _fence(self) -> None:
        """A node whose etcd lease may have lapsed must not acknowledge as a
        primary: its primaries stop (SIGKILL) before the lease's TTL is over,
        and run again only if etcd still names this node once the lease is back
        (see :mod:`.cluster.failover`)."""
        membership, cluster, failover = self.membership, self.cluster, self.failover
        if membership is None or failover is None or cluster is None:
            return
        primaries = [c for c in self.children if c.name.startswith(("shard-", "takeover-"))]
        if failover.silent(membership):
            if not failover.fenced:
                failover.fence(membership)
                for child in primaries:
                    child.held = True
                    if child.process is not None and child.process.poll() is None:
                        child.process.kill()
            return
        if failover.fenced and membership.registered.is_set():
            changed = failover.lease_back()
            if changed is None:
                return   # etcd cannot be read yet
            assert self.config.node is not None
            own = {s.ordinal: s.index for s in cluster.shards_of(self.config.node)}
            by_name = {c.name: c for c in self.children}
            for ordinal, role in changed.items():
                for name in (f"shard-{own.get(ordinal, -1)}", f"takeover-{ordinal}", f"follower-{ordinal}"):
                    old = by_name.get(name)
                    if old is not None:
                        self._reap(old, time.monotonic() + STOP_GRACE)
                        self.children.remove(old)
                if role != PRIMARY_HOME:
                    fresh = self._group_child(ordinal, role, own.get(ordinal, 0))
                    self.children.append(fresh)
                    fresh.start()
            for child in self.children:
                child.held = False
            failover.resume()

    def _numbers_file(self) -> str:
        """Where the shards take blocks of job numbers: the data directory's
        file, or (jobs in memory only) a fresh one in the runtime directory."""
        return self.data.numbers_file() if self.data is not None else self.runtime.file(NUMBERS_FILE)

    def _join_cluster(self) -> None:
        """Take this node's shards, addresses and ports from the cluster file
        (flags and the config file still choose where they differ from the
        defaults)."""
        config = self.config
        assert config.cluster is not None   # run() joins only with --cluster
        try:
            spec = load_cluster(config.cluster)
            if config.node is None:
                raise ClusterError(f"--cluster needs --node: which of the nodes of {config.cluster} "
                                   f"({', '.join(n.name for n in spec.nodes)}) this server is")
            node = spec.node(config.node)
            linkauth.load_secret(spec.secret_file)   # checked here: one line, before any child
            if spec.etcd is not None and spec.etcd.password_file is not None:
                from .cluster.etcdlogin import load_password   # etcd's client: only where it is used
                load_password(spec.etcd.password_file)
            if spec.tls is not None:
                linkauth.server_context(spec.tls.cert, spec.tls.key, spec.tls.ca)
                linkauth.client_context(spec.tls.cert, spec.tls.key, spec.tls.ca)
        except (ClusterError, linkauth.SecretError, linkauth.TLSConfigError) as err:
            raise StartupError(str(err)) from None
        if node.removed:
            raise StartupError(f"node {node.name} is marked removed in {spec.path}; its slots went to "
                               f"other nodes (remove the mark and run `queueserver cluster add-node` "
                               f"to bring it back)")
        if not config.durable:
            raise StartupError("a cluster node needs a data directory (--data-dir): which slots its "
                               "shards own is kept in their logs")
        if "shards" in config.explicit and config.shards != node.shards:
            raise StartupError(f"node {node.name} has {node.shards} shards in {spec.path}, not "
                               f"{config.shards}; drop --shards (the cluster file decides)")
        self._check_etcd_login(spec)
        config.shards = node.shards
        config.explicit.add("shards")
        if "bind" not in config.explicit:
            config.bind = node.bind or node.host
        for name, port in node.ports.items():
            if config.listeners[name].port == DEFAULT_PORTS[name]:
                config.listeners[name].port = port
        if node.metrics_port is not None and config.metrics.port == DEFAULT_METRICS_PORT:
            config.metrics.port = node.metrics_port
        self.cluster = spec
        log.info("node %s of cluster %s: %d shards, shard links on %s:%d..%d", node.name, spec.path,
                 node.shards, node.host, node.link_port, node.link_port + node.shards - 1)

    def _check_etcd_login(self, spec: ClusterSpec) -> None:
        """Credentials that etcd refuses stop the start, in one line, before
        any process; an etcd that does not answer yet does not (the node
        starts and registers once it does)."""
        if spec.etcd is None or spec.etcd.user is None:
            return
        from .cluster.coordination import AuthenticationError, CoordinationError, Etcd
        etcd = Etcd(spec.etcd)
        try:
            etcd.log_in()
        except AuthenticationError as err:
            raise StartupError(str(err)) from None
        except CoordinationError as err:
            log.warning("etcd does not answer (%s); its credentials are checked once it does", err)
        finally:
            etcd.close()

    def _bind(self) -> None:
        """Bind and listen on every enabled protocol's port (unless the
        command line did already); every port that cannot be had is named in
        one line."""
        if not self.listeners:
            try:
                self.listeners = bind_listeners(self.config)
            except BindError as err:
                raise StartupError(str(err)) from None

    def _bind_metrics(self) -> None:
        metrics = self.config.metrics
        if metrics.enabled:   # bound now, served from a thread once the children start
            from .console.http import node_metrics
            from .access import AccessError
            from .net.tls import TLSConfigError
            try:
                self.metrics = node_metrics(self.config, self.runtime.file)
            except (TLSConfigError, AccessError) as err:
                raise StartupError(f"the HTTP port: {err}") from None
            except OSError as err:
                raise StartupError(bind_failure("metrics", metrics.bind or self.config.bind,
                                                 metrics.port, err)) from None

    def _close_listeners(self) -> None:
        for sock in self.listeners.values():
            sock.close()

    def _write_ports(self) -> None:
        """``ports.json``, once every router serves: the port each protocol got
        (useful with port 0; a TLS port is named ``<protocol>_tls``), and a
        sign that the server is ready."""
        ports: Dict[str, int] = {name: sock.getsockname()[1] for name, sock in self.listeners.items()}
        if self.metrics is not None:
            ports["metrics"] = self.metrics.port
        path = self.runtime.file("ports.json")
        with open(path + ".tmp", "w") as f:
            json.dump(ports, f)
        os.replace(path + ".tmp", path)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; :class:`StartupError` if it cannot start,
        having touched nothing another server could be using."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_reload)
        if self.config.cluster is not None:
            self._join_cluster()
        try:
            self._bind()   # first: a client connecting from now on waits in the backlog
            try:
                self.runtime.acquire()
            except RuntimeDirError as err:
                raise StartupError(str(err), err.status) from None
        except BaseException:
            self._close_listeners()
            raise
        try:
            if self.data is not None:
                try:
                    self.config.shards = self.data.acquire(self.config.shards,
                                                           "shards" in self.config.explicit,
                                                           history=self.config.keeps_history,
                                                           may_reshard=self.cluster is None)
                except (LayoutError, OSError) as err:
                    raise StartupError(str(err)) from None
                log.info("data directory %s, fsync %s", self.data.path, self.config.fsync)
            self._check_tls()
            self._bind_metrics()
            if self.data is None:
                log.warning("no data directory: jobs are kept in memory only and are lost when a "
                            "shard or the server stops (--data-dir DIR keeps them)")
            log.info("runtime directory %s, %d shards", self.runtime_dir, self.config.shards)
            for name, sock in self.listeners.items():
                log.info("%s listening on %s:%d", name, *sock.getsockname()[:2])
            self._coordinate()
            self._watch_cluster()
            self.children = self._children()
            for child in self.children:
                child.start()
            if self.metrics is not None:
                self.metrics.start()
            published = False
            while not self._stopping:
                self._watch()
                if self._reload:
                    self._pass_reload()
                if not published and all(os.path.exists(path) for path in self._ready_files()):
                    self._write_ports()  # every router serves: clients may come
                    published = True
                    self._register()
                    if self.failover is not None:
                        self.failover.start()
                self._take_over()
                self._fence()
                time.sleep(0.05)
        finally:
            if self.cluster_watch is not None:
                self.cluster_watch.stop()
            if self.resumer is not None:
                self.resumer.stop()
            if self.failover is not None:
                self.failover.stop()
            if self.membership is not None:
                self.membership.stop()   # gone from etcd at once, not a lease's time later
                self.membership.etcd.close()
            if self.metrics is not None:
                self.metrics.stop()
            self._stop_all()
            self._close_listeners()
            self.runtime.release()
            if self.data is not None:
                self.data.release()
        if self._failure is not None:
            raise self._failure
        log.info("stopped")
        return 0

    def _register(self) -> None:
        """In a cluster coordinated on etcd, say this node is alive (a lease kept
        alive from a thread): once it serves, so a listed node is a usable one;
        and watch for slot moves whose driver died (:mod:`.cluster.resumer`)."""
        if self.cluster is None or self.cluster.etcd is None:
            return
        from .cluster.coordination import Etcd, Membership
        from .cluster.resumer import Resumer
        assert self.config.node is not None   # _join_cluster refuses a cluster without --node
        node = self.cluster.node(self.config.node)
        info = {"host": node.host, "shards": node.shards,
                "metrics_port": self.metrics.port if self.metrics is not None else None}
        self.membership = Membership(self.failover.etcd if self.failover is not None else Etcd(self.cluster.etcd),
                                     node.name, info)
        self.membership.start()
        self.resumer = Resumer(self.cluster, node.name).start()

    def _on_reload(self, signum: int, frame: Optional[FrameType]) -> None:
        self._reload = True

    def _pass_reload(self) -> None:
        """SIGHUP: every router reads its TLS and access files again, and
        every shard serving clients (the direct path) that has an access file
        or TLS files reads them too; so does the HTTP port, in this process."""
        self._reload = False
        log.info("received SIGHUP: the routers (and the HTTP port) reload their TLS and access files")
        if self.metrics is not None:
            self.metrics.reload()
        shards_read = self.config.access_acl is not None or bool(self._shard_tls_args())
        readers = ("router", "shard-", "takeover-") if shards_read else ("router",)
        for child in self.children:
            if child.name.startswith(readers) and child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGHUP)

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if not self._stopping:
            log.info("received %s, shutting down", signal.Signals(signum).name)
        self._stopping = True

    def _watch(self) -> None:
        now = time.monotonic()
        for child in self.children:
            process = child.process
            if process is not None and process.poll() is not None:
                if process.returncode == EXIT_REFUSED:
                    # Restarting cannot help; it left its reason beside its socket.
                    try:
                        with open(self.runtime.file(f"{child.name}.sock.refused")) as f:
                            reason = f.read().strip()
                    except OSError:
                        reason = "see its log line above"
                    self._failure = StartupError(f"{child.name} cannot start: {reason}")
                    self._stopping = True
                    child.process = None
                    continue
                if process.returncode == EXIT_DEPOSED and self._replan(child):
                    continue
                log.warning("%s exited with status %s; restarting", child.name, process.returncode)
                child.process = None
                if now - child.started_at > 10:
                    child.backoff = 0.1   # it ran a good while: restart at once
                child.restart_at = now + child.backoff
                child.backoff = min(child.backoff * 2, MAX_BACKOFF)
            if child.process is None and now >= child.restart_at and not self._stopping and not child.held:
                child.start()

    def _stop_all(self) -> None:
        """Routers first (no new requests reach a stopping shard), then shards."""
        routers = [c for c in self.children if c.name.startswith("router")]
        shards = [c for c in self.children if not c.name.startswith("router")]
        deadline = time.monotonic() + STOP_GRACE
        for group in (routers, shards):
            for child in group:
                if child.process is not None and child.process.poll() is None:
                    child.process.terminate()
            for child in group:
                self._reap(child, deadline)

    @staticmethod
    def _reap(child: Child, deadline: float) -> None:
        process = child.process
        if process is None:
            return
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", child.name)
            process.kill()
            process.wait()
        log.info("%s exited with status %s", child.name, process.returncode)
