"""What the engine answers about a job, and how an undelivered job is given back."""
from engine_helpers import Engine
from queueserver.engine.status import NOT_FOUND, OK
from queueserver.engine.views import LeaseView, as_lease, undo_delivery

T0 = 1_700_000_000_000_000


def leased(e: Engine) -> list:
    e.execute("add", ("a", "q", b"p", 0, 1000, 0, -1, 0, None, False), T0)
    reply = e.execute("lease", (["q"], 0), T0, (1, 1))
    assert reply[0] == OK
    return reply


def test_a_lease_view_is_named_and_survives_the_link_as_a_list():
    view = leased(Engine(shard=1))[1]
    assert isinstance(view, LeaseView) and view.id == "a" and view.payload == b"p" and view.shard == 1
    assert as_lease(list(view)) == view


def test_undo_delivery_gives_back_leases_and_takes_and_nothing_else():
    e = Engine()
    reply = leased(e)
    assert undo_delivery("lease", reply)[:2] == ("unlease", ["a", 1])
    assert undo_delivery("take", reply)[:2] == ("restore", [reply[1]])
    assert undo_delivery("result", [OK, ["a", 1, b""]]) is None   # no job was handed over
    assert undo_delivery("lease", [NOT_FOUND, ""]) is None
    op, args, _ = undo_delivery("lease", [OK, list(reply[1])])      # as a router receives it
    e.execute(op, args, T0)
    assert e.execute("lease", (["q"], 0), T0, (1, 2))[1].attempts == 1
