"""A shard's side of the web console: the ``["console", ...]`` requests of
its control socket (:mod:`queueserver.metrics.control`), answered in the
shard's loop.

Each request runs in a greenlet of its own (the control socket spawns one
per asker) and reads the engine a bounded piece per loop turn (see
:mod:`queueserver.engine.browse`): a page is at most
:data:`~queueserver.engine.browse.MAX_LIMIT` jobs from an offset below
:data:`~queueserver.engine.browse.MAX_OFFSET`, and any scan over the
shard's jobs (leased and finished jobs are in no line of their queue; a
job by number where the engine keeps no index by number) takes one copy
of the job ids (a C-speed list: ~15 ms for a million jobs, the longest
single step) and then yields after every
:data:`~queueserver.engine.browse.SCAN_CHUNK` jobs. Leased jobs are listed
from the statistics' own list of them when those are kept (not with
``--no-metrics``), so only finished jobs and number look-ups scan every job.

The requests (msgpack arrays; every answer is a map, ``{"error": message,
"status": HTTP status}`` when it fails; times are µs)::

    ["console", "queues"]                     every queue: depth by state, oldest ready,
                                              counters, protocols that used it
    ["console", "counters"]                   name -> [added, completed, failed] (rates), each
                                              queue's jobs held, the shard's jobs by state
    ["console", "jobs", queue, state, offset, limit, filters?]
                                              (queue None: every queue's; filters: see
                                              queueserver.engine.browse.Filters)
    ["console", "job", id]                    {"job": detail or None, ...}
    ["console", "number", number]             the same, by goqueue/takeanumber number
    ["console", "leases", limit]              leased jobs (the first ``limit``) with who holds
                                              each, leases per holder, direct connections
    ["console", "delete", id, who]            {"ok", "message", "count", "queue"}
    ["console", "requeue", id, who]
    ["console", "purge", queue, who]
    ["console", "bulk", "retry"|"delete", who, queue, state, ids, filters]
                                              those of ids here, or (ids None) all that
                                              match: {"ok", "count", "skipped"}
    ["console", "shard"]                      jobs, queues, slots, moves, links, followers

The actions change state as client requests do, through the engine and
the shard's log (a durable shard answers once the change is on disk),
named in the job history as protocol ``console`` and connection ``who``.
A single one is logged here at INFO: ``console: <who> deleted job <id>
from <queue>``; a bulk one only at DEBUG (the supervisor logs it once, with
its count over every shard).

Who holds each lease is the shard's own record of it (``Shard.holders``
and :mod:`.clients`), kept with or without the job history.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import gevent
from gevent.event import AsyncResult

from ..engine import browse
from ..engine import job as J
from ..engine.effects import Effects, Event
from ..engine.job import Job
from ..engine.jobqueue import JobQueue
from ..engine.status import NOT_FOUND, OK, SERVER_ERROR, Reply
from ..links.clients import ClientRecord
from .stats import ADDED, COMPLETED, FAILED, LEASED_NOW

if TYPE_CHECKING:
    from .shard import Shard

log = logging.getLogger("queueserver.shard")

#: Seconds an action waits for the shard's log to hold its change.
DURABLE_TIMEOUT = 20.0
#: Jobs a purge deletes per loop turn.
PURGE_BATCH = 500
#: Queues one ``queues`` answer lists (the busiest, by jobs held; the rest are counted).
MAX_QUEUES = 5000
#: Leased jobs one ``leases`` answer lists (all are counted).
MAX_LEASES = 1000
Answer = Dict[str, Any]


def now_us() -> int:
    return time.time_ns() // 1000


class Failed(Exception):
    """A console request that fails: its message and HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _yield() -> None:
    gevent.sleep(0)


