"""What a shard counts for ``/metrics``: per-queue job counters, wait and
lease time histograms, slot moves; and the snapshot its control socket answers.

Where the counting happens: every state change of the engine is one event
applied through the engine's table of event handlers (``Engine.handlers``,
see :meth:`Engine.apply`). :meth:`ShardStats.attach` gives the shard's
engine, and only it, a copy of that table in which the handlers of the
events counted here are wrapped: each wrapper looks at the job *before*
the original handler runs (its queue, whether it is leased, whether it has
finished) and, where needed, after. Counting from ``Shard.take_effects(fx)`` would
see the events only after the whole step, when a job may be gone already
(a ``run`` job is deleted in the very step that completes it; a TTL removes
the job its event names) and when later events of the step may have
changed it again, so neither its queue nor whether *this* event finished it
could be told. Events nobody counts (``add`` of ``restore``, ``wake``,
``queue``, snapshot ``job`` events, and any event added later) keep their
handlers untouched. The table is wrapped only after recovery: replaying the
log rebuilds state and counts nothing.

What a job's event adds (``row`` is its queue's counter row). Completed,
failed and expired are counted where :func:`.outcomes.history_event`, the
job history's own rule, reads that outcome in the event (completed and
taken: completed; failed and dead: failed; expired: expired), so that
``/metrics`` and the history never disagree; takeanumber's DONE and
goqueue's DELETE of a reserved job reach here as ``complete`` (then a
``delete``), a RETRY with no retries left as ``fail`` (then a ``delete``)::

    add              added
    lease            leased, leased now + 1; the wait since it became ready
    unlease          the lease undone (never delivered: a lease spread over
                     several shards gives back all but one): leased - 1,
                     leased now - 1, its wait taken out of the histogram
    take             leased and completed (a dequeue that needs no
                     completion: queued, TaskFlux); its wait
    restore          (a take not delivered) leased - 1, completed - 1
    complete         completed; a leased job: leased now - 1 and its lease time
    fail             a leased job: leased now - 1 and its lease time;
                     failed when it finished the job
    ttr              leased now - 1; failed when attempts were used up
    exhaust          failed (met at lease time with no attempts left)
    ttl              expired, unless the job had finished; leased now - 1 if leased
    release, retry, delete, export (a cluster's job leaving for another shard)
                     leased now - 1 if leased (nothing is counted)
    job              (a cluster's job moving in) leased now + 1 if it comes leased

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
from typing import TYPE_CHECKING, Any, Callable, Dict, Final, List, Optional, Protocol, Set, Tuple

from ..engine import job as J
from ..engine.engine import T_TTL as J_TTL, T_TTR as J_TTR, Engine
from ..engine.job import Job
from ..engine.jobqueue import JobQueue
from ..metrics import FSYNC_BUCKETS, LATENCY_BUCKETS, MAX_QUEUE_LABELS, traffic
from ..metrics.histogram import Histogram, empty_snapshot
from ..metrics.linkframes import LinkFrames
from ..net.channel import FRAMES_SENT
from .outcomes import history_event

if TYPE_CHECKING:
    from .durability import Durability
    from .history import HistoryWriter
    from .peers import Peers


class CountedShard(Protocol):
    """What :meth:`ShardStats.snapshot` reads of the shard it counts for (a
    :class:`~.shard.Shard`, which holds its statistics and so is not named here)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def peers(self) -> Optional[Peers]: ...

    @property
    def requests_run(self) -> int: ...

    @property
    def request_turns(self) -> int: ...

    @property
    def durability(self) -> Optional[Durability]: ...

    @property
    def history(self) -> Optional[HistoryWriter]: ...

#: an engine event's handler: ``handler(engine, *the event's fields)``
Handler = Callable[..., None]

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


