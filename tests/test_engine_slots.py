"""A cluster shard's slots in the pure engine: giving slots away sets their
jobs aside exactly, the receiver takes them with their leases' deadlines,
repeats change nothing, and the log (events, or a compacted snapshot)
replays to the same ownership. Fake clock (µs), never a sleep."""
from __future__ import annotations

from engine_helpers import MS, SEC, T0, Engine, add, complete, job, lease, leased_id, ready_ids, result
from queueserver.placement import SLOTS, from_ranges, slot_of, to_ranges
from queueserver.engine import LEASED
from queueserver.engine.ownership import MOVING, NOT_OURS, SERVING
from queueserver.engine.status import CLIENT_ERROR, OK, TIMEOUT


def owner(ranges=((0, SLOTS),)) -> Engine:
    e = Engine(shard=0, shards=250)
    assert e.execute("claim", [[list(r) for r in ranges]], T0) == [OK, None]
    return e


def ranges_of(*names):
    return to_ranges(slot_of(name) for name in names)


def test_slot_math():
    assert to_ranges([5, 1, 2, 3, 9]) == [[1, 4], [5, 6], [9, 10]]
    assert from_ranges([[1, 4], [9, 10]]) == [1, 2, 3, 9]
    assert 0 <= slot_of("anything") < SLOTS
    from queueserver.cluster import command
    assert command.SLOTS == SLOTS   # the command line's copy (it loads without xxhash)


def test_a_move_carries_ready_scheduled_leased_and_finished_jobs_exactly():
    giver, taker = owner(), Engine(shard=1, shards=250)
    taker.execute("claim", [[]], T0)
    add(giver, "ready", name="q", now=T0)
    add(giver, "later", name="q", sched=T0 + 60 * SEC, now=T0)
    add(giver, "leased", name="q", ttr=30_000, now=T0)
    add(giver, "done", name="q", now=T0)
    add(giver, "stays", name="other", now=T0)
    assert leased_id(lease(giver, ("q",), now=T0)) == "ready"
    assert leased_id(lease(giver, ("q",), now=T0)) == "leased"
    assert leased_id(lease(giver, ("q",), now=T0)) == "done"
    complete(giver, "done", b"kept", now=T0)
    add(giver, "ready2", name="q", now=T0)
    waiting = giver.execute("lease", [["q"], 10_000], T0 + 1, token="parked")
    assert waiting[0] == OK   # ready2 is taken at once; park another
    assert giver.execute("lease", [["q"], 10_000], T0 + 2, token="parked2") is None
    ranges = ranges_of("q")
    assert slot_of("other") not in from_ranges(ranges)   # (xxhash: fixed for these two names)
    reply = giver.execute("move_out", [ranges, 1, 7], T0 + SEC)
    assert reply[0] == OK and reply[1]["next"] is None
    jobs = reply[1]["jobs"]
    moved = {event[1] for event in jobs}
    assert moved == {"ready", "later", "leased", "done", "ready2"}
    assert set(giver.jobs) == {"stays"}
    assert ("parked2", [TIMEOUT, ""]) in giver.outbox           # its queue fills elsewhere now
    assert giver.slots.state[slot_of("q")] == MOVING
    assert giver.execute("move_out", [ranges, 1, 7], T0 + 2 * SEC) == reply   # asked again: the same
    assert taker.execute("move_in", [ranges, 7, jobs], T0 + 2 * SEC) == [OK, 5]
    assert taker.execute("move_in", [ranges, 7, jobs], T0 + 3 * SEC) == [OK, 0]   # a repeat
    assert giver.execute("move_done", [7], T0 + 3 * SEC) == [OK, None]
    assert giver.slots.state[slot_of("q")] == NOT_OURS
    assert giver.slots.hints[slot_of("q")] == (1, 7)
    assert taker.slots.state[slot_of("q")] == SERVING
    assert job(taker, "leased")["state"] == LEASED
    assert result(taker, "done")[1].result == b"kept"
    assert job(taker, "ready")["state"] == LEASED and job(taker, "ready2")["state"] == LEASED
    assert ready_ids(taker, "q") == []
    # the lease keeps its deadline (T0 + 30 s), not a fresh TTR from the move
    taker.advance(T0 + 29 * SEC)
    assert job(taker, "leased")["state"] == LEASED
    taker.advance(T0 + 31 * SEC)
    assert job(taker, "leased")["state"] != LEASED
    # the scheduled one wakes at its time
    taker.advance(T0 + 61 * SEC)
    assert "later" in ready_ids(taker, "q")


