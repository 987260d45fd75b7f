"""The ``queueserver`` command.

Every usage or configuration mistake, and every failure to start, ends the
command with one line on stderr that names the problem and its fix, and a
non-zero status (2 for what the caller can fix), never a traceback.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from typing import List, NoReturn, Optional

from . import BUILD, __version__
from .cluster.arguments import add_parser as add_cluster_parser
from .config import (ACCESS, CODEC_OPTIONS, DEFAULT_METRICS_PORT, HISTORY, LISTENER, LOG_LEVELS, METRICS, SERVER, TLS,
                     TLS_LISTENER, TLS_MODES, Config, ConfigError, Setting, access_attribute, history_attribute,
                     tls_attribute)
from .protocols import DEFAULT_PORTS

PROG = "queueserver"
FLAG_TYPES = {"int": int, "float": float, "port": int}


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line that points at ``--help``."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see '{self.prog} --help')", 2, self.prog)


def fail(message: str, status: int = 2, prog: str = PROG) -> NoReturn:
    """End the command with one line on stderr."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def _flag(setting: Setting) -> str:
    """The flag of a setting the command line offers (each of SERVER, HISTORY and CODEC_OPTIONS has one)."""
    assert setting.flag is not None, setting
    return setting.flag


def _port(flag: str, value: object) -> int:
    """A port flag's value, checked as the ``port`` key is."""
    port = LISTENER["port"].check(flag, value)
    assert isinstance(port, int)   # a "port" fits only as an int
    return port


def _add_flag(p: argparse.ArgumentParser, setting: Setting, dest: str) -> None:
    if setting.kind == "bool":
        p.add_argument(_flag(setting), action=argparse.BooleanOptionalAction, default=None, dest=dest,
                       help=setting.help)
    else:
        p.add_argument(_flag(setting), type=FLAG_TYPES.get(setting.kind, str), metavar=setting.metavar,
                       dest=dest, help=setting.help)


