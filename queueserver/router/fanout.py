"""Requests that span several shards.

:class:`Gather` asks every shard and merges the answers (``inspect queues``,
``inspect server``). :class:`SpreadLease` leases one job from queues that
live on different shards without losing, double-delivering or overcharging
any job: it first takes the best ready job from each shard at once (wait 0)
and gives back all but the best; if none is ready it parks a lease on every
shard, keeps the first job that arrives and cancels the rest, giving back any
job that arrives after the winner. Giving back (``unlease``) restores the
job's place and its attempt count exactly.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..engine.status import MOVED, NOT_FOUND, OK, SERVER_ERROR, TIMEOUT, Reply
from ..engine.views import as_lease, undo_delivery
from ..links.shardlink import ShardLink

Callback = Callable[[Reply], None]


def give_back(link: ShardLink, reply: Reply) -> None:
    """Return a leased job nobody will receive to its queue, uncharged."""
    undo = undo_delivery("lease", reply)
    assert undo is not None   # ``reply`` is an OK lease: it delivered a job
    op, args, _ = undo
    link.call(op, args, ignore)


def ignore(reply: Reply) -> None:
    """The callback of a request whose answer nobody needs."""


class Gather:
    """Send one request to every shard; ``merge`` the OK answers."""

    def __init__(self, links: Sequence[ShardLink], op: str, args: Sequence[Any],
                 merge: Callable[[List[Any]], Reply], callback: Callback) -> None:
        self._answers: List[Any] = []
        self._waiting = len(links)
        self._merge = merge
        self._callback: Optional[Callback] = callback
        for link in links:
            link.call(op, args, self._answer)

    def _answer(self, reply: Reply) -> None:
        if reply[0] == OK:
            self._answers.append(reply[1])
        self._waiting -= 1
        if self._waiting == 0 and self._callback is not None:
            self._callback(self._merge(self._answers))

    def abandon(self) -> None:
        """The client left: nothing is parked, so just skip the merge."""
        self._callback = None

    def expire(self) -> None:
        """Nothing waits: the answers come as they are."""


class FirstFound:
    """Ask every shard about one job; answer with the owner's reply.

    For a job the directory cannot place (goqueue's numbers, or an id whose
    hash two jobs share): every other shard answers NOT_FOUND at once. A
    shard that cannot answer (down) may be the owner, so its error is the
    answer only when no other shard owns the job.
    """

    def __init__(self, links: Sequence[ShardLink], op: str, args: Sequence[Any],
                 callback: Callback) -> None:
        self._callback: Optional[Callback] = callback
        self._waiting = len(links)
        self._failure: Optional[Reply] = None
        self._asked: List[Tuple[ShardLink, int]] = []
        for link in links:
            self._asked.append((link, link.call(op, args, self._answer)))

    def _answer(self, reply: Reply) -> None:
        self._waiting -= 1
        if self._callback is None:
            return
        status = reply[0]
        if status == SERVER_ERROR:
            self._failure = self._failure or reply
        elif status != NOT_FOUND:
            self._give(reply)
            return
        if self._waiting == 0:
            self._give(self._failure or reply)

    def _give(self, reply: Reply) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:   # not yet answered (nor abandoned)
            callback(reply)

    def abandon(self) -> None:
        if self._callback is not None:
            self._callback = None
            self.expire()

    def expire(self) -> None:
        """End any wait now; the answers (the owner's, as its timeout gives it) still come."""
        for link, req_id in self._asked:
            link.cancel(req_id)


class SpreadLease:
    def __init__(self, groups: Dict[ShardLink, List[str]], timeout: Optional[int],
                 callback: Callback, slots: Optional[Dict[ShardLink, List[int]]] = None) -> None:
        """``slots``: in a cluster, each group's queues' slots (sent along)."""
        self._groups = groups
        self._slots: Dict[ShardLink, List[int]] = slots or {}
        self._timeout = timeout
        self._callback: Optional[Callback] = callback
        self._offers: List[Tuple[ShardLink, Reply]] = []
        self._parked: Dict[ShardLink, int] = {}
        self._waiting = len(groups)
        self._errors: List[Reply] = []
        self._moved: Optional[Reply] = None
        self._expired = False   # the client sent its FIN: no waiting for a job
        for link, names in groups.items():
            link.call("lease", [names, 0], self._make_probe(link), self._slots.get(link))

    # Phase 1: everything ready right now; keep the best, give back the rest.
    def _make_probe(self, link: ShardLink) -> Callback:
        def probe(reply: Reply) -> None:
            if reply[0] == OK:
                self._offers.append((link, reply))
            elif reply[0] == MOVED:   # routed anew, as a whole, by the router
                self._moved = reply
            elif reply[0] != TIMEOUT:
                self._errors.append(reply)
            self._waiting -= 1
            if self._waiting == 0:
                self._probed()
        return probe

    def _probed(self) -> None:
        if self._callback is None:  # abandoned meanwhile
            for link, reply in self._offers:
                give_back(link, reply)
            return
        if self._moved is not None:
            for link, reply in self._offers:
                give_back(link, reply)
            self._finish(self._moved)
        elif self._offers:
            # (a lease's order is a list once it crossed a link: compared as a tuple)
            self._offers.sort(key=lambda offer: tuple(as_lease(offer[1][1]).order))
            (_, best), rest = self._offers[0], self._offers[1:]
            for link, reply in rest:
                give_back(link, reply)
            self._finish(best)
        elif self._timeout == 0 or self._expired or len(self._errors) == len(self._groups):
            self._finish(self._errors[0] if self._errors else [TIMEOUT, ""])
        else:
            self._waiting = len(self._groups)
            for link, names in self._groups.items():
                self._parked[link] = link.call("lease", [names, self._timeout], self._make_wait(link),
                                               self._slots.get(link))

    # Phase 2: the first job to arrive anywhere wins.
    def _make_wait(self, link: ShardLink) -> Callback:
        def wait(reply: Reply) -> None:
            self._parked.pop(link, None)
            self._waiting -= 1
            if reply[0] == OK:
                if self._callback is None:
                    give_back(link, reply)
                    return
                self._cancel_parked()
                self._finish(reply)
            elif reply[0] == MOVED and self._callback is not None:
                self._cancel_parked()
                self._finish(reply)
            elif self._waiting == 0:
                self._finish([TIMEOUT, ""])
        return wait

    def _cancel_parked(self) -> None:
        for link, req_id in self._parked.items():
            link.cancel(req_id)

    def _finish(self, reply: Reply) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback(reply)

    def abandon(self) -> None:
        """The client left: cancel parked leases; jobs that still arrive go back."""
        if self._callback is None:
            return
        self._callback = None
        self._cancel_parked()

    def expire(self) -> None:
        """Stop waiting for a job: a job ready now is still taken, else the
        answer is TIMEOUT once every parked lease has answered."""
        self._expired = True
        self._cancel_parked()