class ShardConsole:
    """The console requests of one shard (see the module's docstring)."""

    def __init__(self, shard: "Shard") -> None:
        self.shard = shard
        self._handlers: Dict[str, Callable[..., Answer]] = {
            "queues": self.queues, "counters": self.counters, "jobs": self.jobs, "job": self.job,
            "number": self.number, "delete": self.delete, "requeue": self.requeue, "purge": self.purge,
            "shard": self.shard_view, "leases": self.leases, "bulk": self.bulk,
        }

    def handle(self, request: Sequence[Any]) -> Answer:
        """One ``["console", op, *args]`` request's answer."""
        if len(request) < 2 or not isinstance(request[1], str) or request[1] not in self._handlers:
            return {"error": f"unknown console request {list(request)!r:.100}", "status": 400}
        try:
            return self._handlers[request[1]](*request[2:])
        except Failed as err:
            return {"error": err.message, "status": err.status}
        except TypeError as err:   # the wrong arguments
            return {"error": f"bad console request {request[1]}: {err}", "status": 400}

    # ------------------------------------------------------------- reading
    def _leased_counts(self) -> Dict[str, int]:
        """Leased jobs by queue: the statistics count them (when attached);
        else one chunked scan over the shard's jobs."""
        stats = self.shard.stats
        if stats.engine is self.shard.engine:
            return {name: row[LEASED_NOW] for name, row in stats.rows.items() if row[LEASED_NOW]}
        counts: Dict[str, List[int]] = {}
        jobs = self.shard.engine.jobs
        ids = list(jobs)
        for start in range(0, len(ids), browse.SCAN_CHUNK):
            browse.count_states((jobs[id] for id in ids[start:start + browse.SCAN_CHUNK] if id in jobs),
                                counts)
            _yield()
        return {name: c[0] for name, c in counts.items()}

    def queues(self) -> Answer:
        engine, stats = self.shard.engine, self.shard.stats
        leased = self._leased_counts()
        queues = engine.queues
        names = list(queues)
        truncated = 0
        if len(names) > MAX_QUEUES:
            names.sort(key=lambda n: -queues[n].jobs)
            truncated = len(names) - MAX_QUEUES
            names = names[:MAX_QUEUES]
        requeued = stats.ready_since
        rows = stats.rows
        uses = self.shard.direct.queue_uses   # the direct path's; the routers answer for theirs
        out: Dict[str, Any] = {}
        for i, name in enumerate(names):
            queue = queues.get(name)
            if queue is None:   # gone while this yielded
                continue
            row = browse.queue_depth(queue, leased.get(name, 0), requeued)
            counters = rows.get(name)
            row["added"], row["completed"], row["failed"] = (
                (counters[ADDED], counters[COMPLETED], counters[FAILED]) if counters is not None else (0, 0, 0))
            row["protocols"] = list(uses.get(name, ()))
            out[name] = row
            if i % 1000 == 999:
                _yield()
        return {"shard": self.shard.index, "now": now_us(), "queues": out, "truncated": truncated}

    def counters(self) -> Answer:
        """What the console samples every few seconds: each queue's counters
        (added, completed, failed), the shard's totals, each queue's jobs
        held (``depth``, queues holding none left out) and the shard's jobs
        by state (``states``: ready, scheduled, leased, finished; without
        the statistics, leased jobs count as finished: telling them apart
        would read every job)."""
        shard, stats = self.shard, self.shard.stats
        totals = stats.totals()
        depth: Dict[str, int] = {}
        ready = scheduled = 0
        for name, queue in shard.engine.queues.items():
            if queue.jobs:
                depth[name] = queue.jobs
                ready += len(queue.ready)
                scheduled += len(queue.scheduled)
        leased = len(stats.leased) if stats.engine is shard.engine else 0
        rest = len(shard.engine.jobs) - ready - scheduled - leased
        return {"shard": shard.index, "now": now_us(),
                "rows": {name: [row[ADDED], row[COMPLETED], row[FAILED]] for name, row in stats.rows.items()},
                "totals": [totals[ADDED], totals[COMPLETED], totals[FAILED]],
                "depth": depth, "states": [ready, scheduled, leased, max(0, rest)]}

    def jobs(self, name: Optional[str], state: str, offset: int, limit: int,
             filters: Optional[browse.Filters] = None) -> Answer:
        """A page of queue ``name``'s jobs in ``state`` and how many there are;
        with ``filters`` (or no ``name``: every queue's), those that pass
        them, found by reading every candidate (the true total counted)."""
        engine = self.shard.engine
        queue = engine.queues.get(name) if name is not None else None
        if queue is None and name is not None:
            raise Failed(f"no queue {name!r} here", 404)
        if state not in browse.STATES:
            raise Failed(f"no state {state!r}: one of {', '.join(browse.STATES)}", 400)
        narrowed = browse.filtered(filters) or queue is None
        limit = max(0 if narrowed else 1, min(int(limit), browse.MAX_LIMIT))
        offset = max(0, min(int(offset), browse.MAX_OFFSET))
        now = now_us()
        if narrowed:
            rows, total = browse.find_jobs(engine.jobs, self._candidates(queue, state),
                                           browse.matching(name, state, filters or {}, now), offset, limit, now,
                                           between=_yield)
            return {"now": now, "total": total, "jobs": rows}
        assert queue is not None and name is not None   # (narrowed otherwise)
        if state in (browse.READY, browse.SCHEDULED):
            rows, total = browse.line_page(queue, state, offset, limit, now)
            return {"now": now, "total": total, "jobs": rows}
        depth = browse.queue_depth(queue, self._leased_counts().get(name, 0))
        total = depth[state]
        if offset >= total:
            return {"now": now, "total": total, "jobs": []}
        stats = self.shard.stats
        # Leased jobs: the statistics know which they are (fewer to look at).
        ids = list(stats.leased) if state == browse.LEASED and stats.engine is engine else list(engine.jobs)
        rows = browse.match_jobs(engine.jobs, ids, browse.wanted(name, state), offset, limit, now,
                                 between=_yield)
        return {"now": now, "total": total, "jobs": rows}

    def _candidates(self, queue: Optional[JobQueue], state: str) -> List[str]:
        """The ids a filtered look at ``state`` reads: a queue's line, the
        leased jobs the statistics know, or every job."""
        engine, stats = self.shard.engine, self.shard.stats
        if queue is not None and state in (browse.READY, browse.SCHEDULED):
            return browse.line_ids(queue, state, between=_yield)
        if state == browse.LEASED and stats.engine is engine:
            return list(stats.leased)
        return list(engine.jobs)

    def _find(self, id: str) -> Optional[Job]:
        return self.shard.engine.jobs.get(id)

    def _may_hold(self, number: int) -> bool:
        """Whether job ``number`` may be here: on one host, the shard that
        numbers it is known (its residue class, or the block that holds it)
        unless it was made before blocks; in a cluster jobs move with their slots."""
        shard = self.shard
        if shard.cluster is not None:
            return True
        blocks = shard.numbering.blocks
        if blocks is None:
            return (number - 1) % shard.shards == shard.index
        numbers = blocks.numbers
        return numbers.is_old(number) or numbers.owner(number) == shard.index

    def _find_number(self, number: int) -> Optional[Job]:
        engine = self.shard.engine
        if engine.by_number is not None:
            return engine.by_number.get(number)
        if not self._may_hold(number):
            return None
        return browse.find_number(engine.jobs, list(engine.jobs), number, between=_yield)

    def _detail(self, job: Optional[Job]) -> Answer:
        shard = self.shard
        history = shard.history
        answer: Answer = {"shard": shard.index, "now": now_us(), "job": None,
                          "history_dir": history.directory if history is not None else None}
        if job is None:
            return answer
        detail = browse.job_detail(job, answer["now"])
        if job.state == J.LEASED:
            detail.update(self._lease(job))
        answer["job"] = detail
        return answer

    def _lease(self, job: Job) -> Answer:
        """Who holds leased ``job`` (its client's record; None: not known) and since when (µs)."""
        holder = self.shard.holder(job.id)
        return {"holder": holder.view() if holder is not None else None, "leased_at": self._lease_start(job)}

    def _lease_start(self, job: Job) -> Optional[int]:
        """When ``job``'s lease began: as the statistics noted it, else from
        its TTR timer (None: neither, a lease with no time limit)."""
        stats = self.shard.stats
        if stats.engine is self.shard.engine:
            start = stats.leased.get(job.id)
            if start is not None and start >= 0:
                return start
        due = browse.lease_due(job)
        return due - job.ttr * J.MS if due is not None and job.ttr else None

    def leases(self, limit: int = MAX_LEASES) -> Answer:
        """The shard's leased jobs (the first ``limit``, each with its holder
        and when it was leased), how many leases each holder has, and the
        connections its direct path serves now. The leased jobs are the
        statistics' list of them when kept, else one chunked scan."""
        shard, engine = self.shard, self.shard.engine
        limit = max(0, min(int(limit), MAX_LEASES))
        jobs, holders = engine.jobs, shard.holders
        stats = shard.stats
        ids = list(stats.leased) if stats.engine is engine else list(jobs)
        now = now_us()
        rows: List[Answer] = []
        per_holder: Dict[int, List[Any]] = {}   # id(record) -> [its view, leases]
        total = unknown = 0
        for start in range(0, len(ids), browse.SCAN_CHUNK):
            for job_id in ids[start:start + browse.SCAN_CHUNK]:
                job = jobs.get(job_id)
                if job is None or job.state != J.LEASED:
                    continue
                total += 1
                holder = holders.get(job_id)
                view: Optional[Answer] = None
                if holder is None:
                    unknown += 1
                else:
                    entry = per_holder.get(id(holder))
                    if entry is None:
                        entry = per_holder[id(holder)] = [holder.view(), 0]
                    entry[1] += 1
                    view = entry[0]
                if len(rows) < limit:
                    row = browse.job_row(job, now)
                    row["holder"], row["leased_at"] = view, self._lease_start(job)
                    rows.append(row)
            _yield()
        return {"shard": shard.index, "now": now, "total": total, "unknown": unknown, "leases": rows,
                "holders": list(per_holder.values()),
                "direct": [record.view() for record in shard.direct.records.values()]}

    def job(self, id: str) -> Answer:
        return self._detail(self._find(str(id)))

    def number(self, number: int) -> Answer:
        return self._detail(self._find_number(int(number)))

    def shard_view(self) -> Answer:
        shard = self.shard
        engine = shard.engine
        answer: Answer = {"shard": shard.index, "jobs": len(engine.jobs), "queues": len(engine.queues),
                          "slots": None, "links": [], "name": str(shard.index)}
        if engine.slots is not None:
            answer["slots"] = engine.slots.summary()
        cluster = shard.cluster
        if cluster is not None:
            answer["name"] = cluster.me.name
        peers = shard.homes.peers
        if peers is not None:
            answer["links"] = [[ordinal, bool(link.up)] for ordinal, link in sorted(peers.links.items())]
        replicator = getattr(shard.durability, "replicator", None)   # a cluster with replicas
        answer["followers"] = replicator.status() if replicator is not None else []
        return answer

    # ------------------------------------------------------------- actions
    def _settled(self, reply: Reply) -> Reply:
        """``reply`` once the shard's log holds every change made before it."""
        shard = self.shard
        if shard.durability is None:
            return reply
        result: "AsyncResult[Reply]" = AsyncResult()
        shard.answer(result.set, reply)
        shard.schedule_after_batch()
        try:
            settled = result.get(timeout=DURABLE_TIMEOUT)
        except gevent.Timeout:
            settled = None
        if settled is None:
            raise Failed("the shard's log did not confirm the change in time", 503)
        return settled

    def _execute(self, op: str, args: Sequence[Any], who: str) -> Reply:
        reply = self.shard.execute(op, args, None, ClientRecord.console(who))
        assert reply is not None   # no token: never parked
        self.shard.schedule_after_batch()
        return reply

    def _step(self, events: List[Event], who: str, requeued: Sequence[Job] = ()) -> None:
        """A console state change that no request makes (:func:`browse.console_step`):
        logged and taken in like a request's, its history naming the console."""
        shard = self.shard
        if shard.stopping:
            raise Failed("the shard is stopping", 503)
        if shard.durability is not None and shard.durability.refusal("retry") is not None:
            raise Failed("the shard's log cannot be written now", 503)
        now = now_us()
        fx = browse.console_step(shard.engine, events, now)
        kept = [id for id in fx.forgotten if id not in shard.engine.jobs]   # a job made anew stays at its home
        fx.forgotten = kept
        shard.take_effects(fx)
        self._history(fx, now, who, requeued)
        shard.schedule_after_batch()

    def _history(self, fx: Effects, now: int, who: str, requeued: Sequence[Job]) -> None:
        history = self.shard.history
        if history is None or fx.history is None:
            return
        entries = list(fx.history)
        for old in requeued:   # a failed job made anew: "retried", by the console
            job = self.shard.engine.jobs.get(old.id)
            if job is not None:
                entries.append(("retry", job.id, job.name, job.number, job.attempts, job.priority,
                                len(job.payload), job.state, None))
        context = ("console", who)
        history.record(entries, now, context, lambda token: context)

    def _job_or_fail(self, id: str) -> Job:
        job = self._find(str(id))
        if job is None:
            raise Failed(f"no job {id} here", 404)
        return job

    def delete(self, id: str, who: str) -> Answer:
        job = self._job_or_fail(id)
        name = job.name
        reply = self._settled(self._execute("delete", (job.id,), who))
        if reply[0] == NOT_FOUND:
            raise Failed(f"no job {id} here", 404)
        if reply[0] != OK:
            raise Failed(f"the shard refused: {reply[1]}", 503 if reply[0] == SERVER_ERROR else 400)
        log.info("console: %s deleted job %s from %s", who, job.id, name)
        return {"ok": True, "message": f"deleted job {job.id} from {name}", "count": 1, "queue": name}

    def requeue(self, id: str, who: str) -> Answer:
        job = self._job_or_fail(id)
        name, state = job.name, job.state
        if state == J.LEASED:
            self._step(browse.release_events(job, now_us()), who)
            what = "leased"
        elif state == J.FAILED:
            self._step(browse.requeue_events(job), who, (job,))
            what = "failed"
        else:
            raise Failed(f"job {job.id} is {browse.state_of(job)}"
                         f"{' (completed)' if state == J.COMPLETED else ''}: only a failed or a leased "
                         f"job can be requeued", 400)
        reply = self._settled([OK, None])
        if reply[0] != OK:
            raise Failed(f"the shard's log failed: {reply[1]}", 503)
        log.info("console: %s requeued %s job %s in %s", who, what, job.id, name)
        return {"ok": True, "message": f"requeued {what} job {job.id} in {name}", "count": 1, "queue": name}

    def _line_batch(self, name: str) -> List[str]:
        """Up to :data:`PURGE_BATCH` ids of queue ``name``'s ready and scheduled jobs."""
        queue = self.shard.engine.queues.get(name)
        if queue is None:
            return []
        ids = [job.id for job in queue.ready.islice(0, PURGE_BATCH)]
        if len(ids) < PURGE_BATCH:
            ids += [job.id for job in queue.scheduled.islice(0, PURGE_BATCH - len(ids))]
        return ids

    def _rest_of(self, name: str, most: int) -> List[str]:
        """Ids of queue ``name``'s other jobs (leased, finished): one scan, a chunk per loop turn."""
        jobs = self.shard.engine.jobs
        every = list(jobs)
        found: List[str] = []
        for start in range(0, len(every), browse.SCAN_CHUNK):
            for id in every[start:start + browse.SCAN_CHUNK]:
                job = jobs.get(id)
                if job is not None and job.name == name:
                    found.append(id)
                    if len(found) >= most:
                        return found
            _yield()
        return found

    def _delete_all(self, ids: List[str], name: Optional[str], who: str, done: int) -> int:
        """Delete ``ids`` (those still here, of queue ``name`` unless None),
        :data:`PURGE_BATCH` per loop turn, each batch durable before the
        next; how many went."""
        engine = self.shard.engine
        count = 0
        for start in range(0, len(ids), PURGE_BATCH):
            for id in ids[start:start + PURGE_BATCH]:
                job = engine.jobs.get(id)
                if job is None or (name is not None and job.name != name):
                    continue
                reply = self._execute("delete", (id,), who)
                if reply[0] == OK:
                    count += 1
                elif reply[0] == SERVER_ERROR:
                    raise Failed(f"deleting stopped after {done + count} jobs: {reply[1]}", 503)
            settled = self._settled([OK, None])
            if settled[0] != OK:
                raise Failed(f"deleting stopped after {done + count} jobs: {settled[1]}", 503)
            _yield()
        return count

    def _retry_all(self, ids: List[str], who: str) -> Tuple[int, int]:
        """Requeue the failed and leased jobs of ``ids`` (those still here),
        :data:`PURGE_BATCH` per loop turn (one engine step each), each batch
        durable before the next: ``(requeued, passed over)``, the latter
        being jobs that are neither failed nor leased."""
        engine = self.shard.engine
        done = skipped = 0
        for start in range(0, len(ids), PURGE_BATCH):
            events: List[Event] = []
            requeued: List[Job] = []
            now = now_us()
            for id in ids[start:start + PURGE_BATCH]:
                job = engine.jobs.get(id)
                if job is None:
                    continue
                if job.state == J.FAILED:
                    events += browse.requeue_events(job)
                    requeued.append(job)
                elif job.state == J.LEASED:
                    events += browse.release_events(job, now)
                else:
                    skipped += 1
                    continue
                done += 1
            if events:
                self._step(events, who, requeued)
                settled = self._settled([OK, None])
                if settled[0] != OK:
                    raise Failed(f"retrying stopped after {done} jobs: {settled[1]}", 503)
            _yield()
        return done, skipped

    def bulk(self, action: str, who: str, name: Optional[str], state: str, ids: Optional[List[str]],
             filters: Optional[browse.Filters] = None) -> Answer:
        """``retry`` or ``delete`` many jobs at once: those of ``ids`` that
        are here (of queue ``name`` unless None), or with ``ids`` None every
        job here of ``name`` (any queue: None) in ``state`` that passes
        ``filters``. Logged here at DEBUG only: the console logs the whole
        action once, with its count over every shard."""
        if action not in ("retry", "delete"):
            raise Failed(f"no bulk action {action!r}: retry or delete", 400)
        engine = self.shard.engine
        if ids is None:
            if state not in browse.STATES:
                raise Failed(f"no state {state!r}: one of {', '.join(browse.STATES)}", 400)
            now = now_us()
            want = browse.matching(name, state, filters or {}, now)
            queue = engine.queues.get(name) if name is not None else None
            candidates = [] if name is not None and queue is None else self._candidates(queue, state)
            targets: List[str] = []
            jobs = engine.jobs
            for start in range(0, len(candidates), browse.SCAN_CHUNK):
                for id in candidates[start:start + browse.SCAN_CHUNK]:
                    job = jobs.get(id)
                    if job is not None and want(job):
                        targets.append(id)
                _yield()
        else:
            targets = [str(id) for id in ids]
            targets = [id for id in targets if id in engine.jobs
                       and (name is None or engine.jobs[id].name == name)]
        if action == "delete":
            count, skipped = self._delete_all(targets, name, who, 0), 0
        else:
            count, skipped = self._retry_all(targets, who)
        log.debug("console: %s %s %d jobs here (%d passed over)", who,
                  "deleted" if action == "delete" else "retried", count, skipped)
        return {"ok": True, "count": count, "skipped": skipped,
                "message": f"{'deleted' if action == 'delete' else 'retried'} {count} jobs"}

    def purge(self, name: str, who: str) -> Answer:
        """Every job of queue ``name`` it held when asked, whatever its state:
        the ready and scheduled ones from its lines, then the rest found by
        one scan; a batch per loop turn (jobs added meanwhile may stay)."""
        queue = self.shard.engine.queues.get(name)
        if queue is None:
            raise Failed(f"no queue {name!r} here", 404)
        budget = queue.jobs
        count = 0
        while count < budget:
            ids = self._line_batch(name)[:budget - count]
            if not ids:
                break
            went = self._delete_all(ids, name, who, count)
            count += went
            if not went:
                break
        queue = self.shard.engine.queues.get(name)
        if count < budget and queue is not None and queue.jobs:
            count += self._delete_all(self._rest_of(name, budget - count), name, who, count)
        log.info("console: %s purged %d jobs from %s", who, count, name)
        return {"ok": True, "message": f"purged {count} jobs from {name}", "count": count, "queue": name}