def _serve_parser(sub: argparse._SubParsersAction[ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the server (router + shard processes)",
                       description="Run the queue server: N shard processes and the router(s) "
                                   "in front of them. Flags override the --config file.")
    p.add_argument("--config", metavar="FILE", help="TOML configuration file")
    for key, setting in SERVER.items():
        _add_flag(p, setting, key)
    for name, port in DEFAULT_PORTS.items():
        p.add_argument(f"--{name}-port", type=int, metavar="PORT", dest=f"{name}_port",
                       help=f"{name} protocol port (default {port}; 0 picks a free port)")
        p.add_argument(f"--no-{name}", action="store_true", dest=f"no_{name}",
                       help=f"do not listen for the {name} protocol")
        p.add_argument(f"--{name}-tls", choices=TLS_MODES, dest=f"{name}_tls",
                       help=f"{name} over TLS: false (default), true (its port speaks TLS), both (a TLS "
                            f"port, --{name}-tls-port, beside the plain one)")
        p.add_argument(f"--{name}-tls-port", type=int, metavar="PORT", dest=f"{name}_tls_port",
                       help=f"{name}'s TLS port with --{name}-tls both (0 picks a free port)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", dest="metrics_port",
                   help=f"HTTP port of /metrics (Prometheus) and /status (JSON) (default "
                        f"{DEFAULT_METRICS_PORT}; 0 picks a free port)")
    p.add_argument("--no-metrics", action="store_true", dest="no_metrics",
                   help="serve no /metrics or /status")
    _add_flag(p, METRICS["tls"], "metrics_tls")
    for protocol, options in CODEC_OPTIONS.items():
        for key, setting in options.items():
            _add_flag(p, setting, f"{protocol}_{key}")
    for key, setting in HISTORY.items():
        _add_flag(p, setting, history_attribute(key))
    for key, setting in ACCESS.items():
        _add_flag(p, setting, access_attribute(key))
    for key, setting in TLS.items():
        _add_flag(p, setting, tls_attribute(key))


def _worker_parser(sub: argparse._SubParsersAction[ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run a worker that calls module:function for each job",
                       description="Lease jobs in a loop, call FUNCTION(job) and complete the job "
                                   "with its return value, or fail it with the traceback. Logs one "
                                   "line per job: queue, id, outcome, duration.")
    p.add_argument("function", metavar="module:function")
    p.add_argument("--queue", action="append", required=True, metavar="NAME",
                   help="queue to lease from (repeat for several)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9922)
    p.add_argument("--wait-timeout", type=int, default=1000, metavar="MS",
                   help="lease wait per round; bounds how long a stop takes (default 1000)")
    p.add_argument("--max-jobs", type=int, metavar="N", help="stop after N jobs")
    p.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS, metavar="LEVEL",
                   help=f"{', '.join(LOG_LEVELS)} (default info)")


def _history_parser(sub: argparse._SubParsersAction[ArgumentParser]) -> None:
    from .history.options import add_arguments
    p = sub.add_parser("history", help="turn the shards' job history into Parquet tables and a report",
                       description="Read the shards' job history files (in this process for a "
                                   "small local history, else with Spark; the 'spark' extra) and "
                                   "write the jobs, queue_minutes, stuck and failed tables and "
                                   "report.html; later runs read only what is new.")
    add_arguments(p)


def _history(args: argparse.Namespace) -> int:
    missing = [name for name in ("pyspark", "pyarrow") if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"history needs {' and '.join(missing)}; install the spark extra from the "
             f"checkout: pip install '.[spark]' (and Java 17 for Spark)", 2, f"{PROG} history")
    from .history.app import run_from_args
    return run_from_args(args, f"{PROG} history")


def _work(args: argparse.Namespace) -> int:
    from .client import Client
    from .client.worker import Worker, load_handler
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s worker %(levelname)s %(message)s")
    sys.path.insert(0, ".")
    try:
        handler = load_handler(args.function)
    except ValueError as err:
        fail(str(err), 2, f"{PROG} worker")
    with Client(args.host, args.port) as client:
        worker = Worker(client, args.queue, handler, args.wait_timeout, args.max_jobs)
        worker.install_signal_handlers()
        done = worker.run()
    logging.getLogger("queueserver.worker").info("stopped after %d jobs", done)
    return 0


def build_config(args: argparse.Namespace) -> Config:
    """The file named by ``--config``, then every flag given, each checked under its flag's name."""
    config = Config.load(args.config)
    for key, setting in SERVER.items():
        value = getattr(args, key)
        if value is not None:
            setattr(config, key, setting.check(_flag(setting), value))
            config.explicit.add(key)
    for name, listener in config.listeners.items():
        port = getattr(args, f"{name}_port", None)
        if port is not None:
            listener.port = _port(f"--{name}-port", port)
        if getattr(args, f"no_{name}", False):
            listener.enabled = False
        mode = getattr(args, f"{name}_tls", None)
        if mode is not None:
            listener.tls = str(TLS_LISTENER["tls"].check(f"--{name}-tls", mode))
        tls_port = getattr(args, f"{name}_tls_port", None)
        if tls_port is not None:
            listener.tls_port = _port(f"--{name}-tls-port", tls_port)
        for key, setting in CODEC_OPTIONS[name].items():
            value = getattr(args, f"{name}_{key}")
            if value is not None:
                listener.options[key] = setting.check(_flag(setting), value)
    for key, setting in HISTORY.items():
        value = getattr(args, history_attribute(key))
        if value is not None:
            setattr(config, history_attribute(key), setting.check(_flag(setting), value))
    for key, setting in ACCESS.items():
        value = getattr(args, access_attribute(key))
        if value is not None:
            setattr(config, access_attribute(key), setting.check(_flag(setting), value))
    if config.access_acl is not None:   # a bad access file stops the start, in one line
        from .access import AccessError, load as load_access
        try:
            load_access(config.access_acl)
        except AccessError as err:
            raise ConfigError(str(err)) from None
    if args.metrics_port is not None:
        config.metrics.port = _port("--metrics-port", args.metrics_port)
    if args.no_metrics:
        config.metrics.enabled = False
    if args.metrics_tls is not None:
        config.metrics.tls = "true" if METRICS["tls"].check("--metrics-tls", args.metrics_tls) else "false"
    for key, setting in TLS.items():
        value = getattr(args, tls_attribute(key))
        if value is not None:
            setattr(config, tls_attribute(key), setting.check(_flag(setting), value))
    config.check_tls()
    return config


def build_parser() -> ArgumentParser:
    """The whole command line: ``serve``, ``worker`` and ``history``."""
    # (raw: --version's two lines kept as they are, not wrapped into one)
    parser = ArgumentParser(prog=PROG, description="A multi-protocol job queue server.",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}\n{BUILD}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,worker,history,cluster}")
    _serve_parser(sub)
    _worker_parser(sub)
    _history_parser(sub)
    add_cluster_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "worker":
        return _work(args)
    if args.command == "history":
        return _history(args)
    if args.command == "cluster":
        from .cluster import command as cluster_command
        return cluster_command.run(args)
    serve = f"{PROG} serve"
    try:
        config = build_config(args)
    except ConfigError as err:
        fail(str(err), 2, serve)
    # The client ports first, before the slow parts of a start (imports,
    # shards, replaying logs): an early client waits in the backlog, never
    # refused. (A cluster node learns its ports from the cluster file: its
    # supervisor binds them first thing after reading it.)
    listeners = None
    if config.cluster is None:
        from .listening import BindError, bind_listeners
        try:
            listeners = bind_listeners(config)
        except BindError as err:
            fail(str(err), 2, serve)
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s supervisor %(levelname)s %(message)s")
    from .supervisor import StartupError, Supervisor
    try:
        return Supervisor(config, listeners).run()
    except StartupError as err:
        fail(str(err), err.status, serve)


if __name__ == "__main__":
    sys.exit(main())
