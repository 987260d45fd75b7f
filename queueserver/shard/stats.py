"""What a shard counts for ``/metrics``: per-queue job counters, wait and
lease time histograms, slot moves; and the snapshot its control socket answers.

Where the counting happens: every state change of the engine is one event
carried out by :meth:`Engine.apply`, which hands it (with its handler) to
the engine's observer, :meth:`ShardStats.observe` once :meth:`ShardStats.attach`
made this the observer of the shard's engine, and only it (see
:mod:`queueserver.engine.observer`). It looks at the job *before* the
handler runs (its queue, whether it is leased, whether it has finished)
and, where needed, after. Counting from ``Shard.take_effects(fx)`` would see the
events only after the whole step, when a job may be gone already (a
``run`` job is deleted in the very step that completes it; a TTL removes
the job its event names) and when later events of the step may have
changed it again, so neither its queue nor whether *this* event finished it
could be told. What an event counts is declared with its kind
(:data:`queueserver.engine.ops.EVENT_KINDS`, ``counts``); kinds that count
nothing (``wake``, ``queue``, slot moves) are only carried out. The engine
is observed only after recovery: replaying the log rebuilds state and
counts nothing.

What a job's event adds, by what its kind declares (``row`` is its queue's
counter row; the kinds of each in brackets). Completed, failed and expired
are counted where :func:`.outcomes.history_event`, the job history's own
rule, reads that outcome in the event (completed and taken: completed;
failed and dead: failed; expired: expired), so that ``/metrics`` and the
history never disagree; takeanumber's DONE and goqueue's DELETE of a
reserved job reach here as a completion (then a removal), a RETRY with no
retries left as a failure (then a removal)::

    ADDS (add)          added
    LEASES (lease)      leased, leased now + 1; the wait since it became ready
    UNLEASES (unlease)  the lease undone (never delivered: a lease spread over
                        several shards gives back all but one): leased - 1,
                        leased now - 1, its wait taken out of the histogram
    TAKES (take)        leased and completed (a dequeue that needs no
                        completion: queued, TaskFlux); its wait
    RESTORES (restore)  (a take not delivered) leased - 1, completed - 1
    COMPLETES           completed; a leased job: leased now - 1 and its lease time
    FAILS               a leased job: leased now - 1 and its lease time;
                        failed when it finished the job
    RUNS_OUT (ttr)      leased now - 1; failed when attempts were used up
    EXHAUSTS            failed (met at lease time with no attempts left)
    EXPIRES (ttl)       expired, unless the job had finished; leased now - 1 if leased
    REQUEUES (release, retry), REMOVES (delete, export: a cluster's job
                        leaving for another shard): leased now - 1 if leased
                        (nothing is counted)
    ARRIVES (job)       (a cluster's job moving in) leased now + 1 if it comes leased

"Became ready" is the later of the job's creation and schedule, or the
last time it went back in line (a lease that ran out, a fail, a release,
a retry): kept in ``ready_since`` for such requeued jobs only (until they
finish or leave), as the start of each lease is kept in ``leased`` for
leased jobs only; no Job object grows.

Undoing (unlease, restore) makes a shard's counters go down a little; the
supervisor keeps every exported counter at its highest value so far
(:mod:`queueserver.metrics.collect`), so Prometheus never sees a reset.

Memory stays bounded: a row per queue the engine holds (the engine caps
those), plus rows of removed queues, whose counters must outlive them, up
to :data:`MAX_REMOVED_ROWS`; past that the removed queues that saw no add
for longest are folded into the ``other`` row.

The cluster's slot moves are counted through :meth:`ShardStats.slots_moved`
and :attr:`ShardStats.slots_owned`.
"""
from __future__ import annotations

import heapq
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Dict, Final, List, Optional, Protocol, Sequence, Set, Tuple

from ..engine import job as J
from ..engine.engine import Engine
from ..engine.job import Job
from ..engine.observer import EventObserver, Handler
from ..engine.ops import (ADDS, ARRIVES, COMPLETES, COUNTS, EXHAUSTS, EXPIRES, FAILS, LEASES, REMOVES,
                          REQUEUES, RESTORES, RUNS_OUT, TAKES, UNCOUNTED, UNLEASES)
from ..engine.jobqueue import JobQueue
from ..metrics import FSYNC_BUCKETS, LATENCY_BUCKETS, MAX_QUEUE_LABELS, refusals, traffic
from ..metrics.histogram import Histogram, empty_snapshot
from ..metrics.linkframes import LinkFrames
from ..net.channel import FRAMES_SENT
from .outcomes import history_event

