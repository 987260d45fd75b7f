"""Which protocols' clients used each queue, for the console's overview.

Kept where a client's request is executed and its protocol is known: a
router (:meth:`queueserver.router.router.Router.execute`) and a shard's
direct path (:meth:`queueserver.shard.direct.DirectServer.execute`). Each
keeps a dict ``queue name -> protocols`` (a sorted tuple); a request costs
one dict lookup and a look into that tuple, and only a queue's first use by
a protocol calls :func:`note_use`. Past :data:`MAX_QUEUES` names the dict
starts over, so it stays small whatever the clients do; it says which
protocols used a queue since the process started (or started over).

A router answers ``["console", "uses"]`` on its control socket with
:func:`router_answer`; a shard puts its direct path's in its
``["console", "queues"]`` answer (:mod:`queueserver.shard.console`).
"""
from __future__ import annotations

from typing import Any, Dict, Final, List, Sequence, Tuple

from ..protocols.base import BY_NAME, BY_NAMES

#: queue name -> the protocols that used it, sorted
Uses = Dict[str, Tuple[str, ...]]
#: Queue names one process remembers.
MAX_QUEUES: Final = 100_000


def note_use(uses: Uses, name: str, protocol: str) -> None:
    """``protocol``'s client used queue ``name`` (the caller saw that it was not known yet)."""
    seen = uses.get(name, ())
    if protocol in seen:
        return
    if not seen and len(uses) >= MAX_QUEUES:
        uses.clear()
    uses[name] = tuple(sorted((*seen, protocol)))


def note_command(uses: Uses, route: int, key: Any, protocol: str) -> None:
    """A client's command about queue ``key`` (``route`` BY_NAME) or queues
    (BY_NAMES): note each queue its protocol uses, once (a dict lookup each
    time, the rest only the first time)."""
    if route == BY_NAME:
        seen = uses.get(key)
        if seen is None or protocol not in seen:
            note_use(uses, key, protocol)
    elif route == BY_NAMES:
        for name in key:
            seen = uses.get(name)
            if seen is None or protocol not in seen:
                note_use(uses, name, protocol)


def merge(into: Dict[str, List[str]], more: Dict[str, Sequence[str]]) -> None:
    """Add one process's uses (as a control answer carries them) to ``into``."""
    for name, protocols in more.items():
        known = into.setdefault(name, [])
        for protocol in protocols:
            if protocol not in known:
                known.append(protocol)
                known.sort()


def router_answer(uses: Uses, request: Sequence[Any]) -> Dict[str, Any]:
    """A router's answer to a console request: only ``["console", "uses"]``."""
    if len(request) >= 2 and request[1] == "uses":
        return {"uses": {name: list(protocols) for name, protocols in uses.items()}}
    return {"error": f"a router answers only [\"console\", \"uses\"], not {list(request)!r:.100}",
            "status": 400}
