"""The cluster file: which nodes exist, their shards and addresses, the secret.

Every node reads the same file (``queueserver serve --cluster FILE --node
NAME``)::

    secret_file = "cluster.secret"   # relative to this file; mode 0600
    [tls]                            # optional: TLS on the links between hosts
    cert = "node.crt"
    key = "node.key"
    ca = "ca.crt"
    [etcd]                           # optional: liveness coordinated on etcd
    endpoints = ["http://10.0.0.9:2379"]   # tried in this order
    prefix = "/queueserver"          # the cluster's keys live under it
    lease_ttl = 3                    # seconds a dead node stays listed (a
                                     # replicated primary's failover takes
                                     # about this long)
    # ca, cert, key: TLS to etcd with a client certificate (etcd's
    # --client-cert-auth is its authentication)
    # user = "qs"                    # an etcd with authentication on: its
    # password_file = "etcd.password"  # user, and a file (mode 0600) with
    #                                # the password on its first line

    replicas = 1                     # optional: followers of each shard
                                     # on other nodes (0, 1 or 2); a node
                                     # serves a copy it took over on
                                     # link_port + shards + i
    # replica_backlog = 1000000      # events a primary keeps for a follower
                                     # still taking its snapshot; past it
                                     # the follower starts over (bounds the
                                     # primary's memory, as Redis's replica
                                     # output buffer limit does)

    [[node]]
    name = "a"
    host = "10.0.0.1"       # where its shard links listen and others dial
    link_port = 7400        # shard i listens on link_port + i
    shards = 2
    bind = "0.0.0.0"        # its client ports (default: host)
    workq_port = 9922       # any protocol's port, and metrics_port
    # join = true           # added after the cluster was made: owns no slots
    #                       # until `queueserver cluster add-node`
    # removed = true        # emptied by `cluster remove-node`: nobody dials it

A shard's *ordinal* (its name in the slot map, in job numbers and in every
router's directory) is its place in the file, so nodes are only ever
appended: an emptied node stays, marked ``removed``.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ..protocols import DEFAULT_PORTS

#: A cluster's shards at most. Job numbers are made with this stride in a
#: cluster, so that a number tells which shard made it (as the shard count
#: does on one host) even as shards are added; the routers' job directory
#: keeps a shard in one byte.
MAX_SHARDS = 250


class ClusterError(ValueError):
    """A mistake in the cluster file or its use, as one line saying what to change."""


@dataclass(frozen=True)
class TLSFiles:
    cert: str
    key: str
    ca: str


@dataclass(frozen=True)
class EtcdSpec:
    endpoints: Tuple[str, ...]
    prefix: str = "/queueserver"
    lease_ttl: int = 3
    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    user: Optional[str] = None            # etcd's authentication: who we are,
    password_file: Optional[str] = None   # and where the password is (read at each login)


@dataclass(frozen=True)
class ShardSpec:
    ordinal: int
    node: str
    index: int          # within its node
    host: str
    port: int           # its link port

    @property
    def name(self) -> str:
        return f"{self.node}/{self.index}"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    host: str
    link_port: int
    shards: int
    bind: Optional[str] = None
    ports: Dict[str, int] = field(default_factory=dict)
    metrics_port: Optional[int] = None
    join: bool = False
    removed: bool = False


@dataclass(frozen=True)
class ClusterSpec:
    path: str
    secret_file: str
    nodes: List[NodeSpec]
    tls: Optional[TLSFiles] = None
    etcd: Optional[EtcdSpec] = None
    replicas: int = 0
    replica_backlog: int = 1_000_000

    def takeovers(self, node: str) -> List[int]:
        """The shards of other nodes that ``node`` keeps a copy of (and may
        serve, once promoted), by ordinal."""
        return [s.ordinal for s in self.shards() if s.node != node and node in self.followers_of(s.ordinal)]

    def address(self, node: str, ordinal: int) -> Tuple[str, int]:
        """Where shard ``ordinal`` listens when ``node`` serves it: its own
        link port on its home node; on a node holding a copy, the port after
        that node's own shards' for each shard it may take over, in ordinal
        order (``link_port + shards + i``)."""
        spec = self.node(node)
        shard = self.shards()[ordinal]
        if shard.node == node:
            return shard.host, shard.port
        return spec.host, spec.link_port + spec.shards + self.takeovers(node).index(ordinal)

    def candidates(self, ordinal: int) -> List[Tuple[str, int]]:
        """Every address shard ``ordinal``'s primary may be at: its home node's
        first, then each follower's (after a failover)."""
        home = self.shards()[ordinal].node
        return [self.address(node, ordinal) for node in [home, *self.followers_of(ordinal)]]

    def followers_of(self, ordinal: int) -> List[str]:
        """The nodes that follow shard ``ordinal``: the next ``replicas`` nodes
        after its own in the file's order (round the end), skipping removed ones."""
        shard = self.shards()[ordinal]
        names = [node.name for node in self.nodes if not node.removed or node.name == shard.node]
        start = names.index(shard.node)
        others = [names[(start + step) % len(names)] for step in range(1, len(names))]
        return others[:self.replicas]

    def shards(self) -> List[ShardSpec]:
        """Every shard of every node, by ordinal."""
        specs: List[ShardSpec] = []
        for node in self.nodes:
            for i in range(node.shards):
                specs.append(ShardSpec(len(specs), node.name, i, node.host, node.link_port + i))
        return specs

    def founders(self) -> List[int]:
        """Ordinals of the shards that share the slots of a new cluster."""
        joined = {node.name for node in self.nodes if node.join}
        return [s.ordinal for s in self.shards() if s.node not in joined]

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        names = ", ".join(node.name for node in self.nodes)
        raise ClusterError(f"node {name!r} is not in cluster file {self.path} (its nodes: {names}); "
                           f"check --node")

    def shards_of(self, name: str) -> List[ShardSpec]:
        return [s for s in self.shards() if s.node == name]


