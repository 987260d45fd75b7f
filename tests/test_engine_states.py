"""The job state machine, row by row: the state x event table in the
docstring of queueserver/engine/engine.py.

Each row puts job "a" in a starting state through requests, makes one
event happen (a request, or time passing on the fake clock), and reads the
state the job is in afterwards from what a client can see (inspect, the
ready and scheduled lines) and from the events the step recorded.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import pytest

from queueserver.engine import COMPLETED, FAILED, LEASED
from queueserver.engine.status import OK

from engine_helpers import (SEC, T0, Engine, add, complete, exists, fail, job, lease, leased_id,
                            ready_ids, scheduled_ids)

TTR = 1_000   # ms
LATER = T0 + 10 * SEC


def state_of(e: Engine, id: str = "a") -> str:
    """The table's name for the state of job ``id``."""
    if not exists(e, id):
        return "gone"
    if id in ready_ids(e):
        return "READY"
    if id in scheduled_ids(e):
        return "SCHEDULED"
    return {LEASED: "LEASED", COMPLETED: "COMPLETED", FAILED: "FAILED"}[job(e, id)["state"]]


# ---------------------------------------------------------- starting states
def nothing(e: Engine) -> None:
    pass


def ready(e: Engine, **limits) -> None:
    add(e, "a", ttr=TTR, **limits)


def scheduled(e: Engine, **limits) -> None:
    add(e, "a", ttr=TTR, sched=LATER, **limits)


def leased(e: Engine, **limits) -> None:
    ready(e, **limits)
    assert leased_id(lease(e)) == "a"


def leased_to_owner(e: Engine) -> None:
    ready(e)
    reply = e.execute("lease", (["q"], 0, "conn-1"), T0, ("router-1", 7))
    assert reply[0] == OK and reply[1].id == "a"


def completed(e: Engine) -> None:
    leased(e)
    assert complete(e, "a") == [OK, None]


def failed(e: Engine) -> None:
    leased(e)
    assert fail(e, "a") == [OK, None]


def out_of_attempts(e: Engine) -> None:
    """READY with its one attempt spent (leased, then retried)."""
    leased(e, max_attempts=1, max_fails=2)
    assert e.execute("retry", ("a",), T0) == [OK, None]


# ------------------------------------------------------------------- events
def request(op: str, *args) -> Callable[[Engine], None]:
    def make(e: Engine) -> None:
        e.execute(op, args, T0 + 1)
    make.__name__ = op
    return make


def add_job(e: Engine) -> None:
    add(e, "a", ttr=TTR)


def add_scheduled(e: Engine) -> None:
    add(e, "a", ttr=TTR, sched=LATER)


def add_to_a_parked_lessee(e: Engine) -> None:
    assert lease(e, timeout=5_000, token="waiting") is None
    add(e, "a", ttr=TTR)


def take_and_restore(e: Engine) -> None:
    add(e, "a", ttr=TTR)
    taken = e.execute("take", ("q",), T0)
    e.events.clear()   # the row is about the restore
    e.execute("restore", (taken[1],), T0 + 1)


def time_reaches_schedule(e: Engine) -> None:
    e.advance(LATER)


def lease_it(e: Engine) -> None:
    lease(e, now=T0 + 1)


def lease_runs_out(e: Engine) -> None:
    e.advance(T0 + TTR * 1_000)


def owner_goes(e: Engine) -> None:
    e.execute("disown", (("router-1", "conn-1"),), T0 + 1)


def time_to_live_ends(e: Engine) -> None:
    e.advance(T0 + 90 * SEC)


def with_ttl(start: Callable[..., None]) -> Callable[[Engine], None]:
    def make(e: Engine) -> None:
        if start is leased:
            add(e, "a", ttr=120_000, ttl=60_000)
            lease(e)
        else:
            add(e, "a", ttr=TTR, ttl=60_000, **({"sched": T0 + SEC} if start is scheduled else {}))
            if start is completed:
                lease(e)
                complete(e, "a")
    make.__name__ = f"{start.__name__} with a TTL"
    return make


ROWS = [
    # (starting state, event, the event recorded, next state)
    (nothing, add_job, "add", "READY"),
    (nothing, add_scheduled, "add", "SCHEDULED"),
    (nothing, add_to_a_parked_lessee, "lease", "LEASED"),
    (nothing, take_and_restore, "restore", "READY"),
    (scheduled, time_reaches_schedule, "wake", "READY"),
    (ready, lease_it, "lease", "LEASED"),
    (out_of_attempts, lease_it, "exhaust", "FAILED"),
    (leased, request("unlease", "a", 1), "unlease", "READY"),
    (leased, lease_runs_out, "ttr", "READY"),
    (lambda e: leased(e, max_attempts=1), lease_runs_out, "ttr", "FAILED"),
    (leased_to_owner, owner_goes, "release", "READY"),
    (ready, request("complete", "a", b"r"), "complete", "COMPLETED"),
    (scheduled, request("complete", "a", b"r"), "complete", "COMPLETED"),
    (leased, request("complete", "a", b"r"), "complete", "COMPLETED"),
    (lambda e: leased(e, max_fails=2), request("fail", "a", b"e"), "fail", "READY"),
    (leased, request("fail", "a", b"e"), "fail", "FAILED"),
    (lambda e: ready(e, max_fails=2), request("fail", "a", b"e"), "fail", "READY"),
    (lambda e: scheduled(e, max_fails=2), request("fail", "a", b"e"), "fail", "SCHEDULED"),
    (ready, request("fail", "a", b"e"), "fail", "FAILED"),
    (lambda e: leased(e, max_fails=2), request("retry", "a"), "retry", "READY"),
    (lambda e: scheduled(e, max_fails=2), request("retry", "a"), "retry", "READY"),
    (ready, request("delete", "a"), "delete", "gone"),
    (ready, request("take", "q"), "take", "gone"),
    (scheduled, request("delete", "a"), "delete", "gone"),
    (leased, request("delete", "a"), "delete", "gone"),
    (completed, request("delete", "a"), "delete", "gone"),
    (failed, request("delete", "a"), "delete", "gone"),
    (with_ttl(ready), time_to_live_ends, "ttl", "gone"),
    (with_ttl(scheduled), time_to_live_ends, "ttl", "gone"),
    (with_ttl(leased), time_to_live_ends, "ttl", "gone"),
    (with_ttl(completed), time_to_live_ends, "ttl", "gone"),
]


def _name(row) -> str:
    start, event, _, after = row
    return f"{getattr(start, '__name__', 'start')}-{event.__name__}-{after}"


@pytest.mark.parametrize("start, event, recorded, after", ROWS, ids=[_name(r) for r in ROWS])
def test_state_table_row(start, event, recorded: str, after: str):
    e = Engine()
    start(e)
    before: Optional[str] = state_of(e) if start is not nothing else None
    e.events.clear()
    event(e)
    kinds: List[str] = [ev[0] for ev in e.events if len(ev) > 1 and ev[1] == "a"]
    assert recorded in kinds, (before, kinds)
    assert state_of(e) == after


@pytest.mark.parametrize("start", [completed, failed])
def test_a_finished_job_refuses_another_outcome_and_records_nothing(start):
    e = Engine()
    start(e)
    e.events.clear()
    assert complete(e, "a")[1] == "Duplicate result"
    assert e.events == []
