"""Helpers for the unit tests of the pure job engine (queueserver.engine),
tests/test_engine_*.py.

The engine has no clock: every call takes ``now`` in integer microseconds and
timers fire only through ``engine.advance(now)``. These tests drive time with
an explicit fake clock and never sleep. The expected behaviour is workq's
(docs/protocols.md), with takeanumber's RETRY rules for ``retry``.
"""
from __future__ import annotations

import inspect
from typing import Any

from queueserver.engine import Engine as PureEngine
from queueserver.engine.engine import REQUESTS
from queueserver.engine.effects import Effects
from queueserver.engine.status import NOT_FOUND, OK, TIMEOUT

T0 = 1_700_000_000_000_000  # fake "now", µs since the epoch
MS = 1_000                  # µs per millisecond
SEC = 1_000_000             # µs per second

FIELDS = ("id", "name", "ttr", "ttl", "payload", "max_attempts", "attempts",
          "max_fails", "fails", "priority", "state", "created", "sched")


class Engine:
    """The engine as these tests drive it: ``execute`` gives the request's
    own reply, and the rest of each step's effects pile up where a test can
    look (``outbox``: answers to parked requests; ``events``, ``placed``,
    ``forgotten``), as a shell would carry them out. Everything else is the
    real engine's (``inner``): a wrapper, not a subclass, since a compiled
    engine takes no interpreted subclass."""

    _OWN = frozenset(("inner", "outbox", "events", "placed", "forgotten"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.inner = PureEngine(*args, **kwargs)
        self.outbox: list = []
        self.events: list = []
        self.placed: list = []
        self.forgotten: list = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def execute(self, op, args, now, token=None):
        return self._keep(self.inner.execute(op, args, now, token)).reply

    def advance(self, now):
        self._keep(self.inner.advance(now))

    def _keep(self, fx: Effects) -> Effects:
        self.outbox += fx.later
        self.events += fx.events
        self.placed += fx.placed
        self.forgotten += fx.forgotten
        return fx


def _request_params(op):
    """The positional argument names of request ``op`` (after self, now, token)."""
    return list(inspect.signature(REQUESTS[op]).parameters)[3:]


def add(e, id, name="q", payload=b"payload", priority=0, ttr=60_000, ttl=3_600_000,
        max_attempts=0, max_fails=0, sched=None, number=0, now=T0):
    # Built by parameter name so optional engine parameters (e.g. a protocol
    # flag inserted before ``number``) keep their defaults.
    return call(e, "add", now, None, id=id, name=name, payload=payload, priority=priority,
                ttr=ttr, ttl=ttl, max_attempts=max_attempts, max_fails=max_fails,
                sched=sched, number=number)


def call(e, op, now, token, **given):
    """``execute(op, ...)`` with the positional args laid out by parameter name."""
    defaults = inspect.signature(REQUESTS[op]).parameters
    args = tuple(given[p] if p in given else defaults[p].default for p in _request_params(op))
    return e.execute(op, args, now, token)


def lease(e, names=("q",), timeout=0, now=T0, token=None):
    return e.execute("lease", (list(names), timeout), now, token)


def leased_id(reply):
    assert reply[0] == OK, reply
    return reply[1][0]


def complete(e, id, result=b"result", now=T0):
    return e.execute("complete", (id, result), now)


def fail(e, id, result=b"error", now=T0):
    return e.execute("fail", (id, result), now)


def result(e, id, timeout=0, now=T0, token=None):
    return e.execute("result", (id, timeout), now, token)


def run(e, id, name="q", payload=b"payload", priority=0, ttr=5_000, timeout=1_000,
        now=T0, token="run-caller"):
    return call(e, "run", now, token, id=id, name=name, payload=payload, priority=priority,
                ttr=ttr, timeout=timeout, number=0)


def job(e, id):
    reply = e.execute("inspect_job", (id,), T0)
    assert reply[0] == OK, reply
    return dict(zip(FIELDS, reply[1]))


def exists(e, id):
    reply = e.execute("inspect_job", (id,), T0)
    assert reply[0] in (OK, NOT_FOUND), reply
    return reply[0] == OK


def ready_ids(e, name="q"):
    reply = e.execute("inspect_jobs", (name, 0, 1000), T0)
    assert reply[0] == OK, reply
    return [view[0] for view in reply[1]]


def scheduled_ids(e, name="q"):
    reply = e.execute("inspect_scheduled", (name, 0, 1000), T0)
    assert reply[0] == OK, reply
    return [view[0] for view in reply[1]]


def size(e, name="q"):
    reply = e.execute("size", (name,), T0)
    assert reply[0] == OK
    return reply[1]


def server(e):
    reply = e.execute("inspect_server", (), T0)
    assert reply[0] == OK
    return reply[1]


def drain(e):
    out = list(e.outbox)
    e.outbox.clear()
    return out


def lease_all(e, names=("q",), now=T0):
    """Lease until empty; the ids in serving order."""
    ids = []
    while True:
        reply = lease(e, names, 0, now)
        if reply[0] == TIMEOUT:
            return ids
        ids.append(leased_id(reply))
