"""Start-up and shutdown shared by the router and shard processes."""
from __future__ import annotations

import logging
import os
import signal
import sys

import gevent
from gevent.event import Event

#: A child's exit status saying "do not restart me": it cannot start, and
#: has logged one line saying why (e.g. a damaged log).
EXIT_REFUSED = 3


def setup_logging(level: str, name: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")


def stop_event() -> Event:
    """Set on SIGTERM/SIGINT, or when the supervisor that started us is gone."""
    stop = Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            gevent.sleep(1.0)
        logging.getLogger("queueserver").warning("supervisor gone; stopping")
        stop.set()

    gevent.spawn(watch_parent)
    return stop
