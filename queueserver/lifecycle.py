"""Start-up and shutdown shared by the router and shard processes."""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import resource
import signal
import sys
from typing import List

import gevent
from gevent.event import Event

#: A child's exit status saying "do not restart me": it cannot start, and
#: has logged one line saying why (e.g. a damaged log).
EXIT_REFUSED = 3
#: a replicated shard's exit status when etcd names another node its group's
#: primary (a promotion raced its start): its node runs what etcd says instead
EXIT_DEPOSED = 4

#: The environment variable in which the supervisor gives its children its pid.
SUPERVISOR_PID = "QS_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


def python_command() -> List[str]:
    """How to start a child process (``[*python_command(), "-m", module]``)
    that imports this very package. ``-m`` puts the working directory first
    on ``sys.path``: run from a checkout, an installed server's children
    would import the checkout's sources instead of the install's compiled
    modules. Unless this package came from there, ``-P`` keeps it off."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.realpath(package_parent) == os.path.realpath(os.getcwd()):
        return [sys.executable]
    return [sys.executable, "-P"]


def setup_logging(level: str, name: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s")


def raise_descriptor_limit() -> None:
    """Clients are descriptors (a router's, and a shard's: connections handed
    to it, TLS relays): use all the hard limit allows, as servers do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as err:
            logging.getLogger("queueserver").warning("could not raise the file descriptor limit from %d: %s",
                                                     soft, err)


def supervisor_pid() -> int:
    """The pid of the supervisor that started this process (0: started by hand)."""
    try:
        return int(os.environ.get(SUPERVISOR_PID, "0"))
    except ValueError:
        return 0


def die_with_supervisor() -> None:
    """Be killed the moment the supervisor is gone, whatever killed it.

    A router or shard that outlives its supervisor holds the client ports,
    the link ports and the shard logs that the next server needs (and a
    second shard appending to the same log would damage it). The kernel
    sends SIGKILL when the parent exits (``PR_SET_PDEATHSIG``); everything
    acknowledged is already written, and the supervisor is the one that
    stops children in order.
    """
    expected = supervisor_pid()
    if expected:
        die_with(expected)


def die_with(parent: int) -> None:
    """Be SIGKILLed by the kernel when ``parent`` (this process's parent)
    exits. A parent that died before this call is seen by the parent pid
    having changed: exit at once."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):   # not Linux: no such guard (stop_event watches the parent)
        pass
    if os.getppid() != parent:
        os._exit(1)


def stop_event() -> Event:
    """Set on SIGTERM/SIGINT, or when the supervisor that started us is gone
    (a slower backstop to :func:`die_with_supervisor`, for systems without it)."""
    stop = Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    parent = supervisor_pid() or os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            gevent.sleep(1.0)
        logging.getLogger("queueserver").warning("supervisor gone; stopping")
        stop.set()

    gevent.spawn(watch_parent)
    return stop


#: Allocations of GC-tracked objects between two young-generation collections
#: once a process serves (CPython's default is 700: with a Job per add and a
#: few containers per request, that is a collection every ~200 requests).
SERVING_GC_THRESHOLD = (50_000, 20, 100)


def settle_gc() -> None:
    """Keep the cycle collector off the hot path once start-up is over.

    What start-up made (modules, tables, a recovered shard's jobs) lives as
    long as the process: :func:`gc.freeze` moves it out of every future
    collection's sight. Requests then make objects that reference counting
    frees; the few cycles they leave (a greenlet's frame, a traceback) wait
    for a rarer young collection, and full collections come rarer still."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLD)