_NODE_KEYS = {"name", "host", "link_port", "shards", "bind", "metrics_port", "join", "removed",
              *(f"{protocol}_port" for protocol in DEFAULT_PORTS)}


def _port(where: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ClusterError(f"{where} must be a port number from 1 to 65535, got {value!r}")
    return value


def _node(path: str, i: int, raw: Any) -> NodeSpec:
    where = f"{path}: node {i + 1}"
    if not isinstance(raw, dict):
        raise ClusterError(f"{where} must be a table ([[node]])")
    unknown = sorted(set(raw) - _NODE_KEYS)
    if unknown:
        raise ClusterError(f"{where}: unknown key {unknown[0]} (valid: {', '.join(sorted(_NODE_KEYS))})")
    for key in ("name", "host", "link_port", "shards"):
        if key not in raw:
            raise ClusterError(f"{where} needs {key}")
    name, host = raw["name"], raw["host"]
    if not isinstance(name, str) or not name or "/" in name or not name.isprintable() or " " in name:
        raise ClusterError(f"{where}: name must be a non-empty string without spaces or '/', got {name!r}")
    if not isinstance(host, str) or not host:
        raise ClusterError(f"{where} ({name}): host must be an address or host name, got {host!r}")
    shards = raw["shards"]
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= 64:
        raise ClusterError(f"{where} ({name}): shards must be an integer from 1 to 64, got {shards!r}")
    link_port = _port(f"{where} ({name}): link_port", raw["link_port"])
    if link_port + shards - 1 > 65535:
        raise ClusterError(f"{where} ({name}): link ports {link_port}..{link_port + shards - 1} "
                           f"do not fit below 65536")
    ports = {protocol: _port(f"{where} ({name}): {protocol}_port", raw[f"{protocol}_port"])
             for protocol in DEFAULT_PORTS if f"{protocol}_port" in raw}
    flags: Dict[str, bool] = {}
    for key in ("join", "removed"):
        value = raw.get(key, False)
        if not isinstance(value, bool):
            raise ClusterError(f"{where} ({name}): {key} must be true or false, got {value!r}")
        flags[key] = value
    bind = raw.get("bind")
    if bind is not None and (not isinstance(bind, str) or not bind):
        raise ClusterError(f"{where} ({name}): bind must be an address, got {bind!r}")
    metrics = raw.get("metrics_port")
    return NodeSpec(name, host, link_port, shards, bind, ports,
                    None if metrics is None else _port(f"{where} ({name}): metrics_port", metrics),
                    flags["join"], flags["removed"])


def _relative(base: str, value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ClusterError(f"{where} must be a file path, got {value!r}")
    return value if os.path.isabs(value) else os.path.join(os.path.dirname(os.path.abspath(base)), value)


def load_cluster(path: str) -> ClusterSpec:
    """The cluster file at ``path``, checked; :class:`ClusterError` otherwise."""
    try:
        with open(path, "rb") as f:
            data: Mapping[str, Any] = tomllib.load(f)
    except FileNotFoundError:
        raise ClusterError(f"cluster file {path} does not exist; check --cluster") from None
    except OSError as err:
        raise ClusterError(f"cannot read cluster file {path}: {(err.strerror or str(err)).lower()}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ClusterError(f"{path}: TOML syntax error: {err}") from None
    unknown = sorted(set(data) - {"secret_file", "tls", "etcd", "replicas", "replica_backlog", "node"})
    if unknown:
        raise ClusterError(f"{path}: unknown key {unknown[0]} (valid: secret_file, tls, etcd, replicas, "
                           f"replica_backlog, node)")
    if "secret_file" not in data:
        raise ClusterError(f"{path} needs secret_file: a file of at least 16 random bytes, mode 0600, "
                           f"the same on every node (e.g. head -c 32 /dev/urandom | base64 > cluster.secret)")
    secret_file = _relative(path, data["secret_file"], f"{path}: secret_file")
    raw_nodes = data.get("node")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ClusterError(f"{path} lists no nodes; add [[node]] tables")
    nodes = [_node(path, i, raw) for i, raw in enumerate(raw_nodes)]
    seen: Dict[str, int] = {}
    links: Dict[Tuple[str, int], str] = {}
    for node in nodes:
        if node.name in seen:
            raise ClusterError(f"{path}: node name {node.name!r} is used twice")
        seen[node.name] = 1
        for port in range(node.link_port, node.link_port + node.shards):
            if (node.host, port) in links:
                raise ClusterError(f"{path}: link port {node.host}:{port} of node {node.name} is also "
                                   f"node {links[(node.host, port)]}'s")
            links[(node.host, port)] = node.name
    if sum(node.shards for node in nodes) > MAX_SHARDS:
        raise ClusterError(f"{path}: a cluster has at most {MAX_SHARDS} shards in all")
    if all(node.join for node in nodes):
        raise ClusterError(f"{path}: every node has join = true; the nodes that make the cluster "
                           f"must not (they share its slots at the start)")
    tls = None
    if "tls" in data:
        raw = data["tls"]
        if not isinstance(raw, dict) or set(raw) - {"cert", "key", "ca"} or len(raw) != 3:
            raise ClusterError(f"{path}: [tls] needs exactly cert, key and ca (file paths)")
        tls = TLSFiles(*(_relative(path, raw[k], f"{path}: tls.{k}") for k in ("cert", "key", "ca")))
    etcd = _etcd(path, data["etcd"]) if "etcd" in data else None
    replicas = data.get("replicas", 0)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 0 <= replicas <= 2:
        raise ClusterError(f"{path}: replicas must be 0, 1 or 2 (followers of each shard), got {replicas!r}")
    serving = [node for node in nodes if not node.removed]
    if replicas >= len(serving):
        raise ClusterError(f"{path}: replicas = {replicas} needs at least {replicas + 1} nodes (each "
                           f"follower on a node of its own), the file has {len(serving)}")
    backlog = data.get("replica_backlog", ClusterSpec.replica_backlog)
    if not isinstance(backlog, int) or isinstance(backlog, bool) or backlog < 1:
        raise ClusterError(f"{path}: replica_backlog must be a number of events of at least 1, got {backlog!r}")
    spec = ClusterSpec(os.path.abspath(path), secret_file, nodes, tls, etcd, replicas, backlog)
    if replicas:   # the ports a node serves its copies on, once promoted, must be free too
        for node in serving:
            for ordinal in spec.takeovers(node.name):
                host, port = spec.address(node.name, ordinal)
                if port > 65535 or (host, port) in links:
                    raise ClusterError(f"{path}: node {node.name} serves a copy of shard {ordinal} on "
                                       f"link port {host}:{port} once promoted (link_port + shards + i), "
                                       f"which is {'past 65535' if port > 65535 else 'taken'}; move its link_port")
                links[(host, port)] = node.name
    return spec


_ETCD_KEYS = ("endpoints", "prefix", "lease_ttl", "ca", "cert", "key", "user", "password_file")


def _etcd(path: str, raw: Any) -> EtcdSpec:
    where = f"{path}: [etcd]"
    if not isinstance(raw, dict):
        raise ClusterError(f"{where} must be a table")
    unknown = sorted(set(raw) - set(_ETCD_KEYS))
    if unknown:
        raise ClusterError(f"{where}: unknown key {unknown[0]} (valid: {', '.join(_ETCD_KEYS)})")
    endpoints = raw.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        raise ClusterError(f'{where} needs endpoints, a list such as ["http://10.0.0.9:2379"]')
    for endpoint in endpoints:
        url = urlsplit(endpoint) if isinstance(endpoint, str) else None
        try:
            valid = url is not None and url.scheme in ("http", "https") and bool(url.hostname) \
                and not url.path.strip("/") and url.port is not None
        except ValueError:   # a port that is not a number
            valid = False
        if not valid:
            raise ClusterError(f"{where}: endpoint {endpoint!r} must be http(s)://host:port")
    prefix = raw.get("prefix", "/queueserver")
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.rstrip("/") == "":
        raise ClusterError(f"{where}: prefix must be a key path such as \"/queueserver\", got {prefix!r}")
    ttl = raw.get("lease_ttl", 3)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not 2 <= ttl <= 300:
        raise ClusterError(f"{where}: lease_ttl must be whole seconds from 2 to 300, got {ttl!r}")
    files = {k: _relative(path, raw[k], f"{where} {k}") for k in ("ca", "cert", "key", "password_file")
             if k in raw}
    if ("cert" in files) != ("key" in files):
        raise ClusterError(f"{where}: cert and key go together (a client certificate and its key)")
    user = raw.get("user")
    if ("user" in raw) != ("password_file" in files):
        raise ClusterError(f"{where}: user and password_file go together (etcd's user and a file "
                           f"holding its password)")
    if user is not None and (not isinstance(user, str) or not user or not user.isprintable()):
        raise ClusterError(f"{where}: user must be the name of an etcd user, got {user!r}")
    return EtcdSpec(tuple(endpoints), prefix.rstrip("/"), ttl, files.get("ca"), files.get("cert"),
                    files.get("key"), user, files.get("password_file"))
