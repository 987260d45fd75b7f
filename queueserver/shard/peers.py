"""A shard's links to the other shards of its server (or cluster), for the
id homes' traffic (:mod:`.idhome`): claims of new ids, jobs that left or
moved in, and the job lists a home asks for when a link comes up.

The links are the routers' :class:`~queueserver.links.shardlink.ShardLink`
(reconnecting, answered out of order). What one loop turn produces for a
home leaves in one frame: every id claimed there in one ``claims`` request; the jobs gone in
:data:`FORGET_DELAY` leave in one ``forget`` note per home, so the frames
per job fall as the load rises and never grow with the number of shards.

An id's home is the shard that serves a queue of the same name: on one
host its hash, in a cluster the owner of its slot, which this shard learns
as routers do (the shards' hellos and their news of slots taken and given).
A home that no longer serves a slot answers ``MOVED``; the ids go again,
to the owner it names (or, when it names none, the one every shard's
account of its slots shows).
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable, Dict, Final, List, Optional, Sequence, Set, Tuple

import gevent

from ..placement import shard_for, slot_of
from ..engine.status import CLIENT_ERROR, MOVED, NOT_FOUND, OK, SERVER_ERROR, Reply
from ..links.primaries import PrimaryPlaces, view_problem
from ..links.shardlink import Address, Auth, Places, ShardLink, unavailable
from ..links.slotmap import SlotMap

log: Final = logging.getLogger("queueserver.shard")

LINK_WAIT: Final = 3.0          # seconds a request waits for a link that is not up yet
MAX_REDIRECTS: Final = 8
RETRY_DELAY: Final = 0.005      # seconds before ids go again after a MOVED (doubling each time)
FORGET_DELAY: Final = 0.05      # seconds jobs gone are gathered before their homes are told

#: ``[OK, None]``: granted; ``[CLIENT_ERROR, "Duplicate job"]``; or the
#: error that kept the home from answering (the id cannot be known unique)
Verdict = Callable[[Reply], None]
GRANTED: Final[Reply] = [OK, None]
DUPLICATE: Final[Reply] = [CLIENT_ERROR, "Duplicate job"]
#: an id its home's answer left out (never, from a home that keeps the protocol)
UNANSWERED: Final[Reply] = [SERVER_ERROR, "No answer from the id's home"]
Results = Callable[[List[Reply]], None]
#: ``local(op, ids, results)``: a batch whose home is this very shard
Local = Callable[[str, List[str], Results], None]


class _Gathered:
    """The replies of one :meth:`Peers.route` whose ids have several homes,
    put back in the ids' order; ``results(replies)`` once every home answered."""

    def __init__(self, count: int, homes: int, results: Results) -> None:
        self.out: List[Reply] = [UNANSWERED] * count
        self.left = homes
        self.results = results

    def part(self, positions: List[int], replies: List[Reply]) -> None:
        out = self.out
        for position, reply in zip(positions, replies):
            out[position] = reply
        self.left -= 1
        if self.left == 0:
            self.results(out)