def test_a_slot_not_served_is_refused_and_moves_replay_from_the_log_and_a_snapshot():
    giver = owner([(0, 100)])
    add(giver, "x", name="q", now=T0)
    assert giver.execute("move_out", [[[200, 300]], 1, 2], T0)[0] == CLIENT_ERROR
    name = next(f"n{i}" for i in range(10_000) if slot_of(f"n{i}") < 100)
    add(giver, "y", name=name, ttr=10_000, now=T0)
    lease(giver, (name,), now=T0)
    giver.execute("move_out", [to_ranges([slot_of(name)]), 3, 5], T0)   # left under way
    replayed = Engine(shard=0, shards=250)
    replayed.replay(giver.events)
    snap = Engine(shard=0, shards=250)
    snap.replay(list(giver.snapshot()))
    for e in (replayed, snap):
        assert bytes(e.slots.state) == bytes(giver.slots.state)
        assert e.slots.moves[5].ids == {"y"}
        assert "y" not in e.jobs
        assert e.execute("move_out", [to_ranges([slot_of(name)]), 3, 5], T0)[1] == \
            giver.execute("move_out", [to_ranges([slot_of(name)]), 3, 5], T0)[1]
        e.execute("move_done", [5], T0)
        assert e.slots.moves == {} and e.slots.hints[slot_of(name)] == (3, 5)
    empty = Engine(shard=0, shards=250)
    empty.execute("claim", [[]], T0)
    again = Engine(shard=0, shards=250)
    again.replay(list(empty.snapshot()))
    assert again.slots is not None and again.slots.owned() == 0   # still a cluster shard owning none
    assert again.execute("claim", [[[0, 10]]], T0) == [OK, None] and again.slots.owned() == 0


def test_a_result_waiter_of_a_moving_job_is_answered_and_the_receiver_offers_its_jobs():
    giver, taker = owner(), Engine(shard=1, shards=250)
    taker.execute("claim", [[]], T0)
    add(giver, "a", name="q", now=T0)
    assert giver.execute("result", ["a", 5_000], T0, token="waiter") is None
    assert taker.execute("lease", [["q"], 5_000], T0, token="worker") is None  # parked at the receiver
    reply = giver.execute("move_out", [ranges_of("q"), 1, 3], T0 + MS)
    assert ("waiter", [TIMEOUT, ""]) in giver.outbox
    taker.execute("move_in", [ranges_of("q"), 3, reply[1]["jobs"]], T0 + 2 * MS)
    delivered = [r for token, r in taker.outbox if token == "worker"]
    assert delivered and delivered[0][0] == OK


def test_a_slot_of_big_jobs_moves_in_parts_and_is_served_only_after_the_last():
    giver, taker = owner(), Engine(shard=1, shards=250)
    taker.execute("claim", [[]], T0)
    for i in range(10):
        add(giver, f"big{i}", name="q", payload=b"x" * 1000, now=T0)
    ranges = ranges_of("q")
    start, parts, got = 0, 0, []
    while start is not None:
        reply = giver.execute("move_out", [ranges, 1, 4, start, 2500], T0)
        part, start = reply[1]["jobs"], reply[1]["next"]
        assert 1 <= len(part) <= 3
        taker.execute("move_in", [ranges, 4, part, start is None], T0)
        assert taker.slots.serving(slot_of("q")) == (start is None)
        got += [event[1] for event in part]
        parts += 1
    assert parts >= 4 and sorted(got) == sorted(f"big{i}" for i in range(10))
    # a part sent again replaces what it brought (the giver's copy is the right one)
    again = giver.execute("move_out", [ranges, 1, 4, 0, 2500], T0)[1]["jobs"]
    taker2 = Engine(shard=2, shards=250)
    taker2.execute("claim", [[]], T0)
    taker2.execute("move_in", [ranges, 4, again, False], T0)
    taker2.execute("move_in", [ranges, 4, again, False], T0)
    assert len(taker2.jobs) == len(again) and not taker2.slots.serving(slot_of("q"))
