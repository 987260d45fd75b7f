"""Which job a lease takes: priority, then scheduled/creation time, then
arrival; the fields of a lease.

Fake clock (µs), never a sleep: helpers and constants in engine_helpers.py.
"""
from __future__ import annotations

from engine_helpers import Engine
from queueserver.engine.status import OK

from engine_helpers import SEC, T0, add, lease, lease_all


# -------------------------------------------------------------------- ordering
def test_higher_priority_is_leased_first():
    e = Engine()
    add(e, "low", priority=-5)
    add(e, "mid", priority=0)
    add(e, "high", priority=10)
    assert lease_all(e) == ["high", "mid", "low"]


def test_fifo_within_equal_priority():
    e = Engine()
    for i in range(5):
        add(e, f"j{i}", now=T0)  # same microsecond: arrival decides
    assert lease_all(e) == ["j0", "j1", "j2", "j3", "j4"]


def test_earlier_creation_first_within_equal_priority():
    e = Engine()
    add(e, "first", now=T0)
    add(e, "second", now=T0 + 1)
    add(e, "third", now=T0 + 2)
    assert lease_all(e, now=T0 + 3) == ["first", "second", "third"]


def test_earlier_creation_beats_smaller_number():
    e = Engine()
    add(e, "older", number=10, now=T0)
    add(e, "newer", number=3, now=T0 + 1)
    assert lease_all(e, now=T0 + 2) == ["older", "newer"]


def test_earlier_scheduled_time_first_even_if_created_later():
    e = Engine()
    add(e, "late-sched", sched=T0 + 5 * SEC, now=T0)
    add(e, "early-sched", sched=T0 + 3 * SEC, now=T0 + 1 * SEC)
    e.advance(T0 + 5 * SEC)
    assert lease_all(e, now=T0 + 5 * SEC) == ["early-sched", "late-sched"]


def test_scheduled_time_orders_against_plain_jobs():
    e = Engine()
    add(e, "sched", sched=T0 + 2 * SEC, now=T0)          # ready from T0+2s
    add(e, "plain", now=T0 + 1 * SEC)                    # ready from T0+1s
    add(e, "plain-later", now=T0 + 3 * SEC)
    e.advance(T0 + 3 * SEC)
    assert lease_all(e, now=T0 + 3 * SEC) == ["plain", "sched", "plain-later"]


def test_priority_beats_schedule_and_creation():
    e = Engine()
    add(e, "old", priority=0, now=T0)
    add(e, "sched-high", priority=3, sched=T0 + SEC, now=T0)
    e.advance(T0 + SEC)
    add(e, "new-high", priority=3, now=T0 + 2 * SEC)
    assert lease_all(e, now=T0 + 2 * SEC) == ["sched-high", "new-high", "old"]


def test_lease_view_fields():
    e = Engine(shard=3)
    assert add(e, "a", name="q", payload=b"ping", priority=7, ttr=1500, number=99)[0] == OK
    reply = lease(e)
    assert reply[0] == OK
    id, name, payload, number, priority, ttr, attempts, _order, shard = reply[1]
    assert (id, name, payload, number, priority, ttr, attempts, shard) == \
        ("a", "q", b"ping", 99, 7, 1500, 1, 3)
