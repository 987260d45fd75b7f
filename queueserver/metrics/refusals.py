"""Requests and connections refused by the access rules, counted by identity and verb.

A module-level map updated in place, like :mod:`.traffic`: a router counts
the refusals of the connections it serves, a shard those of connections
moved to it. The supervisor adds every process's map up for ``/metrics``
(``queueserver_access_refusals_total{identity, verb}``). Connections refused
at connect count under the identity ``unknown`` and the verb ``connect``.

The supervisor counts here too: its HTTP port's refusals, from request
threads, hence the lock (taken only by a refusal and a scrape).

Each refusal is logged too, at most once per :data:`LOG_INTERVAL` per
identity and verb, with how many there were since: a client hammering a
queue it may not use must not fill the log, nor hide another's refusals.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Dict, Final, List, Tuple

log: Final = logging.getLogger("queueserver.access")

#: The identity a connection refused at connect is counted under, and its verb.
UNKNOWN: Final = "unknown"
CONNECT: Final = "connect"
#: Seconds between two log lines about refusals.
LOG_INTERVAL: Final = 10.0

#: identity -> verb -> refusals
COUNTS: Final[Dict[str, Dict[str, int]]] = {}
#: (identity, verb) -> [when its last line was written, its refusals since]
_LOGGED: Final[Dict[Tuple[str, str], List[float]]] = {}
_LOCK: Final = threading.Lock()


def refused(identity: str, verb: str, message: str) -> None:
    """Count one refusal and log it (rate-limited)."""
    with _LOCK:
        _count(identity, verb, message)


def _count(identity: str, verb: str, message: str) -> None:
    by_verb = COUNTS.get(identity)
    if by_verb is None:
        by_verb = COUNTS[identity] = {}
    by_verb[verb] = by_verb.get(verb, 0) + 1
    logged = _LOGGED.get((identity, verb))
    if logged is None:
        logged = _LOGGED[(identity, verb)] = [-LOG_INTERVAL, 0]
    logged[1] += 1
    now = time.monotonic()
    if now - logged[0] >= LOG_INTERVAL:
        log.warning("refused: %s (%d such refused since the last message)", message, logged[1])
        logged[0], logged[1] = now, 0


def snapshot() -> Dict[str, Dict[str, int]]:
    with _LOCK:
        return {identity: dict(verbs) for identity, verbs in COUNTS.items()}

