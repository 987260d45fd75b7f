"""With ``history`` on, each step also reports every event's job as it is
right after the event (the shard's job history is written from that)."""
from __future__ import annotations

from queueserver.engine import COMPLETED, LEASED, PENDING, Engine as PureEngine
from queueserver.engine.status import OK

from engine_helpers import SEC, T0, add


def history_of(fx):
    return [(kind, id, queue, attempts, state) for kind, id, queue, _n, attempts, _p, _s, state, _t
            in fx.history]


def test_each_event_reports_its_job_after_it():
    e = PureEngine()
    e.history = True
    fx = e.execute("add", ("a", "q", b"12345", 0, 1_000, 60_000, 0, 2), T0)
    assert [h[:3] + h[6:7] for h in fx.history] == [("add", "a", "q", 5)]
    fx = e.execute("lease", (["q"], 0), T0)
    assert history_of(fx) == [("lease", "a", "q", 1, LEASED)]
    fx = e.advance(T0 + 2 * SEC)                  # the lease runs out: back in line
    assert history_of(fx) == [("ttr", "a", "q", 1, PENDING)]
    e.execute("lease", (["q"], 0), T0 + 2 * SEC)
    fx = e.execute("complete", ("a", b"r"), T0 + 3 * SEC)
    assert history_of(fx) == [("complete", "a", "q", 2, COMPLETED)]
    fx = e.execute("delete", ("a",), T0 + 4 * SEC)
    assert history_of(fx) == [("delete", "a", "q", 2, COMPLETED)]   # as it was when it went


def test_a_take_is_its_own_event_and_history_is_off_by_default():
    e = PureEngine()
    assert e.execute("add", ("a", "q", b"p"), T0).history is None
    e.history = True
    fx = e.execute("take", ("q",), T0)
    assert fx.reply[0] == OK and [h[0] for h in fx.history] == ["take"]
    assert fx.forgotten == ["a"]


def test_an_add_served_to_a_parked_lessee_reports_both():
    e = PureEngine()
    e.history = True
    assert e.execute("lease", (["q"], 5_000), T0, "w").reply is None
    fx = e.execute("add", ("a", "q", b"p", 0, 1_000), T0)
    # In order; values are read once the step is over (the add's job is leased by then).
    assert [(h[0], h[4], h[7]) for h in fx.history] == [("add", 1, LEASED), ("lease", 1, LEASED)]
    assert fx.history[1][8] == "w"      # the lease went to the parked request
