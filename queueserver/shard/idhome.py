"""Where each job id lives, kept by the id's *home* shard, as a DHT would.

A job lives on the shard of its queue, but ``complete``, ``delete``,
``result`` or ``inspect job`` name only its id. Every id has a home: the
shard that would serve a queue of the same name (its hash on one host, its
slot's owner in a cluster). The home keeps, for each job that lives on
another shard, which shard that is, so any router finds any job with one
question (``locate``), whatever the size of the cluster, and no router hears
of jobs it never touches.

The home also keeps ids unique server-wide. A shard that makes a job with a
client's id *claims* the id at its home before the client hears back; the
home grants the first claim and refuses any later one while the job lives,
so two adds of one id racing on two shards cannot both succeed (the loser
takes its job back and answers ``Duplicate job``).

Entries are reduced to the id's 64-bit hash (a :class:`JobDirectory`, about
6 bytes a job). A hash seen before is therefore not proof: a claim that
meets an entry of another shard asks that shard whether the job is still
there before it refuses. Shards tell the home when their jobs leave
(``forget``, in batches), and a home whose link to a shard comes up asks
that shard for its jobs homed here (``homed``) and replaces what it knew,
so a restart on either side leaves no stale entry behind. Until every shard
has answered once, a home that just started holds claims and lookups.
"""
from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any, Callable, Dict, Final, Iterable, List, Optional, Set

from ..engine.status import NOT_FOUND, Reply
from ..links.directory import SHARED, JobDirectory

log: Final = logging.getLogger("queueserver.shard")

Verdict = Callable[[bool], None]     # True: the claim is granted
READY_TIMEOUT: Final = 10.0                 # seconds a new home waits for every shard's jobs


