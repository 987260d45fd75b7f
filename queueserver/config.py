"""Server configuration: defaults, then a TOML file, then command-line flags.

A TOML file looks like::

    [server]
    shards = 4
    bind = "127.0.0.1"
    runtime_dir = "/run/queueserver"
    log_level = "info"
    max_payload = 1048576

    [workq]
    port = 9922
    enabled = true

    [takeanumber]
    reservation_timeout = 0
    empty_reserve_error = false
    tls = "both"          # "false" (default), "true" (the port speaks TLS) or "both":
    tls_port = 9924       # a TLS port beside the plain one

    [tls]
    certificate = "/etc/queueserver/server.pem"
    key = "/etc/queueserver/server.key"      # private to the server's user (chmod 600)
    client_ca = "/etc/queueserver/clients-ca.pem"   # optional: clients must present a certificate
    handshake_timeout = 10

Server-wide keys may also stand at the top level (the older form), but not in
both places. Every value is checked where it enters, so a mistake is one
:class:`ConfigError` line naming the key (``server.shards``) or flag
(``--shards``) and what would be accepted, never a traceback from deep in the
server.
"""
from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, TypeGuard, Union

from .hostsize import default_routers, default_shards
from .protocols import DEFAULT_PORTS

DEFAULT_METRICS_PORT = 9470
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
FSYNC_POLICIES = ("always", "interval", "never")
TLS_MODES = ("false", "true", "both")


class ConfigError(ValueError):
    """A configuration or usage mistake, as one line that says what to change."""


#: A checked setting's value: every kind of :data:`KINDS` is one of these.
Value = Union[bool, int, float, str]