class Peers:
    """Links from shard ``index`` to every other shard of ``addresses``;
    ``slots``: in a cluster, the map of which shard serves each slot."""

    def __init__(self, index: int, addresses: Sequence[Places], on_up: Callable[[int], None],
                 local: Local, auth: Optional[Auth] = None,
                 slots: Optional[SlotMap] = None, grow: Callable[[], None] = lambda: None) -> None:
        self.index = index
        self.count = len(addresses)
        self.slots = slots
        self._grow = grow     # reads the cluster file again for shards added since the start
        self._on_up = on_up
        self._local = local
        self._auth = auth
        self.links: Dict[int, ShardLink] = {}
        for i, address in enumerate(addresses):
            self.add(i, address)
        #: a cluster on etcd: where its supervisor says each primary is, and which nodes live
        self.primaries: Optional[PrimaryPlaces] = None
        self._claims: List[Tuple[str, Verdict]] = []
        self._claiming: Set[int] = set()   # homes with a claims frame unanswered
        self._claims_held: Dict[int, List[Tuple[str, Verdict]]] = {}   # home -> claims waiting for it
        self._forgets: Dict[int, List[str]] = {}
        self._forget_due = False
        self._scheduled = False
        #: shard -> requests waiting for its link to come up (at start, or after it restarted)
        self._waiting: Dict[int, List[Callable[[], object]]] = {}

    def add(self, ordinal: int, address: Places) -> None:
        """A link to shard ``ordinal`` (none to itself, nor to one with no address)."""
        if ordinal != self.index and address is not None and ordinal not in self.links:
            self.links[ordinal] = ShardLink(ordinal, address, self._event, self._down, self._up,
                                            None, None, self._auth)
        self.count = max(self.count, ordinal + 1)

    def cluster_view(self, request: List[Any]) -> Dict[str, Any]:
        """``["cluster", "view", runs, primaries, nodes]``, the supervisor's
        watch on etcd (see :mod:`queueserver.links.primaries`): the links to
        the shards whose primary it names go there at once, and a shard
        served by a node that holds no lease is not waited for. The slot map
        in it is left alone: a shard learns slots from the shards themselves."""
        if len(request) not in (4, 5) or request[1] != "view":
            return {"error": f"a shard answers [\"cluster\", \"view\", runs, primaries, nodes], not "
                             f"{request!r:.100}", "status": 400}
        nodes = request[4] if len(request) == 5 else None
        problem = view_problem(request[2], request[3], nodes)
        if problem:
            log.warning("shard %d: cluster view refused: %s", self.index, problem)
            return {"error": f"cluster view refused: {problem}", "status": 400}
        if self.primaries is not None:
            for ordinal, epoch, node, copy in request[3]:
                link = self.links.get(ordinal)
                if link is not None:
                    self.primaries.take(link, epoch, node, copy)
            if nodes is not None:
                for link in self.primaries.leases(nodes, self.links.values()):
                    self._release(link.index)   # what waited for it goes now, and is answered
        return {"taken": True}

    def home_of(self, id: str) -> int:
        """The shard where ``id`` is at home."""
        if self.slots is not None:
            return self.slots.owners[slot_of(id)]
        return shard_for(id, self.count)

    # ------------------------------------------------------------- sending
    def claim(self, id: str, verdict: Verdict) -> None:
        """Claim ``id`` at its home (in this loop turn's one frame to it)."""
        self._claims.append((id, verdict))
        self._schedule()

    def forget(self, home: int, ids: List[str]) -> None:
        """Jobs ``ids`` left this shard: told to their home within
        :data:`FORGET_DELAY`, with every other one gone meanwhile (a home
        that still has an entry meanwhile asks before it refuses the id, and
        a lookup finds the job gone: only a frame per home per interval)."""
        self._forgets.setdefault(home, []).extend(ids)
        if not self._forget_due:
            self._forget_due = True
            gevent.spawn_later(FORGET_DELAY, self._send_forgets)

    def _send_forgets(self) -> None:
        self._forget_due = False
        forgets, self._forgets = self._forgets, {}
        for home, ids in forgets.items():
            link = self.links.get(home)
            if link is not None:
                link.notify("forget", [self.index, ids])

    def register(self, ids: List[str], done: Results) -> None:
        """Say at their homes that the jobs ``ids`` live here now (moved in)."""
        self.route("register", ids, done)

    def ask(self, shard: int, op: str, args: List[Any], callback: Callable[[Reply], None]) -> None:
        link = self.links.get(shard)
        if link is None:
            callback([NOT_FOUND, ""])   # no such shard (any more): it holds nothing
            return
        self._when_up(link, lambda: link.call(op, args, callback))

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            gevent.get_hub().loop.run_callback(self.flush)

    def flush(self) -> None:
        """Send what this loop turn gathered: one claims frame per home, but
        never two at once to one home. While a home's frame is unanswered,
        later claims wait for its answer and then leave together: an idle
        home hears of a claim at once, and a busy one gets fewer, fuller
        frames (the frames per add fall as the load rises)."""
        self._scheduled = False
        claims, self._claims = self._claims, []
        by_home: Dict[int, List[Tuple[str, Verdict]]] = {}
        for claim in claims:
            by_home.setdefault(self.home_of(claim[0]), []).append(claim)
        for home, part in by_home.items():
            if home in self._claiming:
                self._claims_held.setdefault(home, []).extend(part)
            else:
                self._send_claims(home, part)

    # The claims' path (a frame per home per loop turn, with every add of a
    # client's id) takes bound methods in partials, never closures: compiled,
    # a nested function that another one refers to (here the link's call
    # waiting for the link) and their environment refer to each other, a
    # cycle left to the cycle collector.
    def _send_claims(self, home: int, claims: List[Tuple[str, Verdict]]) -> None:
        self._claiming.add(home)
        self._send(home, "claims", [id for id, _ in claims], partial(self._verdicts, home, claims), 0)

    def _verdicts(self, home: int, claims: List[Tuple[str, Verdict]], replies: List[Reply]) -> None:
        self._claiming.discard(home)
        held = self._claims_held.pop(home, None)
        if held:
            self._send_claims(home, held)
        for (_, verdict), reply in zip(claims, replies):
            verdict(reply)

    # ------------------------------------------------------------- routing
    def route(self, op: str, ids: List[str], results: Results, attempt: int = 0) -> None:
        """``op`` for each id at its home (one frame per home); ``results``
        once, with each id's reply in order."""
        groups: Dict[int, List[int]] = {}
        for position, id in enumerate(ids):
            groups.setdefault(self.home_of(id), []).append(position)
        if len(groups) == 1:
            home = next(iter(groups))
            self._send(home, op, ids, results, attempt)
            return
        gathered = _Gathered(len(ids), len(groups), results)
        for home, positions in groups.items():
            self._send(home, op, [ids[p] for p in positions], partial(gathered.part, positions), attempt)

    def _send(self, home: int, op: str, ids: List[str], done: Results, attempt: int) -> None:
        if home == self.index:
            self._local(op, ids, done)
            return
        link = self.links.get(home)
        if link is None:
            done([unavailable(home)] * len(ids))
            return
        slots = [slot_of(id) for id in ids] if self.slots is not None else None
        answered = partial(self._answered, op, ids, done, attempt)
        self._when_up(link, partial(link.call, op, [self.index, ids], answered, slots))

    def _answered(self, op: str, ids: List[str], done: Results, attempt: int, reply: Reply) -> None:
        """A home's answer to ``op`` for ``ids``: a reply for each, to ``done``."""
        if reply[0] == OK:
            out = [GRANTED if value is True else DUPLICATE if value is False else [OK, value]
                   for value in reply[1]]
            if len(out) < len(ids):   # a home that left some out (never, keeping the protocol)
                out.extend([UNANSWERED] * (len(ids) - len(out)))
            done(out)
        elif reply[0] == MOVED and attempt < MAX_REDIRECTS:
            self._moved(reply[1], partial(self.route, op, ids, done, attempt + 1), attempt)
        else:
            done([reply if reply[0] != MOVED else [SERVER_ERROR, "Queue is moving between shards"]]
                 * len(ids))

    def _moved(self, where: List[Any], again: Callable[[], None], attempt: int) -> None:
        """A home gave a slot away: learn its owner (from the hint, or from
        every shard), then ``again()``."""
        slot, target, epoch = where
        if slot is not None and target is not None and self.slots is not None:
            self.slots.set((slot,), target, epoch)
            gevent.spawn_later(RETRY_DELAY * (1 << attempt), again)
            return
        self.refresh(lambda: gevent.spawn_later(RETRY_DELAY * (1 << attempt), again))

    def refresh(self, then: Callable[[], object]) -> None:
        """Ask every shard which slots it serves, then ``then()``."""
        links = list(self.links.values())
        left = [len(links)]
        if not links:
            then()
            return

        def answered(link: ShardLink, reply: Reply) -> None:
            if reply[0] == OK and self.slots is not None:
                self.slots.served(link.index, reply[1]["served"], force=True)
            left[0] -= 1
            if left[0] == 0:
                then()

        for link in links:
            link.call("slots", [], partial(answered, link))

    def _when_up(self, link: ShardLink, send: Callable[[], object]) -> None:
        """``send()`` now, or once the link is up if it is making its first
        try (a shard starting); if it is not up within :data:`LINK_WAIT`,
        then anyway. A shard known to be down (its link lost or refused, its
        node's etcd lease lapsed) is not waited for: the link answers with
        its error at once, and an add whose id's home it is goes on."""
        if link.up or link.known_down:
            send()
            return
        waiting = self._waiting.get(link.index)
        if waiting is None:
            waiting = self._waiting[link.index] = []
            gevent.spawn_later(LINK_WAIT, self._release, link.index)
        waiting.append(send)

    def _release(self, shard: int) -> None:
        for send in self._waiting.pop(shard, ()):
            send()

    # ------------------------------------------------------------ the links
    def learn(self, shard: int, served: Sequence[Sequence[int]], hints: Sequence[Sequence[int]] = ()) -> None:
        """A shard's account of its slots (its hello, or this shard's own)."""
        if self.slots is not None:
            self.slots.served(shard, served)
            self.slots.hinted(hints)

    def _event(self, link: ShardLink, kind: str, body: Any) -> None:
        """A shard's note: in a cluster, the slots it serves, takes and gives."""
        if self.slots is None:
            return
        if kind == "hello" and "slots" in body:
            self.learn(link.index, body["slots"]["served"], body["slots"]["hints"])
        elif kind == "owns":
            owner, ranges, epoch = body
            self._knows(owner)
            self.slots.ranges_set(ranges, owner, epoch)
        elif kind == "gave":
            ranges, target, epoch = body
            self._knows(target)
            self.slots.ranges_set(ranges, target, epoch)

    def _knows(self, ordinal: int) -> None:
        """A shard news names: linked to, once the cluster file says where it is."""
        if ordinal != self.index and ordinal not in self.links:
            self._grow()

    def _up(self, link: ShardLink) -> None:
        self._release(link.index)
        self._on_up(link.index)

    def _down(self, link: ShardLink) -> None:
        """Requests in flight are answered with an error by the link itself."""

    def stop(self) -> None:
        for link in self.links.values():
            link.stop()