class IdHome:
    """The registry of one home shard (``index``). ``holds(id)``: whether a
    job with this id lives here; ``ask(shard, op, args, callback)``: a
    request to another shard (``exists``, ``homed``)."""

    def __init__(self, index: int, holds: Callable[[str], bool],
                 ask: Callable[[int, str, List[Any], Callable[[Reply], None]], None]) -> None:
        self.index = index
        self._holds = holds
        self._ask = ask
        self.entries = JobDirectory()
        #: id -> verdicts waiting while a conflicting entry is checked
        self._checking: Dict[str, List[Callable[[], None]]] = {}
        #: shard -> ids claimed for it while its jobs are being listed
        self._syncing: Dict[int, Set[str]] = {}
        self._synced: Set[int] = set()
        self._peers: Set[int] = set()
        self._started = time.monotonic()
        self._ready = False
        self._waiting: List[Callable[[], None]] = []

    # ------------------------------------------------------------ readiness
    def expect(self, peers: Iterable[int]) -> None:
        """The shards whose jobs this home must hear once before it answers."""
        self._peers = set(peers) - {self.index}
        self._check_ready()

    def _check_ready(self) -> None:
        if self._ready:
            return
        late = time.monotonic() - self._started > READY_TIMEOUT
        if self._peers <= self._synced or late:
            if late and not self._peers <= self._synced:
                log.warning("shard %d: shards %s have not listed their jobs in %.0f s; answering "
                            "claims and lookups without them", self.index,
                            sorted(self._peers - self._synced), READY_TIMEOUT)
            self._ready = True
            waiting, self._waiting = self._waiting, []
            for then in waiting:
                then()

    def _when_ready(self, then: Callable[[], None]) -> None:
        if self._ready:
            then()
            return
        self._waiting.append(then)
        self._check_ready()

    @property
    def ready(self) -> bool:
        return self._ready

    def tick(self) -> None:
        """Called now and then: a home waits for slow shards only so long."""
        if not self._ready:
            self._check_ready()

    # --------------------------------------------------------------- claims
    # No closures here: compiled (mypyc), a nested function that another
    # nested function refers to is kept in their shared environment, which
    # it refers to; a claim per add would leave that cycle to the cycle
    # collector (a young collection every few thousand adds).
    def claim(self, id: str, shard: int, verdict: Verdict) -> None:
        """``shard`` made a job ``id``: grant it if no other live job has the id."""
        if self._ready:
            self._claim(id, shard, verdict)
        else:
            self._waiting.append(partial(self._claim, id, shard, verdict))
            self._check_ready()

    def claim_now(self, id: str, shard: int) -> Optional[bool]:
        """The verdict on ``shard``'s claim of ``id`` if it can be given at
        once (the id granted: True; held here: False), else None: the home is
        not ready, the id is being checked, or another shard's entry has its
        hash (then :meth:`claim` asks that shard)."""
        if not self._ready or id in self._checking:
            return None
        if shard != self.index and self._holds(id):
            return False
        known = self.entries.shard_of(id)
        if known is None or known == shard or known == self.index:
            # (an entry of this shard's own jobs is never kept: stale)
            self._grant(id, shard)
            return True
        return None

    def _claim(self, id: str, shard: int, verdict: Verdict) -> None:
        granted = self.claim_now(id, shard)
        if granted is not None:
            verdict(granted)
        elif id in self._checking:   # a conflict being checked: in line after it
            self._checking[id].append(partial(self._claim, id, shard, verdict))
        else:
            self._check(id, shard, verdict)

    def _check(self, id: str, shard: int, verdict: Verdict) -> None:
        """Another shard's entry (or a shared hash) has the hash of ``id``:
        is that job still there? Claims of the id wait meanwhile."""
        known = self.entries.shard_of(id)
        self._checking[id] = []
        others = [known] if known is not None and known != SHARED else sorted(self._peers)

        def checked(found: bool) -> None:
            waiting = self._checking.pop(id, [])
            if not found:
                if known is not None and known != SHARED:
                    self.entries.forget(id, known)
                self._grant(id, shard)
            verdict(not found)
            for then in waiting:
                then()

        self.any_holds(others, id, checked)

    def any_holds(self, shards: List[int], id: str, done: Callable[[bool], None]) -> None:
        """Whether any of ``shards`` holds job ``id`` (a shard that cannot
        answer is taken as holding it: never grant on a guess)."""
        left = [len(shards)]
        found = [False]

        def answer(reply: Reply) -> None:
            left[0] -= 1
            if reply[0] != NOT_FOUND:   # an error may hide the job: never grant on a guess
                found[0] = True
            if left[0] == 0:
                done(found[0])

        if not shards:
            done(False)
            return
        for other in shards:
            self._ask(other, "exists", [id], answer)

    def _grant(self, id: str, shard: int) -> None:
        if shard == self.index:
            return   # its own jobs it finds in its engine
        self.entries.place(id, shard)
        syncing = self._syncing.get(shard)
        if syncing is not None:
            syncing.add(id)

    def register(self, ids: Iterable[str], shard: int) -> None:
        """Jobs ``ids`` live on ``shard`` now (moved there with their queue's slot)."""
        entries = self.entries
        syncing = self._syncing.get(shard)
        for id in ids:
            if shard != self.index:
                entries.set(id, shard)
                if syncing is not None:   # kept through the listing under way
                    syncing.add(id)
                continue
            known = entries.shard_of(id)   # here now: what was known of it elsewhere is over
            if known is not None and known != SHARED:
                entries.forget(id, known)

    def unclaim(self, id: str, shard: int) -> None:
        self.entries.forget(id, shard)

    def forget(self, ids: Iterable[str], shard: int) -> None:
        """Jobs of ``shard`` that left it."""
        self.entries.forget_all(ids, shard)

    # -------------------------------------------------------------- lookups
    def locate(self, id: str, answer: Callable[[Optional[int]], None]) -> None:
        """The shard that holds job ``id`` (None: no job has it; SHARED: ask them all)."""
        def look() -> None:
            if self._holds(id):
                answer(self.index)
            else:
                answer(self.entries.shard_of(id))
        self._when_ready(look)

    # ---------------------------------------------------------------- syncs
    def listing(self, shard: int) -> None:
        """``shard`` is about to list its jobs homed here (its link came up)."""
        self._syncing[shard] = set()

    def listed(self, shard: int, ids: List[str]) -> None:
        """``shard``'s jobs homed here, listed whole: they replace what was known."""
        claimed = self._syncing.pop(shard, set())
        self.entries.forget_shard(shard)
        self.entries.learn(shard, ids)
        self.entries.learn(shard, claimed)
        self._synced.add(shard)
        self._check_ready()
