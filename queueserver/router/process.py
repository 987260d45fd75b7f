"""The router process: read the supervisor's config, make the router (a
:class:`~.clusterrouter.ClusterRouter` in a cluster), wait for this host's
shards, serve the listeners it inherits and its control socket until told
to stop. Run with ``python -m queueserver.router`` (the supervisor does).

The one module that knows the router and its cluster subclass and
statistics both, so that none of those imports another above it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Final, List, Optional

import gevent

from .. import memwatch
from ..access import AccessError
from ..lifecycle import die_with_supervisor, raise_descriptor_limit, settle_gc, setup_logging, stop_event
from ..net.tls import TLSConfigError, TLSFiles
from .config import RouterConfig
from .router import Router

log: Final = logging.getLogger("queueserver.router")

CONNECT_TIMEOUT: Final = 10.0        # seconds a router waits for this host's shards before it serves


def main(argv: Optional[List[str]] = None) -> None:
    die_with_supervisor()   # first: a supervisor gone before we run must not leave us behind
    parser = argparse.ArgumentParser(prog="queueserver-router")
    parser.add_argument("--config", required=True, help="JSON: sockets, listeners, options")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, "router")
    stop = stop_event()
    config: RouterConfig = json.loads(args.config)   # the supervisor's, as JSON
    raise_descriptor_limit()
    arguments = (config.get("options"), config.get("index", 0), config.get("routers", 1),
                 config.get("limits"), config.get("direct_path", False), config.get("history", False))
    router: Router
    if config.get("cluster"):
        from .clusterrouter import ClusterRouter   # a cluster's modules: only in a cluster
        router = ClusterRouter.from_config(config["cluster"], config["sockets"], *arguments)
    else:
        router = Router(config["sockets"], *arguments, numbers=config.get("numbers"))
    gevent.signal_handler(signal.SIGHUP, router.reload)   # the supervisor passes its SIGHUP on
    access = config.get("access")
    if access is not None:
        try:
            router.use_access(access)
        except AccessError as err:   # the supervisor checked it; it changed since
            log.error("router %d cannot start: %s", router.index, err)
            sys.exit(2)
    # Serve once this host's shards are linked (or the connect timeout has passed).
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while not all(link.up for link in router.links if link.local) and time.monotonic() < deadline:
        gevent.sleep(0.02)
    tls = config.get("tls")
    if tls is not None:
        try:
            router.use_tls(TLSFiles(tls["certificate"], tls["key"], tls["client_ca"]), tls["handshake_timeout"])
        except TLSConfigError as err:   # the supervisor checked them at start: changed since
            log.error("router %d: %s; serving no TLS port", config.get("index", 0), err)
    for protocol, fd in config["listen_fds"].items():
        router.listen(protocol, fd)
    if router.tls is not None:
        for protocol, fd in config.get("tls_fds", {}).items():
            router.listen(protocol, fd, tls=True)
    # /metrics: the supervisor asks for this router's counters there; on etcd, it tells the cluster's state there
    control = config.get("control")
    if control:
        from ..metrics.control import serve_control
        from .stats import router_stats
        serve_control(control, lambda: router_stats(router), router.console_request, router.cluster_request)
    if config.get("ready_file"):
        with open(config["ready_file"], "w") as f:
            f.write(str(os.getpid()))
    settle_gc()
    memwatch.start(f"router-{config.get('index', 0)}")
    stop.wait()
    router.stop()
    if control and os.path.exists(control):
        os.unlink(control)
    log.info("router exiting")
