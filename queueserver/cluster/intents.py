"""A slot-moving command's intent in etcd, so that any node can finish it.

Keys under ``<prefix>/moves/`` (JSON)::

    plan      {"command", "args", "moves": [{"giver", "target", "ranges", "epoch"}, ...],
               "started", "by"}        the moves left, written before the first one
    <epoch>   {"giver", "target", "ranges", "epoch", "step"}   a move under way;
              ``step`` is the last one logged: "out" (giver), "in" (receiver),
              "done" (giver); the key goes once the move is over
    driver    {"command", "by", "node", "started"}   on the driver's lease

The *driver* -- the command an operator runs, or the ``cluster resume`` a
node's supervisor starts (:mod:`.resumer`) -- takes ``driver`` with a
create-only transaction on a lease kept alive while it runs: at most one
process acts on the plan, and "the driver is alive" is the key being there.
Every write of a driver is a transaction that compares ``driver``'s creation
revision with the one it took, so a driver whose lease lapsed (and whose
plan another may have taken over) learns it at its next write and stops.

A plan whose driver died (kill -9, or its node) stays, without ``driver``:
the supervisors see that and one of them resumes it. A move's steps are
idempotent by epoch, so whoever resumes repeats at most one step.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, TypedDict

from etcd3gw.utils import _encode

from . import slotstore
from .coordination import Etcd, created_at, put_request, transact
from .moves import PlannedMove

PLAN, DRIVER = "plan", "driver"
#: a move's steps, in order: what its key's ``step`` says was logged last
STEPS = ("out", "in", "done")


class Plan(TypedDict):
    """What a command set out to do: the moves it has left."""
    command: str
    args: Dict[str, Any]
    moves: List[PlannedMove]
    started: float
    by: str


class UnderWay(PlannedMove):
    """A move begun, and its last step logged."""
    step: str


class BadIntent(ValueError):
    """A key under ``moves/`` that is not a record this module wrote; one line."""


class Superseded(Exception):
    """This process is no longer the driver (its lease lapsed, or another
    took the plan over): it must not act on the plan any more."""


def who() -> str:
    """This process, as a plan or driver names it: ``host/pid``."""
    return f"{socket.gethostname()}/{os.getpid()}"


def _move(raw: Any) -> PlannedMove:
    return PlannedMove(giver=int(raw["giver"]), target=int(raw["target"]),
                       ranges=[[int(start), int(end)] for start, end in raw["ranges"]], epoch=int(raw["epoch"]))


@dataclass
class Intents:
    """What etcd holds under ``moves/`` at one moment."""
    plan: Optional[Plan] = None
    driver: Optional[Dict[str, Any]] = None
    under_way: Dict[int, UnderWay] = field(default_factory=dict)

    @property
    def orphaned(self) -> bool:
        """Moves are left and nobody drives them."""
        return self.driver is None and (self.plan is not None or bool(self.under_way))

    def left(self) -> List[PlannedMove]:
        """Every move still to finish: the plan's, and any under way outside it, by epoch."""
        moves = {m["epoch"]: m for m in self.plan["moves"]} if self.plan is not None else {}
        for epoch, move in self.under_way.items():
            moves.setdefault(epoch, _move(move))
        return [moves[epoch] for epoch in sorted(moves)]

    def describe(self) -> str:
        """One line: the plan, how far it is, and whether its driver lives."""
        what = self.what()
        if self.driver is not None:
            node = f" on node {self.driver['node']}" if self.driver.get("node") else ""
            return f"{what}, driven by {self.driver.get('command', '?')} {self.driver.get('by', '?')}{node}"
        return f"{what}, whose driver is gone (a node's supervisor resumes it)"

    def what(self) -> str:
        """The plan and how far it is."""
        if self.plan is not None:
            plan = self.plan
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(plan["started"]))
            return (f"a {' '.join([plan['command'], *([plan['args']['node']] if plan['args'].get('node') else [])])}"
                    f" (started {started} by {plan['by']}) with {len(plan['moves'])} moves left")
        if self.under_way:
            return f"{len(self.under_way)} slot moves under way (epochs {', '.join(map(str, sorted(self.under_way)))})"
        return "a command that has not planned its moves yet"