if TYPE_CHECKING:
    from .durability import Durability
    from .history import HistoryWriter
    from .homes import Homes


class CountedShard(Protocol):
    """What :meth:`ShardStats.snapshot` reads of the shard it counts for (a
    :class:`~.shard.Shard`, which holds its statistics and so is not named here)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def homes(self) -> Homes: ...

    @property
    def requests_run(self) -> int: ...

    @property
    def request_turns(self) -> int: ...

    @property
    def durability(self) -> Optional[Durability]: ...

    @property
    def history(self) -> Optional[HistoryWriter]: ...

#: Counter row layout: five counters, then the number of the queue's jobs leased now.
ADDED: Final = 0
LEASED: Final = 1
COMPLETED: Final = 2
FAILED: Final = 3
EXPIRED: Final = 4
LEASED_NOW: Final = 5
COUNTERS: Final = ("added", "leased", "completed", "failed", "expired")
#: Per-queue states of the ``queueserver_queue_jobs`` gauge, in snapshot order.
STATES: Final = ("ready", "scheduled", "leased", "finished")
#: A job's outcome (a final history event) -> the counter it adds to (looked up
#: with whatever :func:`.outcomes.history_event` says, None included).
OUTCOME_COUNTERS: Final[Dict[Optional[str], int]] = {"completed": COMPLETED, "taken": COMPLETED, "failed": FAILED,
                                              "dead": FAILED, "expired": EXPIRED}

#: Rows of removed queues kept; past this the longest unused are folded into ``other``.
MAX_REMOVED_ROWS: Final = 1000
#: Queue rows one snapshot carries (the busiest; the rest summed into ``other``):
#: twice the node's label cap, so the node's choice is stable as queues trade places.
SNAPSHOT_ROWS: Final = 2 * MAX_QUEUE_LABELS

MICROSECOND: Final = 1e-6

_C_SHIFT: Final = J._C_SHIFT
_C_BITS: Final = J._C_BITS
_C_MASK: Final = J._C_MASK
_C_BIAS: Final = J._C_BIAS
_S_MASK: Final = J._S_MASK
_S_BIAS: Final = J._S_BIAS


def ready_at(key: int) -> int:
    """When a job of order ``key`` became ready (µs): the later of its
    creation and its schedule (``Job.created``, ``Job.sched``, read at once
    from the key: this runs on every lease)."""
    key >>= _C_SHIFT
    created = (key & _C_MASK) - _C_BIAS
    sched = ((key >> _C_BITS) & _S_MASK) - _S_BIAS
    return sched if sched > created else created


class ShardStats(EventObserver):
    """The counters of one shard (see the module's docstring)."""

    def __init__(self, index: int = 0, max_removed_rows: int = MAX_REMOVED_ROWS) -> None:
        self.index = index
        self.max_removed_rows = max_removed_rows
        self.pid = os.getpid()
        self.started = time.time()
        #: queue name -> [added, leased, completed, failed, expired, leased now];
        #: least recently added first
        self.rows: "OrderedDict[str, List[int]]" = OrderedDict()
        #: the folded rows of long-unused removed queues
        self.other = [0] * 6
        self.folded_queues = 0
        #: µs from ready to leased, and from leased to completed or failed
        self.wait = Histogram(LATENCY_BUCKETS, MICROSECOND)
        self.lease = Histogram(LATENCY_BUCKETS, MICROSECOND)
        #: job id -> when its lease started (µs; -1: not known): leased jobs only
        self.leased: Dict[str, int] = {}
        #: job id -> when it went back in line (µs): requeued jobs still waiting only
        self.ready_since: Dict[str, int] = {}
        #: the cluster's: slots this shard owns now, and slots moved in and out
        self.slots_owned = 0
        self.slot_moves = {"in": 0, "out": 0}
        self.engine: Optional[Engine] = None
        #: frames over this shard's links to the other shards (read at snapshot time)
        self.shard_link_frames = LinkFrames()
        self._exhausted: Optional[Set[str]] = None   # jobs exhausted while a ttr or fail runs

    # ------------------------------------------------------------- cluster
    def slots_moved(self, direction: str, slots: int) -> None:
        """``slots`` slots moved ``"in"`` to this shard or ``"out"`` of it."""
        if direction not in self.slot_moves:
            raise ValueError(f"slot move direction {direction!r}: expected 'in' or 'out'")
        self.slot_moves[direction] += slots

    # ------------------------------------------------------------ counting
    def _new_row(self, name: str) -> List[int]:
        row = self.rows[name] = [0] * 6
        engine = self.engine
        if engine is not None and len(self.rows) > len(engine.queues) + 1 + self.max_removed_rows:
            self._fold(keep=name)
        return row

    def _fold(self, keep: str) -> None:
        """Fold the rows of removed queues that saw no add for longest into
        ``other``, down to half the allowance (so folding is rare)."""
        engine = self.engine
        assert engine is not None   # only an attached engine's rows are folded
        queues = engine.queues
        excess = len(self.rows) - (len(queues) + 1 + self.max_removed_rows // 2)
        gone = []
        for name in self.rows:   # least recently added first
            if excess <= 0:
                break
            if name != keep and name not in queues:
                gone.append(name)
                excess -= 1
        other = self.other
        for name in gone:
            row = self.rows.pop(name)
            for i in range(6):
                other[i] += row[i]
        self.folded_queues += len(gone)

    def attach(self, engine: Engine) -> None:
        """Count ``engine``'s events from now on (after its recovery)."""
        self.engine = engine
        engine.observer = self

    def observe(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        """Carry out ``event`` with its ``handler`` and count what it did to
        its job, as its kind declares (:data:`queueserver.engine.ops.COUNTS`)."""
        counts = COUNTS.get(event[0], UNCOUNTED)
        # A job's cycle first, called directly; the rest through COUNTING.
        if counts == LEASES:
            self._leases(engine, event[1], event[2], handler)
        elif counts == COMPLETES:
            self._completes(engine, event, handler)
        elif counts == ADDS:
            self._adds(engine, event, handler)
        elif counts == UNCOUNTED:
            handler(engine, *event[1:])
        else:
            COUNTING[counts](self, engine, event, handler)

    def _row_of(self, name: str) -> List[int]:
        row = self.rows.get(name)
        return row if row is not None else self._new_row(name)

    def _count_outcome(self, row: List[int], kind: str, state: int) -> None:
        """Count the outcome (if any) the history's rule reads in event
        ``kind`` whose job is in ``state`` after it."""
        counter = OUTCOME_COUNTERS.get(history_event(kind, state))
        if counter is not None:
            row[counter] += 1

    def _ready_since(self, job: Job, id: str) -> int:
        """When ``job`` became ready (µs; see the module's docstring)."""
        ready_since = self.ready_since
        since = ready_since.get(id) if ready_since else None
        return ready_at(job.key) if since is None else since

    def _waited(self, job: Job, id: str, now: int) -> None:
        """A job leased (or taken) at ``now``: how long it waited in line."""
        wait = now - self._ready_since(job, id)
        self.wait.observe(wait if wait > 0 else 0)

    def _lease_ended(self, id: str, row: List[int], now: Optional[int]) -> bool:
        """The lease of job ``id`` (if one is known) ended at ``now`` (None:
        not timed); whether there was one."""
        start = self.leased.pop(id, None)
        if start is None:
            return False
        row[LEASED_NOW] -= 1
        if now is not None and start >= 0:
            took = now - start
            self.lease.observe(took if took > 0 else 0)
        return True

    def _adds(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        name: str = event[3]
        rows = self.rows
        row = rows.get(name)
        if row is None:
            row = self._new_row(name)
        else:
            rows.move_to_end(name)
        row[ADDED] += 1
        handler(engine, *event[1:])

    def _leases(self, engine: Engine, id: str, now: int, handler: Handler) -> None:
        job = engine.jobs[id]
        row = self.rows.get(job.name) or self._new_row(job.name)
        row[LEASED] += 1
        row[LEASED_NOW] += 1
        self._waited(job, id, now)
        self.leased[id] = now
        handler(engine, id, now)

    def _completes(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        id: str = event[1]
        now: int = event[3]
        job = engine.jobs[id]
        row = self.rows.get(job.name) or self._new_row(job.name)
        self._lease_ended(id, row, now)
        if self.ready_since:
            self.ready_since.pop(id, None)
        handler(engine, id, event[2], now)
        self._count_outcome(row, event[0], job.state)

    def _fails(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        """A fail ends a lease, timed."""
        self._finishes(engine, event, handler, True)

    def _runs_out(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        """A lease that ran out is not timed."""
        self._finishes(engine, event, handler, False)

    def _finishes(self, engine: Engine, event: Sequence[Any], handler: Handler, timed: bool) -> None:
        """fail and ttr: the job may go back in line (so it is ready from now
        on, unless leased again at once) or fail for good (counted unless an
        ``exhaust`` it set off counted it already)."""
        id: str = event[1]
        now: int = event[-1]   # (ttr: now; fail: result, now)
        job = engine.jobs[id]
        row = self._row_of(job.name)
        if job.state == J.LEASED:
            self._lease_ended(id, row, now if timed else None)
            self.ready_since[id] = now
        exhausted: Set[str] = set()
        self._exhausted = exhausted
        try:
            handler(engine, *event[1:])
        finally:
            self._exhausted = None
        if job.state == J.FAILED and self.ready_since:
            self.ready_since.pop(id, None)
        if id not in exhausted:
            self._count_outcome(row, event[0], job.state)

    def _exhausts(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        id: str = event[1]
        job = engine.jobs[id]
        if self.ready_since:
            self.ready_since.pop(id, None)
        if self._exhausted is not None:
            self._exhausted.add(id)
        handler(engine, *event[1:])
        self._count_outcome(self._row_of(job.name), event[0], job.state)

    def _removes(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        """delete, export: the job goes; its lease (if any) with it."""
        id: str = event[1]
        if self.leased:
            job = engine.jobs.get(id)
            if job is not None:
                self._lease_ended(id, self._row_of(job.name), None)
        if self.ready_since:
            self.ready_since.pop(id, None)
        handler(engine, *event[1:])

    def _expires(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        self._leaves_with_outcome(engine, event, handler, False)

    def _takes(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        self._leaves_with_outcome(engine, event, handler, True)

    def _leaves_with_outcome(self, engine: Engine, event: Sequence[Any], handler: Handler,
                             taken: bool) -> None:
        """ttl and take: the job goes, and this is its outcome (unless it had
        finished). A take is a lease, and its outcome at once; an expired
        job's lease, if any, ends with it (not timed)."""
        id: str = event[1]
        job = engine.jobs.get(id)
        if job is None:
            handler(engine, *event[1:])
            return
        row = self._row_of(job.name)
        if taken:
            row[LEASED] += 1
            self._waited(job, id, engine.now)
        else:
            self._lease_ended(id, row, None)
        if self.ready_since:
            self.ready_since.pop(id, None)
        handler(engine, *event[1:])
        self._count_outcome(row, event[0], job.state)

    def _restores(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        row = self._row_of(event[3])   # a take that was not delivered: undone
        row[LEASED] -= 1
        row[COMPLETED] -= 1
        handler(engine, *event[1:])

    def _unleases(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        """A lease never delivered (a lease spread over several shards gives
        back all but one): undone, as if it had not happened."""
        id: str = event[1]
        start = self.leased.pop(id, None)
        job = engine.jobs.get(id)
        if start is not None and job is not None:
            row = self._row_of(job.name)
            row[LEASED_NOW] -= 1
            row[LEASED] -= 1
            if start >= 0:
                wait = start - self._ready_since(job, id)
                self.wait.unobserve(wait if wait > 0 else 0)
        handler(engine, *event[1:])

    def _requeues(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        """release, retry: ready again from now."""
        id: str = event[1]
        if self.leased:
            job = engine.jobs.get(id)
            if job is not None:
                self._lease_ended(id, self._row_of(job.name), None)
        self.ready_since[id] = event[2]
        handler(engine, *event[1:])

    def _arrives(self, engine: Engine, event: Sequence[Any], handler: Handler) -> None:
        """A cluster's job moved in: maybe leased already."""
        id: str = event[1]
        handler(engine, *event[1:])
        job = engine.jobs.get(id)
        if job is not None and job.state == J.LEASED and id not in self.leased:
            self.leased[id] = -1   # since when is not known here: not timed
            self._row_of(job.name)[LEASED_NOW] += 1

    # ------------------------------------------------------------ snapshot
    def totals(self) -> List[int]:
        """The five counters summed over every queue."""
        sums = list(self.other[:5])
        for row in self.rows.values():
            for i in range(5):
                sums[i] += row[i]
        return sums

    def queue_rows(self, limit: int = SNAPSHOT_ROWS) -> Tuple[Dict[str, List[int]], List[int]]:
        """``(rows, other)``: name -> counters + gauges (:data:`COUNTERS`, then
        :data:`STATES`) of the ``limit`` busiest queues (by jobs added, then
        jobs held), and the rest summed."""
        engine = self.engine
        queues: Dict[str, JobQueue] = engine.queues if engine is not None else {}
        rows = self.rows
        names = set(rows)
        names.update(queues)
        zero = [0] * 6

        def key(name: str) -> Tuple[int, int, str]:
            queue = queues.get(name)
            return (rows.get(name, zero)[ADDED], queue.jobs if queue is not None else 0, name)

        chosen = heapq.nlargest(limit, names, key=key) if len(names) > limit else sorted(names)
        picked = set(chosen)
        out: Dict[str, List[int]] = {}
        other = self.other[:5] + [0, 0, self.other[LEASED_NOW], 0]
        for name in names:
            row = rows.get(name, zero)
            queue = queues.get(name)
            if queue is not None:
                ready, scheduled, held = len(queue.ready), len(queue.scheduled), queue.jobs
            else:
                ready = scheduled = held = 0
            leased_now = row[LEASED_NOW]
            values = row[:5] + [ready, scheduled, leased_now, max(0, held - ready - scheduled - leased_now)]
            if name in picked:
                out[name] = values
            else:
                for i, value in enumerate(values):
                    other[i] += value
        return out, other

    def snapshot(self, shard: Optional[CountedShard] = None) -> Dict[str, Any]:
        """The control socket's answer: plain data (msgpack) for the supervisor."""
        engine = self.engine if shard is None else shard.engine
        rows, other = self.queue_rows()
        answer: Dict[str, Any] = {
            "kind": "shard", "index": self.index, "pid": self.pid, "started": self.started,
            "jobs": len(engine.jobs) if engine is not None else 0,
            "queues": len(engine.queues) if engine is not None else 0,
            "counters": list(COUNTERS), "states": list(STATES),
            "rows": rows, "other": other, "totals": self.totals(),
            "wait": self.wait.snapshot(), "lease": self.lease.snapshot(),
            "slots_owned": self.slots_owned or _owned(engine), "slot_moves": dict(self.slot_moves),
            "durable": False, "log_bytes": 0, "log_records": 0,
            "fsync": empty_snapshot(FSYNC_BUCKETS),
            "history": False,
        }
        answer.update(traffic.snapshot())   # connections served here directly, their bytes
        answer["refusals"] = refusals.snapshot()   # theirs, by the access rules
        answer["link_frames_sent"] = FRAMES_SENT[0]
        if shard is not None:   # the messaging per job between shards, and requests per loop turn
            peers = shard.homes.peers
            answer["shard_link_frames"] = self.shard_link_frames.count(
                [link.channel for link in peers.links.values()] if peers is not None else [])
            answer["requests"] = shard.requests_run
            answer["request_turns"] = shard.request_turns
        durability = shard.durability if shard is not None else None
        if durability is not None and durability.recovered:
            wal = durability.wal
            answer["durable"] = True
            answer["log_bytes"] = wal.disk_bytes()
            answer["log_records"] = wal.appended_records
            answer["fsync"] = wal.fsync_seconds.snapshot()
        history = shard.history if shard is not None else None
        if history is not None:
            answer["history"] = True
            answer.update(history.stats())
        return answer


#: What :meth:`ShardStats.observe` counts for each declared kind of counting
#: (:data:`queueserver.engine.ops.COUNTS`) beside a job's cycle (module-level:
#: no dict of methods in a class body that mypyc compiles).
COUNTING: Final[Dict[int, Callable[[ShardStats, Engine, Sequence[Any], Handler], None]]] = {
    FAILS: ShardStats._fails, RUNS_OUT: ShardStats._runs_out, EXHAUSTS: ShardStats._exhausts,
    EXPIRES: ShardStats._expires, REMOVES: ShardStats._removes, TAKES: ShardStats._takes,
    RESTORES: ShardStats._restores, UNLEASES: ShardStats._unleases, REQUEUES: ShardStats._requeues,
    ARRIVES: ShardStats._arrives,
}


def _owned(engine: Optional[Engine]) -> int:
    """The slots a cluster engine serves (0 outside a cluster), when nobody set ``slots_owned``."""
    slots = getattr(engine, "slots", None)
    try:
        return int(slots.owned()) if slots is not None else 0
    except Exception:   # another engine's idea of slots: the attribute is the truth then
        return 0