class ShardStats:
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
        if self.engine is engine:
            return
        self.engine = engine
        base: Dict[str, Handler] = dict(engine.handlers)
        table = dict(base)
        rows, new_row, move_to_end = self.rows, self._new_row, self.rows.move_to_end
        leased, ready_since = self.leased, self.ready_since
        observe_wait, observe_lease = self.wait.observe, self.lease.observe
        stats = self
        LEASED_STATE, FAILED_STATE = J.LEASED, J.FAILED

        def row_of(name: str) -> List[int]:
            row = rows.get(name)
            return row if row is not None else new_row(name)

        def count_outcome(row: List[int], kind: str, state: int) -> None:
            """Count the outcome (if any) the history's rule reads in event
            ``kind`` whose job is in ``state`` after it."""
            counter = OUTCOME_COUNTERS.get(history_event(kind, state))
            if counter is not None:
                row[counter] += 1

        def waited(job: Job, id: str, now: int) -> None:
            since = ready_since.get(id) if ready_since else None
            if since is None:
                since = ready_at(job.key)
            wait = now - since
            observe_wait(wait if wait > 0 else 0)

        def lease_ended(id: str, row: List[int], now: Optional[int]) -> bool:
            start = leased.pop(id, None)
            if start is None:
                return False
            row[LEASED_NOW] -= 1
            if now is not None and start >= 0:
                took = now - start
                observe_lease(took if took > 0 else 0)
            return True

        on_add = base["add"]

        def add(engine: Engine, id: str, number: int, name: str, *rest: Any) -> None:
            row = rows.get(name)
            if row is None:
                row = new_row(name)
            else:
                move_to_end(name)
            row[ADDED] += 1
            on_add(engine, id, number, name, *rest)

        on_lease = base["lease"]

        def lease(engine: Engine, id: str, now: int) -> None:   # the hot path: inlined
            job = engine.jobs[id]
            row = rows.get(job.name) or new_row(job.name)
            row[LEASED] += 1
            row[LEASED_NOW] += 1
            since = ready_since.get(id) if ready_since else None
            if since is None:
                since = ready_at(job.key)
            wait = now - since
            observe_wait(wait if wait > 0 else 0)
            leased[id] = now
            on_lease(engine, id, now)

        on_complete = base["complete"]

        def complete(engine: Engine, id: str, result: bytes, now: int) -> None:   # the hot path: inlined
            job = engine.jobs[id]
            row = rows.get(job.name) or new_row(job.name)
            start = leased.pop(id, None)
            if start is not None:
                row[LEASED_NOW] -= 1
                if start >= 0:
                    took = now - start
                    observe_lease(took if took > 0 else 0)
            if ready_since:
                ready_since.pop(id, None)
            on_complete(engine, id, result, now)
            count_outcome(row, "complete", job.state)

        def finishing(kind: str, ends_lease_at: Callable[[int], Optional[int]]) -> Handler:
            """ttr and fail: the job may go back in line (so it is ready from
            now on, unless leased again at once) or fail for good (counted
            unless an ``exhaust`` it set off counted it already)."""
            original = base[kind]

            def handler(engine: Engine, id: str, *args: Any) -> None:
                job = engine.jobs[id]
                row = row_of(job.name)
                now: int = args[-1]   # (ttr: now; fail: result, now)
                if job.state == LEASED_STATE:
                    lease_ended(id, row, ends_lease_at(now))
                    ready_since[id] = now
                exhausted: Set[str] = set()
                stats._exhausted = exhausted
                try:
                    original(engine, id, *args)
                finally:
                    stats._exhausted = None
                if job.state == FAILED_STATE and ready_since:
                    ready_since.pop(id, None)
                if id not in exhausted:
                    count_outcome(row, kind, job.state)
            return handler

        table["fail"] = finishing("fail", lambda now: now)    # a fail ends a lease: timed
        table[J_TTR] = finishing(J_TTR, lambda now: None)     # a lease that ran out: not timed

        on_exhaust = base["exhaust"]

        def exhaust(engine: Engine, id: str) -> None:
            job = engine.jobs[id]
            if ready_since:
                ready_since.pop(id, None)
            if stats._exhausted is not None:
                stats._exhausted.add(id)
            on_exhaust(engine, id)
            count_outcome(row_of(job.name), "exhaust", job.state)

        on_ttl = base[J_TTL]

        def ttl(engine: Engine, id: str, now: int) -> None:
            job = engine.jobs.get(id)
            if job is not None:
                row = row_of(job.name)
                lease_ended(id, row, None)
                if ready_since:
                    ready_since.pop(id, None)
            on_ttl(engine, id, now)
            if job is not None:
                count_outcome(row, J_TTL, job.state)

        def leaving(original: Handler) -> Handler:
            """delete: the job goes; its lease (if any) with it."""
            def handler(engine: Engine, id: str, *args: Any) -> None:
                if leased:
                    job = engine.jobs.get(id)
                    if job is not None:
                        lease_ended(id, row_of(job.name), None)
                if ready_since:
                    ready_since.pop(id, None)
                original(engine, id, *args)
            return handler

        on_take = base["take"]

        def take(engine: Engine, id: str) -> None:
            job = engine.jobs.get(id)
            if job is not None:
                row = row_of(job.name)
                row[LEASED] += 1   # a take is a lease, and its outcome at once
                waited(job, id, engine.now)
                if ready_since:
                    ready_since.pop(id, None)
            on_take(engine, id)
            if job is not None:
                count_outcome(row, "take", job.state)

        on_restore = base["restore"]

        def restore(engine: Engine, id: str, number: int, name: str, *rest: Any) -> None:
            row = row_of(name)   # a take that was not delivered: undone
            row[LEASED] -= 1
            row[COMPLETED] -= 1
            on_restore(engine, id, number, name, *rest)

        on_unlease = base["unlease"]
        unobserve_wait = self.wait.unobserve

        def unlease(engine: Engine, id: str, now: int) -> None:
            """A lease never delivered (a lease spread over several shards
            gives back all but one): undone, as if it had not happened."""
            start = leased.pop(id, None)
            job = engine.jobs.get(id)
            if start is not None and job is not None:
                row = row_of(job.name)
                row[LEASED_NOW] -= 1
                row[LEASED] -= 1
                if start >= 0:
                    since = ready_since.get(id) if ready_since else None
                    if since is None:
                        since = ready_at(job.key)
                    wait = start - since
                    unobserve_wait(wait if wait > 0 else 0)
            on_unlease(engine, id, now)

        def back_in_line(original: Handler) -> Handler:
            """release, retry: ready again from now."""
            def handler(engine: Engine, id: str, now: int, *args: Any) -> None:
                if leased:
                    job = engine.jobs.get(id)
                    if job is not None:
                        lease_ended(id, row_of(job.name), None)
                ready_since[id] = now
                original(engine, id, now, *args)
            return handler

        table["add"] = add
        table["lease"] = lease
        table["complete"] = complete
        table["exhaust"] = exhaust
        table[J_TTL] = ttl
        table["take"] = take
        table["restore"] = restore
        table["unlease"] = unlease
        table["delete"] = leaving(base["delete"])
        if "export" in base:   # a cluster's job set aside for another shard: it leaves
            table["export"] = leaving(base["export"])
        if "job" in base:      # a cluster's job moved in: maybe leased already
            on_job = base["job"]

            def job_arrives(engine: Engine, id: str, *rest: Any) -> None:
                on_job(engine, id, *rest)
                job = engine.jobs.get(id)
                if job is not None and job.state == LEASED_STATE and id not in leased:
                    leased[id] = -1   # since when is not known here: not timed
                    row_of(job.name)[LEASED_NOW] += 1

            table["job"] = job_arrives
        for kind in ("release", "retry"):
            table[kind] = back_in_line(base[kind])
        engine.handlers = table

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
        answer["link_frames_sent"] = FRAMES_SENT[0]
        if shard is not None:   # the messaging per job between shards, and requests per loop turn
            peers = shard.peers
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


def _owned(engine: Optional[Engine]) -> int:
    """The slots a cluster engine serves (0 outside a cluster), when nobody set ``slots_owned``."""
    slots = getattr(engine, "slots", None)
    try:
        return int(slots.owned()) if slots is not None else 0
    except Exception:   # another engine's idea of slots: the attribute is the truth then
        return 0
