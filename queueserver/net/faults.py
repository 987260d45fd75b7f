"""Fault injection: a node cut off from etcd and the other nodes, on purpose.

Why: the failover tests must show what a primary does when it is alive and
its clients still reach it, but it reaches neither etcd nor the other
nodes (a network partition). Network namespaces per node would need root
and a kernel that allows them; the links' own injection needs neither.

When the environment names a file in ``QS_FAULT_CUT_OFF`` and that file
exists, every process of the node behaves as cut off: its etcd calls fail,
its TCP links to other nodes (routers', shards', followers') fail to connect
and those up are closed, and its shards' link ports drop what others dial
in. Its client ports and Unix sockets are untouched. Removing the file
heals the partition. Without the variable (production), :func:`cut_off` is
one attribute read.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Optional

#: the file whose presence cuts this node off (None: no fault injection)
CUT_OFF_FILE: Optional[str] = os.environ.get("QS_FAULT_CUT_OFF") or None

_checked = 0.0
_state = False


def cut_off() -> bool:
    """Whether this node is cut off now (read at most every 50 ms)."""
    global _checked, _state
    if CUT_OFF_FILE is None:
        return False
    now = time.monotonic()
    if now - _checked > 0.05:
        _checked = now
        _state = os.path.exists(CUT_OFF_FILE)
    return _state


class CutOff(ConnectionError):
    """A connection refused by fault injection."""

    def __init__(self) -> None:
        super().__init__("cut off from the other nodes (fault injection: QS_FAULT_CUT_OFF)")


def watch(on_cut: Callable[[], None], every: float = 0.1) -> None:
    """A greenlet's loop (fault injection only): ``on_cut()`` while cut off,
    each ``every`` seconds (it closes the caller's TCP links to other nodes)."""
    import gevent
    while True:
        gevent.sleep(every)
        if cut_off():
            on_cut()
