"""The ``queueserver`` command."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from .config import Config
from .protocols import DEFAULT_PORTS


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the server (router + shard processes)",
                       description="Run the queue server: one router, N shard processes.")
    p.add_argument("--config", metavar="FILE", help="TOML configuration file")
    p.add_argument("--shards", type=int, metavar="N", help="shard processes (default: one per CPU)")
    p.add_argument("--routers", type=int, metavar="N",
                   help="router processes sharing the client ports (default 1; on many cores, "
                        "about one per four cores)")
    p.add_argument("--bind", metavar="ADDR", help="address every listener binds (default 127.0.0.1)")
    for name, port in DEFAULT_PORTS.items():
        p.add_argument(f"--{name}-port", type=int, metavar="PORT", dest=f"{name}_port",
                       help=f"{name} protocol port (default {port}; 0 picks a free port)")
        p.add_argument(f"--no-{name}", action="store_true", dest=f"no_{name}",
                       help=f"do not listen for the {name} protocol")
    p.add_argument("--allow-dups", action="store_true", default=None,
                   help="queued: keep duplicate items (default: drop an item the queue already holds)")
    p.add_argument("--reservation-timeout", type=int, metavar="MS",
                   help="takeanumber: a reserved job returns to its queue after MS milliseconds "
                        "(default 0: never)")
    p.add_argument("--runtime-dir", metavar="DIR",
                   help="private directory for shard sockets (default: a fresh temporary one)")
    p.add_argument("--log-level", metavar="LEVEL", help="debug, info, warning or error (default info)")


def _worker_parser(sub) -> None:
    p = sub.add_parser("worker", help="run a worker that calls module:function for each job",
                       description="Lease jobs in a loop, call FUNCTION(job) and complete the job "
                                   "with its return value, or fail it with the traceback.")
    p.add_argument("function", metavar="module:function")
    p.add_argument("--queue", action="append", required=True, metavar="NAME",
                   help="queue to lease from (repeat for several)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9922)
    p.add_argument("--wait-timeout", type=int, default=1000, metavar="MS",
                   help="lease wait per round; bounds how long a stop takes (default 1000)")
    p.add_argument("--max-jobs", type=int, metavar="N", help="stop after N jobs")
    p.add_argument("--log-level", default="info")


def _work(args: argparse.Namespace) -> int:
    from .client import Client
    from .worker import Worker, load_handler
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s worker %(levelname)s %(message)s")
    sys.path.insert(0, ".")
    handler = load_handler(args.function)
    with Client(args.host, args.port) as client:
        worker = Worker(client, args.queue, handler, args.wait_timeout, args.max_jobs)
        worker.install_signal_handlers()
        done = worker.run()
    logging.getLogger("queueserver.worker").info("stopped after %d jobs", done)
    return 0


def build_config(args: argparse.Namespace) -> Config:
    config = Config.load(args.config)
    for key in ("shards", "routers", "bind", "runtime_dir", "log_level"):
        value = getattr(args, key)
        if value is not None:
            setattr(config, key, value)
    for name, listener in config.listeners.items():
        port = getattr(args, f"{name}_port", None)
        if port is not None:
            listener.port = port
        if getattr(args, f"no_{name}", False):
            listener.enabled = False
    if args.allow_dups:
        config.listeners["queued"].options["allow_dups"] = True
    if args.reservation_timeout is not None:
        config.listeners["takeanumber"].options["reservation_timeout"] = args.reservation_timeout
    if config.shards < 1 or config.routers < 1:
        raise ValueError("--shards and --routers must be at least 1")
    return config


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="queueserver", description="A multi-protocol job queue server.")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _worker_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "worker":
        return _work(args)
    if args.command == "serve":
        try:
            config = build_config(args)
        except (OSError, ValueError) as err:
            parser.error(str(err))
        logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                            format="%(asctime)s supervisor %(levelname)s %(message)s")
        from .supervisor import Supervisor
        return Supervisor(config).run()
    return 2


if __name__ == "__main__":
    sys.exit(main())