def _show(value: object) -> str:
    """A value as it would be written in TOML, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_address(value: object) -> bool:
    if not isinstance(value, str):
        return False
    if value == "localhost":
        return True
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


#: kind -> (does a value fit, what the message says it must be); a value is
#: parsed TOML or a flag, so it may be of any type
KINDS: Dict[str, Tuple[Callable[[object], bool], str]] = {
    "int": (_is_int, "an integer"),
    "float": (lambda v: (_is_int(v) or isinstance(v, float)) and math.isfinite(v), "a number of {unit}"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "path": (lambda v: isinstance(v, str) and v != "", "a directory path (a non-empty string)"),
    "file": (lambda v: isinstance(v, str) and v != "", "a file path (a non-empty string)"),
    "name": (lambda v: isinstance(v, str) and v != "" and v.isprintable() and " " not in v,
             "a name (a non-empty string with no spaces)"),
    "port": (lambda v: _is_int(v) and 0 <= v <= 65535, "a port number from 0 to 65535 (0 picks a free port)"),
    "address": (_is_address, "an IP address such as 127.0.0.1, 0.0.0.0 or :: (or localhost)"),
    "level": (lambda v: isinstance(v, str) and v.lower() in LOG_LEVELS, f"one of {', '.join(LOG_LEVELS)}"),
    "fsync": (lambda v: isinstance(v, str) and v.lower() in FSYNC_POLICIES,
              f"one of {', '.join(FSYNC_POLICIES)}"),
    "tls": (lambda v: isinstance(v, bool) or (isinstance(v, str) and v.lower() in TLS_MODES),
            'one of "false", "true" or "both"'),
}
#: kind -> how a fitting value is stored (``Any``: one that fits the kind)
CONVERT: Dict[str, Callable[[Any], Value]] = {
    "float": float, "level": str.lower, "fsync": str.lower,
    "tls": lambda v: ("true" if v else "false") if isinstance(v, bool) else v.lower()}


@dataclass(frozen=True)
class Setting:
    """What one key accepts; the same check serves the file and the flag.

    ``kind`` is one of :data:`KINDS`. ``flag``/``metavar``/``help``
    describe the matching command-line flag.
    """

    kind: str
    minimum: Optional[float] = None
    unit: str = ""
    note: str = ""
    flag: Optional[str] = None
    metavar: Optional[str] = None
    help: str = ""

    def check(self, name: str, value: Any) -> Value:
        """``value`` as the server uses it, or :class:`ConfigError` naming ``name``."""
        fits, expected = KINDS[self.kind]
        if not fits(value):
            raise ConfigError(f"{name} must be {expected.format(unit=self.unit)}, got {_show(value)}")
        if self.minimum is not None and value < self.minimum:
            unit = f" {self.unit}" if self.unit else ""
            note = f" ({self.note})" if self.note else ""
            raise ConfigError(f"{name} must be at least {self.minimum:g}{unit}{note}, got {_show(value)}")
        convert = CONVERT.get(self.kind)
        checked: Value = value if convert is None else convert(value)   # it fits: one of Value's types
        return checked


#: Server-wide keys, in ``[server]`` (or at the top level); each has a flag.
SERVER: Dict[str, Setting] = {
    "shards": Setting("int", 1, flag="--shards", metavar="N",
                      help="shard processes (default: one per core this process may use: its CPU "
                           "affinity and its cgroup's CPU quota)"),
    "routers": Setting("int", 1, flag="--routers", metavar="N",
                       help="router processes sharing the client ports (default: one per eight such "
                            "cores, at least one)"),
    "bind": Setting("address", flag="--bind", metavar="ADDR",
                    help="address every listener binds (default 127.0.0.1)"),
    "runtime_dir": Setting("path", flag="--runtime-dir", metavar="DIR",
                           help="private directory (ours, 0700) for shard sockets, ports.json and the "
                                "lock (default: a fresh temporary one)"),
    "log_level": Setting("level", flag="--log-level", metavar="LEVEL",
                         help=f"{', '.join(LOG_LEVELS)} (default info)"),
    "max_payload": Setting("int", 1, "bytes", flag="--max-payload", metavar="BYTES",
                           help="largest job payload or result any protocol accepts (default 1048576)"),
    "max_connections": Setting("int", 1, flag="--max-connections", metavar="N",
                               help="client connections the whole server accepts (default 10000)"),
    "max_outstanding_bytes": Setting("int", 65536, "bytes", flag="--max-outstanding-bytes", metavar="BYTES",
                                     help="bytes one connection may have outstanding, requests in flight "
                                          "plus replies unread (default 8388608, at least 65536)"),
    "max_queues": Setting("int", 1, flag="--max-queues", metavar="N",
                          help="queues the server holds, shared out evenly among the shards (default "
                               "100000); creating one more first removes an unused one, or is refused"),
    "direct_path": Setting("bool", flag="--direct-path",
                           help="hand a connection whose requests go to one shard to that shard, "
                                "which serves it with no hop (default on; --no-direct-path forwards "
                                "every request through the router)"),
    "data_dir": Setting("path", flag="--data-dir", metavar="DIR",
                        help="keep each shard's append-only log under DIR, so acknowledged jobs "
                             "survive a crash or restart (default: none, jobs live in memory only)"),
    "in_memory": Setting("bool", flag="--in-memory",
                         help="keep jobs in memory only, even when a data directory is configured"),
    "fsync": Setting("fsync", flag="--fsync", metavar="POLICY",
                     help="always: a change is answered once it is on disk (group commit); "
                          "interval: flushed every --fsync-interval; never: the OS decides "
                          "(default always)"),
    "fsync_interval": Setting("float", 1, "ms", flag="--fsync-interval", metavar="MS",
                              help="how often the interval policy flushes (default 1000)"),
    "fsync_in_loop": Setting("float", 0, "ms", "0 runs every fsync in a thread",
                             flag="--fsync-in-loop", metavar="MS",
                             help="fsync = always: while fsyncs take less than MS, each runs in the "
                                  "shard's event loop (no thread handoff); slower ones, and all with 0, "
                                  "run in a thread while the loop serves on (default 5)"),
    "compact_after_bytes": Setting("int", 4096, "bytes", flag="--compact-after-bytes", metavar="BYTES",
                                   help="rewrite a shard's log as its live jobs once it is larger than "
                                        "BYTES and twice its last rewrite (default 67108864)"),
    "cluster": Setting("file", flag="--cluster", metavar="FILE",
                       help="run as one node of the cluster this TOML file describes (its nodes, "
                            "shards, addresses and shared secret); needs --node and a data directory"),
    "node": Setting("name", flag="--node", metavar="NAME",
                    help="which node of the --cluster file this server is"),
    "queue_idle_timeout": Setting("float", 0, "seconds", "0 never removes idle queues",
                                  flag="--queue-idle-timeout", metavar="SECONDS",
                                  help="an empty queue nobody waits on is removed after SECONDS "
                                       "(default 300; 0: never)"),
}

#: Keys every protocol section has.
LISTENER: Dict[str, Setting] = {
    "enabled": Setting("bool"),
    "port": Setting("port"),
    "bind": Setting("address"),
}
#: Keys of the client ports' sections only.
TLS_LISTENER: Dict[str, Setting] = {
    "tls": Setting("tls"),
    "tls_port": Setting("port"),
}

#: ``[tls]``: the client ports' certificate; the attribute of :class:`Config`
#: is ``tls_<key>``. A listener speaks TLS with its ``tls`` key.
TLS: Dict[str, Setting] = {
    "certificate": Setting("file", flag="--tls-certificate", metavar="FILE",
                           help="PEM certificate (chain) of the TLS client ports"),
    "key": Setting("file", flag="--tls-key", metavar="FILE",
                   help="its PEM private key, unencrypted, private to the server's user (chmod 600)"),
    "client_ca": Setting("file", flag="--tls-client-ca", metavar="FILE",
                         help="PEM certificates of the CAs whose client certificates are accepted; "
                              "with it, a TLS client must present one (default: none asked for)"),
    "handshake_timeout": Setting("float", 0.1, "seconds", flag="--tls-handshake-timeout", metavar="SECONDS",
                                 help="a TLS client that has not finished its handshake in SECONDS is "
                                      "closed (default 10)"),
}


#: ``[metrics]``'s own keys beside :data:`LISTENER`'s: whether the HTTP port
#: speaks HTTPS with the ``[tls]`` files. Left unset it does exactly when it is
#: bound beyond loopback and ``[tls]`` names a certificate (:meth:`Config.metrics_tls`).
METRICS: Dict[str, Setting] = {
    "tls": Setting("bool", flag="--metrics-tls",
                   help="the HTTP port (/metrics, /status, the console) speaks HTTPS with the [tls] "
                        "certificate, key and client CA (default: on when it is bound beyond loopback "
                        "and --tls-certificate is given)"),
}
#: ``Listener.tls`` of the metrics port while ``metrics.tls`` is unset.
METRICS_TLS_AUTO = "auto"


def tls_attribute(key: str) -> str:
    """The :class:`Config` attribute of ``[tls] key``."""
    return f"tls_{key}"

#: Codec options each protocol section may add; they reach the protocol's codec.
CODEC_OPTIONS: Dict[str, Dict[str, Setting]] = {name: {} for name in DEFAULT_PORTS}
CODEC_OPTIONS["metrics"] = {}   # [metrics] is a listener too (HTTP), with no codec
CODEC_OPTIONS["takeanumber"] = {
    "reservation_timeout": Setting("int", 0, "ms", "0 never times out", flag="--reservation-timeout",
                                   metavar="MS", help="takeanumber: a reserved job returns to its queue "
                                                      "after MS milliseconds (default 0: never)"),
    "empty_reserve_error": Setting("bool", flag="--takeanumber-empty-error",
                                   help="takeanumber: RESERVE on an empty queue answers "
                                        "'-ERR No items available to reserve.' as the original server "
                                        "does (default: ':-1')"),
}
CODEC_OPTIONS["queued"] = {
    "allow_dups": Setting("bool", flag="--allow-dups",
                          help="queued: keep duplicate items (default: drop an item the queue already holds)"),
}


#: ``[history]``: the shards' job history (with a data directory); the attribute
#: of :class:`Config` is ``history`` for ``enabled``, else ``history_<key>``.
HISTORY: Dict[str, Setting] = {
    "enabled": Setting("bool", flag="--history",
                       help="write the job history with a data directory (default on; --no-history: "
                            "none)"),
    "max_bytes": Setting("int", 65536, "bytes", flag="--history-max-bytes", metavar="BYTES",
                         help="the node's history files together stay within BYTES (shared out "
                              "evenly among its shards; oldest dropped first; default 1073741824, "
                              "at least 65536)"),
    "max_age": Setting("float", 0, "seconds", "0 keeps history of any age", flag="--history-max-age",
                       metavar="SECONDS",
                       help="drop history files last written more than SECONDS ago (default "
                            "604800, a week; 0: no age limit)"),
    "checkpoint": Setting("file", flag="--history-checkpoint", metavar="PATH",
                          help="the --out directory (or its _checkpoint.json) of `queueserver "
                               "history`: a history file dropped before it was read there is "
                               "logged as a warning"),
}


#: ``[console]``: the web console on the metrics port; the attribute of
#: :class:`Config` is ``console_<key>``. No flags: set in the file.
CONSOLE: Dict[str, Setting] = {
    "token_file": Setting("file", help="a file of lines `name token`: a console action (delete, "
                                       "requeue, purge) needs one of the tokens, and is logged with "
                                       "its name (default: none, so no actions)"),
    "history_report": Setting("file", help="the report.html of `queueserver history`, or the --out "
                                           "directory holding it: linked from every queue's page "
                                           "(default: none)"),
}


#: ``[access]``: who may connect and what each identity may do (the access
#: file, :mod:`queueserver.access`); the attribute of :class:`Config` is ``access_<key>``.
ACCESS: Dict[str, Setting] = {
    "acl": Setting("file", flag="--acl", metavar="FILE",
                   help="the access file: client identities (by certificate name or source network) "
                        "and the queues each may produce to, consume from, inspect and administer; "
                        "unknown clients are refused at connect; reread on SIGHUP (default: none, so "
                        "every client may do everything)"),
}


def access_attribute(key: str) -> str:
    """The :class:`Config` attribute of ``[access] key``."""
    return f"access_{key}"


def console_attribute(key: str) -> str:
    """The :class:`Config` attribute of ``[console] key``."""
    return f"console_{key}"


def history_attribute(key: str) -> str:
    """The :class:`Config` attribute of ``[history] key``."""
    return "history" if key == "enabled" else f"history_{key}"


def unknown_key(dotted: str, valid: List[str]) -> ConfigError:
    """An unknown key, with the closest valid one (or the list) as the fix."""
    prefix, _, key = dotted.rpartition(".")
    close = difflib.get_close_matches(key, valid, n=1)
    if close:
        return ConfigError(f"unknown key {dotted}; did you mean {prefix + '.' if prefix else ''}{close[0]}?")
    return ConfigError(f"unknown key {dotted}; valid keys{' in [' + prefix + ']' if prefix else ''}: "
                       f"{', '.join(valid)}")


def _table(name: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a table (a [{name}] section), got {_show(value)}")
    return value


@dataclass
class Listener:
    enabled: bool = True
    port: int = 0
    bind: Optional[str] = None   # None: the server-wide bind address
    options: Dict[str, Value] = field(default_factory=dict)  # codec options the configuration set
    tls: str = "false"           # one of TLS_MODES: "true": the port speaks TLS; "both": tls_port does too
    tls_port: Optional[int] = None

    def update(self, protocol: str, section: Mapping[str, Any]) -> None:
        """Apply the ``[protocol]`` section, checking every key."""
        options = CODEC_OPTIONS[protocol]
        for key, value in section.items():
            name = f"{protocol}.{key}"
            if protocol == "metrics" and key in METRICS:
                self.tls = "true" if METRICS[key].check(name, value) else "false"
            elif protocol == "metrics" and key in TLS_LISTENER:
                raise ConfigError(f"{name}: the HTTP port is one port: metrics.tls = true makes it speak "
                                  f"HTTPS, there is no port beside it")
            elif key in LISTENER:
                setattr(self, key, LISTENER[key].check(name, value))
            elif key in TLS_LISTENER:
                setattr(self, key, TLS_LISTENER[key].check(name, value))
            elif key in options:
                self.options[key] = options[key].check(name, value)
            else:
                raise unknown_key(name, [*LISTENER, *(TLS_LISTENER if protocol != "metrics" else METRICS),
                                         *options])

    def ports(self, protocol: str) -> List[Tuple[str, int, bool]]:
        """The ports it listens on: (name in ``ports.json``, port, speaks TLS).
        A TLS port is named ``<protocol>_tls``, a plain one ``<protocol>``."""
        if not self.enabled:
            return []
        if self.tls == "true":
            return [(f"{protocol}_tls", self.port, True)]
        ports = [(protocol, self.port, False)]
        if self.tls == "both":
            assert self.tls_port is not None   # Config.check_tls
            ports.append((f"{protocol}_tls", self.tls_port, True))
        return ports


@dataclass
class Config:
    shards: int = field(default_factory=default_shards)     # one per usable core (hostsize)
    routers: int = field(default_factory=default_routers)
    bind: str = "127.0.0.1"
    runtime_dir: Optional[str] = None
    log_level: str = "info"
    max_payload: int = 1048576
    max_connections: int = 10000
    max_outstanding_bytes: int = 8388608
    max_queues: int = 100000
    queue_idle_timeout: float = 300.0
    direct_path: bool = True
    data_dir: Optional[str] = None
    in_memory: bool = False
    fsync: str = "always"
    fsync_interval: float = 1000.0
    fsync_in_loop: float = 5.0
    compact_after_bytes: int = 64 * 1024 * 1024
    #: ``[history]`` (:data:`HISTORY`): write the job history when there is a data
    #: directory; the node's history within max_bytes and max_age (s; 0: any age)
    history: bool = True
    history_max_bytes: int = 1 << 30
    history_max_age: float = 7 * 86400.0
    history_checkpoint: Optional[str] = None
    #: ``[console]`` (:data:`CONSOLE`): the tokens of console actions, the history report's place
    console_token_file: Optional[str] = None
    console_history_report: Optional[str] = None
    #: ``[access]`` (:data:`ACCESS`): the access file (None: everyone may do everything)
    access_acl: Optional[str] = None
    #: ``[tls]`` (:data:`TLS`): the TLS client ports' files and handshake timeout
    tls_certificate: Optional[str] = None
    tls_key: Optional[str] = None
    tls_client_ca: Optional[str] = None
    tls_handshake_timeout: float = 10.0
    #: server-wide keys set by the file or a flag, not left at their default
    explicit: Set[str] = field(default_factory=set, compare=False, repr=False)
    cluster: Optional[str] = None
    node: Optional[str] = None
    listeners: Dict[str, Listener] = field(
        default_factory=lambda: {name: Listener(port=port) for name, port in DEFAULT_PORTS.items()})
    #: ``[metrics]``: the HTTP port of ``/metrics`` (Prometheus) and ``/status`` (JSON)
    metrics: Listener = field(default_factory=lambda: Listener(port=DEFAULT_METRICS_PORT, tls=METRICS_TLS_AUTO))

    @classmethod
    def load(cls, path: Optional[str]) -> "Config":
        """Defaults, then the file at ``path`` (if any); its problems as one :class:`ConfigError`."""
        config = cls()
        if path:
            try:
                with open(path, "rb") as f:
                    data = tomllib.load(f)
            except FileNotFoundError:
                raise ConfigError(f"config file {path} does not exist; check the --config path") from None
            except OSError as err:
                raise ConfigError(f"cannot read config file {path}: {(err.strerror or str(err)).lower()} "
                                  f"(give a readable TOML file with --config)") from None
            except UnicodeDecodeError:
                raise ConfigError(f"config file {path} is not UTF-8 text") from None
            except tomllib.TOMLDecodeError as err:
                raise ConfigError(f"{path}: TOML syntax error: {err}") from None
            try:
                config.update(data)
            except ConfigError as err:
                raise ConfigError(f"{path}: {err}") from None
        return config

    def update(self, data: Mapping[str, Any]) -> None:
        """Apply a parsed TOML document, checking every key."""
        server = _table("server", data.get("server", {}))
        for key in data:
            if key not in ("server", "history", "metrics", "console", "access", "tls") and key not in SERVER \
                    and key not in self.listeners:
                raise unknown_key(key, ["server", "history", "metrics", "console", "access", "tls", *SERVER,
                                        *self.listeners])
        for name, settings, attribute in (("access", ACCESS, access_attribute), ("tls", TLS, tls_attribute)):
            for key, value in _table(name, data.get(name, {})).items():
                if key not in settings:
                    raise unknown_key(f"{name}.{key}", list(settings))
                setattr(self, attribute(key), settings[key].check(f"{name}.{key}", value))
        console = _table("console", data.get("console", {}))
        for key, value in console.items():
            if key not in CONSOLE:
                raise unknown_key(f"console.{key}", list(CONSOLE))
            setattr(self, console_attribute(key), CONSOLE[key].check(f"console.{key}", value))
        history = _table("history", data.get("history", {}))
        for key, value in history.items():
            if key not in HISTORY:
                raise unknown_key(f"history.{key}", list(HISTORY))
            setattr(self, history_attribute(key), HISTORY[key].check(f"history.{key}", value))
        for key in server:
            if key not in SERVER:
                raise unknown_key(f"server.{key}", list(SERVER))
        for key, setting in SERVER.items():
            if key in server and key in data:
                raise ConfigError(f"{key} is set both at the top level and in [server]; keep only "
                                  f"server.{key}")
            if key in server:
                setattr(self, key, setting.check(f"server.{key}", server[key]))
                self.explicit.add(key)
            elif key in data:
                setattr(self, key, setting.check(key, data[key]))
                self.explicit.add(key)
        for name, listener in self.listeners.items():
            if name in data:
                listener.update(name, _table(name, data[name]))
        if "metrics" in data:
            self.metrics.update("metrics", _table("metrics", data["metrics"]))

    def check_tls(self) -> None:
        """The listeners' TLS settings agree with each other and with ``[tls]``
        (called once the file and the flags are both applied)."""
        speaking = [name for name, listener in self.listeners.items()
                    if listener.enabled and listener.tls != "false"]
        for name, listener in self.listeners.items():
            if listener.tls == "both" and listener.tls_port is None:
                raise ConfigError(f'{name}.tls = "both" needs {name}.tls_port (--{name}-tls-port), the '
                                  f"port of its TLS listener beside the plain one")
            if listener.tls != "both" and listener.tls_port is not None:
                raise ConfigError(f'{name}.tls_port is the TLS port beside the plain one: set {name}.tls = '
                                  f'"both" (--{name}-tls both), or drop it')
            if listener.tls == "both" and listener.tls_port == listener.port and listener.port != 0:
                raise ConfigError(f"{name}.tls_port and {name}.port are both {listener.port}: give the TLS "
                                  f"listener a port of its own")
        if self.metrics.enabled and self.metrics.tls == "true":
            speaking.append("metrics")
        if speaking and (self.tls_certificate is None or self.tls_key is None):
            missing = " and ".join(f"tls.{key} (--tls-{key})" for key in ("certificate", "key")
                                   if getattr(self, tls_attribute(key)) is None)
            raise ConfigError(f"{', '.join(speaking)} speak{'s' if len(speaking) == 1 else ''} TLS but "
                              f"{missing} {'is' if ' and ' not in missing else 'are'} not set")

    @property
    def metrics_bind(self) -> str:
        """The address the HTTP port binds."""
        return self.metrics.bind or self.bind

    def metrics_beyond_loopback(self) -> bool:
        """Whether the HTTP port is bound where other hosts can reach it."""
        host = self.metrics_bind
        return host != "localhost" and not ipaddress.ip_address(host).is_loopback

    def metrics_tls(self) -> bool:
        """Whether the HTTP port speaks HTTPS: as ``metrics.tls`` says, or,
        unset, when it is bound beyond loopback and ``[tls]`` names a
        certificate (a port only this host reaches needs none, and a server
        with no certificate has none to offer)."""
        if self.metrics.tls != METRICS_TLS_AUTO:
            return self.metrics.tls == "true"
        return self.tls_certificate is not None and self.tls_key is not None and self.metrics_beyond_loopback()

    @property
    def speaks_tls(self) -> bool:
        """Whether any client port speaks TLS."""
        return any(listener.enabled and listener.tls != "false" for listener in self.listeners.values())

    def router_options(self) -> Dict[str, Dict[str, Value]]:
        """Codec options of every enabled protocol, ``max_payload`` included."""
        return {name: {**listener.options, "max_payload": self.max_payload}
                for name, listener in self.listeners.items() if listener.enabled}

    @property
    def durable(self) -> bool:
        """Whether shards keep logs (a data directory, and not ``in_memory``)."""
        return self.data_dir is not None and not self.in_memory

    @property
    def keeps_history(self) -> bool:
        """Whether shards write the job history (on with a data directory)."""
        return self.durable and self.history

    def history_shard_args(self) -> List[str]:
        """A shard's history retention flags: its even part of the node's bound."""
        args = ["--history-max-bytes", str(self.history_max_bytes // self.shards),
                "--history-max-age", repr(self.history_max_age)]
        if self.history_checkpoint is not None:
            args += ["--history-checkpoint", os.path.abspath(self.history_checkpoint)]
        return args

    def access_file(self) -> Optional[str]:
        """The access file's absolute path (routers and shards read it), or None."""
        return os.path.abspath(self.access_acl) if self.access_acl is not None else None

    def shard_max_queues(self) -> int:
        """Each shard's part of ``max_queues`` (rounded up, so the shards together hold at least it)."""
        return -(-self.max_queues // self.shards)

    def limits(self) -> Dict[str, int]:
        """Server-wide connection limits, as the routers receive them."""
        return {"max_connections": self.max_connections,
                "max_outstanding_bytes": self.max_outstanding_bytes}