def read(etcd: Etcd) -> Intents:
    """Everything under ``moves/``; BadIntent on a record this module did not write."""
    prefix = etcd.key("moves", "")
    intents = Intents()
    for value, meta in etcd.call(lambda client: client.get_prefix(prefix)):
        name = meta["key"].decode()[len(prefix):]
        try:
            record: Any = json.loads(value)
            if name == PLAN:
                intents.plan = Plan(command=str(record["command"]), args=dict(record["args"]),
                                    moves=[_move(m) for m in record["moves"]], started=float(record["started"]),
                                    by=str(record["by"]))
            elif name == DRIVER:
                intents.driver = dict(record)
            else:
                move = _move(record)
                if str(move["epoch"]) != name or record["step"] not in STEPS:
                    raise ValueError(f"epoch {move['epoch']}, step {record['step']!r}")
                intents.under_way[move["epoch"]] = UnderWay(**move, step=str(record["step"]))
        except (ValueError, KeyError, TypeError) as err:
            raise BadIntent(f"etcd key {prefix}{name} holds no valid record ({type(err).__name__}: {err}); "
                            f"a slot-moving command wrote it: check what it says, then delete it with "
                            f"etcdctl") from None
    return intents


def _put(key: str, record: Any) -> Dict[str, Any]:
    return put_request(key, json.dumps(record, sort_keys=True))


def _delete(key: str) -> Dict[str, Any]:
    return {"request_delete_range": {"key": _encode(key)}}


class Driver:
    """The one process acting on the moves: every write of it is made only
    while ``driver`` is still the key it took (see the module's docstring)."""

    def __init__(self, etcd: Etcd, created: int, founders: Sequence[int]) -> None:
        self.etcd = etcd
        self.created = created      # the creation revision of the driver key it took
        self.founders = list(founders)
        self.plan: Optional[Plan] = None

    def key(self, *parts: str) -> str:
        return self.etcd.key("moves", *parts)

    @classmethod
    def take(cls, etcd: Etcd, lease: int, command: str, node: Optional[str],
             founders: Sequence[int]) -> Optional["Driver"]:
        """Become the driver on ``lease`` (create-only); None if another one is."""
        key = etcd.key("moves", DRIVER)
        record = {"command": command, "by": who(), "node": node, "started": time.time()}
        created = transact(etcd, [created_at(key, 0)],
                           [put_request(key, json.dumps(record, sort_keys=True), lease)])
        return None if created is None else cls(etcd, created, founders)

    @classmethod
    def adopt(cls, etcd: Etcd, lease: int, founders: Sequence[int]) -> "Driver":
        """The driver a supervisor took on ``lease`` for this process (a
        ``cluster resume --lease``); Superseded if the key is not on it."""
        key = etcd.key("moves", DRIVER)
        found = etcd.call(lambda client: client.get(key, metadata=True))
        if not found or int(found[0][1].get("lease", 0)) != lease:
            raise Superseded(f"{key} is not held on lease {lease:x} (its supervisor stopped, or the "
                             f"lease lapsed): another node resumes the moves")
        return cls(etcd, int(found[0][1]["create_revision"]), founders)

    def _commit(self, writes: List[Dict[str, Any]]) -> None:
        """``writes`` in one transaction, if this process is still the driver."""
        if transact(self.etcd, [created_at(self.key(DRIVER), self.created)], writes) is None:
            raise Superseded(f"this process no longer holds {self.key(DRIVER)} (its etcd lease lapsed): "
                             f"it stops, and a node's supervisor resumes the moves left")

    def check(self) -> None:
        """Before each move: Superseded if another process drives now."""
        self._commit([])

    def begin(self, command: str, args: Dict[str, Any], moves: List[PlannedMove]) -> None:
        """Write the plan, before the first of its moves."""
        self.plan = Plan(command=command, args=args, moves=list(moves), started=time.time(), by=who())
        self._commit([_put(self.key(PLAN), self.plan)])

    def stepped(self, move: PlannedMove, step: str) -> None:
        """``step`` of ``move`` is logged. At "in" the receiver serves the
        slots: etcd's slot map says so first (:func:`.slotstore.record`)."""
        if step == "in":
            slotstore.record(self.etcd, move["ranges"], move["target"], move["epoch"], self.founders)
        self._commit([_put(self.key(str(move["epoch"])), UnderWay(**move, step=step))])

    def finished(self, move: PlannedMove) -> None:
        """``move`` is over: its key goes, and it leaves the plan."""
        writes = [_delete(self.key(str(move["epoch"])))]
        if self.plan is not None:
            self.plan["moves"] = [m for m in self.plan["moves"] if m["epoch"] != move["epoch"]]
            writes.append(_put(self.key(PLAN), self.plan))
        self._commit(writes)

    def end(self) -> None:
        """Every move is done: the plan goes."""
        self._commit([_delete(self.key(PLAN))])
        self.plan = None
