"""An id home's claims (``shard/idhome.py``, ``shard/homes.py``), sans I/O:
the other shards are a dict of the ids they hold, asked through a callback
whose answers the test releases when it chooses."""
import gc
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from queueserver.engine.status import NOT_FOUND, OK, Reply
from queueserver.engine import Engine
from queueserver.shard.homes import REQUESTS as HOME_REQUESTS, ClaimVerdicts, Homes
from queueserver.shard.idhome import IdHome

Asked = Tuple[int, str, List[Any], Callable[[Reply], None]]


class World:
    """Home shard 0 of shards 0-2; ``held[shard]``: the job ids it holds."""

    def __init__(self) -> None:
        self.held: Dict[int, Set[str]] = {0: set(), 1: set(), 2: set()}
        self.asked: List[Asked] = []
        self.home = IdHome(0, lambda id: id in self.held[0], self._ask)

    def _ask(self, shard: int, op: str, args: List[Any], callback: Callable[[Reply], None]) -> None:
        self.asked.append((shard, op, args, callback))

    def answer_all(self) -> None:
        """Each shard asked answers from what it holds now."""
        asked, self.asked = self.asked, []
        for shard, op, args, callback in asked:
            assert op == "exists"
            callback([OK, True] if args[0] in self.held[shard] else [NOT_FOUND, ""])

    def ready(self) -> "World":
        self.home.expect(())
        return self


def test_a_new_id_is_granted_at_once_and_a_second_claim_of_it_is_checked() -> None:
    w = World().ready()
    assert w.home.claim_now("a", 1) is True
    w.held[1].add("a")
    assert w.home.claim_now("a", 1) is True      # its own entry: the same shard again
    assert w.home.claim_now("a", 2) is None      # another shard's entry: only a check can say
    verdicts: List[bool] = []
    w.home.claim("a", 2, verdicts.append)
    assert verdicts == [] and [(s, op) for s, op, _, _ in w.asked] == [(1, "exists")]
    w.answer_all()
    assert verdicts == [False]                   # shard 1 still holds it


def test_a_stale_entry_is_checked_then_the_id_granted_to_the_new_claimer() -> None:
    w = World().ready()
    assert w.home.claim_now("a", 1) is True      # shard 1 made it, and its job left unsaid
    verdicts: List[bool] = []
    w.home.claim("a", 2, verdicts.append)
    w.answer_all()
    assert verdicts == [True]
    assert w.home.entries.shard_of("a") == 2
    assert w.home.claim_now("a", 1) is None      # now shard 2's entry stands in its way


def test_an_id_held_by_the_home_itself_is_refused_at_once() -> None:
    w = World().ready()
    w.held[0].add("x")
    assert w.home.claim_now("x", 1) is False
    assert w.home.claim_now("x", 0) is True      # its own: its engine refused any duplicate


def test_claims_of_an_id_being_checked_wait_in_line_behind_the_check() -> None:
    w = World().ready()
    w.home.claim_now("a", 1)
    w.held[1].add("a")
    first: List[bool] = []
    second: List[bool] = []
    w.home.claim("a", 2, first.append)
    assert w.home.claim_now("a", 2) is None      # being checked: never answered past the check
    w.home.claim("a", 2, second.append)
    assert first == second == []
    w.held[1].discard("a")                       # shard 1's job left before it answered
    w.answer_all()
    assert first == [True] and second == [True]   # shard 2's own entry, the second time


def test_a_home_not_ready_holds_claims_until_every_shard_listed_its_jobs() -> None:
    w = World()
    w.home.expect([1])
    assert w.home.claim_now("a", 2) is None
    verdicts: List[bool] = []
    w.home.claim("a", 2, verdicts.append)
    assert verdicts == []
    w.held[1].add("a")
    w.home.listing(1)
    w.home.listed(1, ["a"])                      # shard 1 holds a job with that id
    assert [(s, op) for s, op, _, _ in w.asked] == [(1, "exists")]
    w.answer_all()
    assert verdicts == [False]


def test_a_batch_is_answered_once_in_order_with_verdicts_given_at_once_and_checked() -> None:
    w = World().ready()
    w.home.claim_now("b", 1)
    w.held[1].add("b")
    w.held[0].add("c")
    ids = ["a", "b", "c", "d"]
    verdicts = [w.home.claim_now(id, 2) for id in ids]
    assert verdicts == [True, None, False, True]
    answers: List[List[Optional[bool]]] = []
    ClaimVerdicts(verdicts, answers.append).ask_the_rest(w.home, ids, 2)
    assert answers == []                         # "b" is being checked
    w.answer_all()
    assert answers == [[True, False, False, True]]


def test_a_batch_given_whole_at_once_is_answered_at_once() -> None:
    w = World().ready()
    answers: List[List[Optional[bool]]] = []
    ids = ["a", "b"]
    ClaimVerdicts([w.home.claim_now(id, 1) for id in ids], answers.append).ask_the_rest(w.home, ids, 1)
    assert answers == [[True, True]] and w.asked == []


def test_claims_leave_nothing_for_the_cycle_collector() -> None:
    """A claim per add of a client's id: compiled, a closure is a cycle
    with its environment, which only the cycle collector frees (it ran
    every few thousand adds between nodes). Claims given at once, in line
    behind the home's readiness, and answered in batches make none."""
    w = World()
    w.home.expect([1])
    gc.collect()
    gc.disable()
    try:
        verdicts: List[bool] = []
        for i in range(100):
            w.home.claim(f"early-{i}", 2, verdicts.append)   # the home is not ready: held
        w.home.listing(1)
        w.home.listed(1, [])
        answers: List[List[Optional[bool]]] = []
        for batch in range(100):
            ids = [f"id-{batch}-{i}" for i in range(5)]
            ClaimVerdicts([w.home.claim_now(id, 1) for id in ids], answers.append).ask_the_rest(w.home, ids, 1)
        assert verdicts == [True] * 100 and len(answers) == 100
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_home_answering_claim_frames_and_a_claimer_leave_nothing_for_the_cycle_collector() -> None:
    """The shard's side of the same: a home's ``claims`` request (each
    verdict at once, or after a check), and a claim at a home that is this
    very shard with another shard's entry in the way."""
    settled: List[Tuple[str, Reply]] = []
    homes = Homes(0, 3, Engine(), None, None,
                  lambda id, token, reply, verdict: settled.append((id, verdict)))
    homes.home.expect(())
    ids = [id for id in (f"id-{i}" for i in range(400)) if homes.home_of(id) == 0][:50]
    sent: List[Reply] = []
    gc.collect()
    gc.disable()
    try:
        for i in range(0, 50, 5):
            HOME_REQUESTS["claims"](homes, sent.append, [1, ids[i:i + 5]])
        assert sent == [[OK, [True] * 5]] * 10
        for id in ids:   # shard 1's entries are in the way: each asks it (no link: it holds nothing)
            assert homes.claim(id, (7, 1), [OK, id]) is None
        assert [verdict for _, verdict in settled] == [[OK, None]] * 50
        assert gc.collect() == 0
    finally:
        gc.enable()
