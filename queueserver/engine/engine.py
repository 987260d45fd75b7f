"""The pure queue/job state machine of one shard.

No I/O and no clock: every call takes ``now`` (integer microseconds since
the epoch). Requests enter through :meth:`Engine.execute` and timers run
through :meth:`Engine.advance`; each returns the :class:`Effects` of that
step: the request's own reply ``[status, value]`` (None when it waits: a
blocking lease, ``result`` or ``run``), answers to requests parked earlier
as ``(token, reply)`` pairs (the caller's ``token`` is opaque here), the
state changes in order, and the jobs that appeared or left.

Every state change goes through :meth:`Engine.apply` as a plain event tuple
(``("lease", id, now)``, ...). Events are deterministic and self-contained,
so the events of a run replay into the same state (see :meth:`replay`);
waiters are connections' business and are never among them.

A job's life, state x event -> state (READY and SCHEDULED are the stored
states NEW or PENDING, in the ready line or asleep until their time; "gone"
means removed from the shard; a request that does not fit its state is
refused before any event, e.g. ``complete`` of a finished job is
``Duplicate result``)::

    state      | event    | next state
    -----------+----------+---------------------------------------------------
    (none)     | add      | READY, or SCHEDULED when its time is later;
               |          |   a READY job goes at once to a parked lessee: LEASED
    (none)     | restore  | READY at its old place (a ``take`` not delivered)
    SCHEDULED  | wake     | READY
    READY      | lease    | LEASED (attempts + 1, the TTR timer starts)
    READY      | exhaust  | FAILED (met at lease time with no attempts left)
    LEASED     | unlease  | READY (the lease was never delivered: attempts - 1)
    LEASED     | ttr      | READY; FAILED when max-attempts are used up
    LEASED     | release  | READY (the lease's owner is gone)
    unfinished | complete | COMPLETED (result kept for ``result`` and ``run``)
    LEASED     | fail     | READY while fails < max-fails and attempts remain,
               |          |   else FAILED
    READY,     | fail     | stays (fails + 1) while fails < max-fails, else FAILED
    SCHEDULED  |          |
    any        | retry    | READY at its first place in add order (fails + 1)
    any        | delete   | gone (a ``run`` job also goes once its caller is answered)
    READY      | take     | gone (dequeued with no acknowledgement: queued, TaskFlux)
    any        | ttl      | gone (its time to live is over)

tests/test_engine_states.py walks this table row by row.

Request tokens are ``(channel, request id)`` pairs chosen by the shell. A
lease may name an ``owner`` (a connection id within the token's channel):
jobs leased to an owner go back to ready when the shell says the owner is
gone (:meth:`disown`), which is goqueue's close semantics.

Queues cost memory, so they do not live for ever: a queue with no jobs and
no waiters is *unused*, and one unused for ``queue_idle`` microseconds is
removed (``advance`` does it, and ``next_deadline`` includes it). At most
``max_queues`` queues exist; a request that would create one more first
drops the longest-unused queue, and fails with ``Too many queues`` when
every queue is in use.

Why one module, though a long one: every request handler and the event
handlers it applies change the same state under the invariants of the
table above, which must be checkable in one reading; the parts that stand
alone are apart already (:mod:`.jobqueue`, :mod:`.timers`, :mod:`.views`,
:mod:`.browse`, :mod:`.ownership`, :mod:`.ops`).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import (Any, Callable, ClassVar, Dict, Final, Iterable, Iterator, List, Literal, Optional,
                    Sequence, Set, Union)

from . import job as J
from .effects import Effects, Event, JobEvent, Token
from .job import Job
from .views import as_lease, inspect_view, lease_view, result_view
from .jobqueue import JobQueue, digest
from .observer import EventObserver
from .status import (
    CLIENT_ERROR, NOT_FOUND, OK, TIMEOUT, EngineError, Reply, client_error, not_found, server_error,
)
from .ownership import SlotOwnership
from .timers import Timer, Timers
from ..placement import from_ranges, slot_of

MS: Final = 1000  # microseconds per millisecond
MOVE_CHUNK_BYTES: Final = 4 << 20   # payload bytes per part of a slot move (frames stay far below their cap)

# Timer kinds.
T_WAKE: Final = "wake"        # a scheduled job's time has come
T_TTR: Final = "ttr"          # a lease ran out
T_TTL: Final = "ttl"          # a job lived long enough
T_WAIT: Final = "wait"        # a waiter's wait-timeout

#: Who a lease belongs to: ``(channel of the token, connection id)``, opaque
#: here as the token is (compared, and handed back to the shell).
Owner = Any


class Waiter:
    """A request parked until a job, a result or its deadline arrives."""

    __slots__ = ("token", "role", "queues", "job_id", "due", "owner")

    #: as an entry of the shard's timers, a waiter stands for its wait-timeout
    kind: ClassVar[Literal["wait"]] = T_WAIT

    def __init__(self, token: Token, role: str) -> None:
        self.token = token
        self.role = role            # "lease", "result", "run" or "run-leased"
        self.queues: Sequence[JobQueue] = ()
        self.job_id: Optional[str] = None   # set for "result", "run" and "run-leased"
        self.due: Optional[int] = None
        self.owner: Owner = None    # who a job handed to this waiter is leased to


#: µs a finished job with no TTL of its own keeps its result (an hour)
KEEP_UNTIMED_RESULTS: Final = 3_600_000_000


class Engine:
    def __init__(self, shard: int = 0, max_queues: Optional[int] = None, queue_idle: Optional[int] = None,
                 shards: int = 1, keep_untimed_results: int = KEEP_UNTIMED_RESULTS) -> None:
        self.shard = shard
        self.shards = shards            # job numbers made here are shard + 1 (mod shards)
        self.max_queues = max_queues    # None: no cap
        self.queue_idle = queue_idle    # µs an unused queue is kept; None or 0: for ever
        #: unused queues, longest unused first: name -> since when (µs)
        self.idle: "OrderedDict[str, int]" = OrderedDict()
        #: finished jobs with no TTL of their own, oldest first: id -> finished when (µs);
        #: each goes ``keep_untimed_results`` µs after it finished (see _finish)
        self.kept: Dict[str, int] = {}
        self.keep_untimed_results = keep_untimed_results
        self.now = 0                    # the time of the latest request or timer run
        #: owner -> ids of the jobs leased to it; job id -> its owner
        self.owned: Dict[Owner, Set[str]] = {}
        self._owner_of: Dict[str, Owner] = {}
        self.jobs: Dict[str, Job] = {}
        # Jobs by number, built on the first delete by number (goqueue): shards
        # that never see one pay nothing per job for it.
        self.by_number: Optional[Dict[int, Job]] = None
        self.queues: Dict[str, JobQueue] = {}
        self.timers = Timers()
        self.waiters: Dict[Token, Waiter] = {}
        self.result_waiters: Dict[str, List[Waiter]] = {}
        #: what the step under way has caused (a fresh one per execute or advance)
        self._fx = Effects()
        #: whether steps also report each event's job as it is after it (for a
        #: job history); off, events cost nothing more
        self.history = False
        self._lessee: Token = None  # the token of the request the lease under way goes to
        self.evicted = 0
        self.last_number = 0
        #: ``[next, end)`` of the block this shard numbers jobs from (None:
        #: numbers of its own residue class, as in a cluster); the shell
        #: gives a fresh block before a request that needs one
        self.block: Optional[List[int]] = None
        #: who sees each event as it is carried out (a shard's metrics; None: nobody)
        self.observer: Optional[EventObserver] = None
        #: in a cluster: the slots this shard serves and gives away (None: one host)
        self.slots: Optional[SlotOwnership] = None

    # ------------------------------------------------------------------ entry
    def execute(self, op: str, args: Sequence[Any], now: int, token: Token = None) -> Effects:
        """Run request ``op``; its effects, whose ``reply`` is None if it now
        waits under ``token``."""
        fx = self._step()
        handler = REQUESTS.get(op)
        if handler is None:
            fx.reply = [CLIENT_ERROR, "Unknown command"]
            return fx
        self.now = now
        try:
            fx.reply = handler(self, now, token, *args)
        except EngineError as err:
            fx.reply = err.reply()
        return fx

    def next_deadline(self) -> Optional[int]:
        deadline = self.timers.next_deadline()
        if self.queue_idle and self.idle:
            unused = self.idle[next(iter(self.idle))] + self.queue_idle
            if deadline is None or unused < deadline:
                deadline = unused
        if self.kept:
            gone = self.kept[next(iter(self.kept))] + self.keep_untimed_results
            if deadline is None or gone < deadline:
                deadline = gone
        return deadline

    def advance(self, now: int) -> Effects:
        """Fire every timer due at ``now``, and drop queues unused for too
        long; the answers this gives parked requests are in ``later``."""
        fx = self._step()
        self.now = now
        if self.queue_idle:
            self._drop_unused(now - self.queue_idle)
        kept = self.kept
        while kept:
            id = next(iter(kept))
            if kept[id] + self.keep_untimed_results > now:
                break
            del kept[id]
            if id in self.jobs:
                self.apply(("delete", id))
        for entry in self.timers.due(now):
            if entry.kind == T_WAIT:
                entry.due = None
                self._wait_expired(entry)
                continue
            kind, due = entry.kind, entry.due
            if entry.kind == T_TTL:
                job = entry
            else:
                assert entry.job_id is not None   # an engine's timer names its job
                job = self.jobs[entry.job_id]
            assert due is not None   # it fell due
            if kind == T_TTR and job.foreground and not self._caller_waits(job.id):
                # The `run` caller's wait-timeout passed while a worker held the
                # job; the lease is over too, so the caller gets TIMEOUT.
                for waiter in list(self.result_waiters.get(job.id, ())):
                    if waiter.role == "run-leased":
                        self._reply(waiter, [TIMEOUT, ""])
                self.apply(("delete", job.id))
            else:
                self.apply((kind, job.id, due))
        return fx

    # --------------------------------------------------------------- requests
    def _add(self, now: int, token: Token, id: str, name: str, payload: bytes, priority: int = 0,
             ttr: int = 0, ttl: int = 0, max_attempts: int = 0, max_fails: int = 0,
             sched: Optional[int] = None, unique: bool = False, number: int = 0) -> Reply:
        """Enqueue a job; answers ``[id, number]``, or ``None`` when ``unique`` drops it.

        ``sched`` (µs) makes it a scheduled job; ``ttl`` 0 never expires;
        ``unique`` drops a payload the queue already holds (queued's default).
        """
        if ttl and (sched if sched is not None else now) + ttl * MS <= now:
            raise client_error("Invalid Time")
        self._check_new(id)
        self._admit(name)
        if unique and self._queue(name).holds(digest(payload)):
            return [OK, None]
        number = number or self._new_number()
        self.apply(("add", id, number, name, payload, priority, ttr, ttl,
                    max_attempts, max_fails, now, sched, False))
        return [OK, [id, number]]

    def _run(self, now: int, token: Token, id: str, name: str, payload: bytes, priority: int,
             ttr: int, timeout: int, number: int = 0) -> Optional[Reply]:
        self._check_new(id)
        self._admit(name)
        waiter = Waiter(token, "run")
        waiter.job_id = id
        self._park(waiter, now, timeout)
        self.result_waiters.setdefault(id, []).append(waiter)
        # A run job lives as long as its caller waits for it: no TTL.
        self.apply(("add", id, number or self._new_number(), name, payload, priority, ttr, 0,
                    0, 0, now, None, True))
        return None

    def _lease(self, now: int, token: Token, names: Sequence[str], timeout: Optional[int],
               owner: Any = None) -> Optional[Reply]:
        """Lease the first ready job of ``names``, or wait ``timeout`` ms for
        one (None: without limit). With an ``owner``, the lease ends when
        :meth:`disown` says the owner is gone."""
        for name in names:
            self._admit(name)
        queues = [self._queue(name) for name in names]
        if owner is not None:
            owner = (token[0], owner)
        best = self._best(queues, now)
        if best is not None:
            self._lessee = token
            self.apply(("lease", best.id, now))
            self._own(best, owner)
            return [OK, lease_view(best, self.shard)]
        if timeout == 0:
            return [TIMEOUT, ""]
        waiter = Waiter(token, "lease")
        waiter.owner = owner
        waiter.queues = queues
        for queue in queues:
            queue.waiters[waiter] = None
        self._park(waiter, now, timeout)
        return None

    def _unlease(self, now: int, token: Token, id: str, attempts: int) -> Reply:
        """Undo a lease that was never delivered (the router lost its client)."""
        job = self.jobs.get(id)
        if job is not None and job.state == J.LEASED and job.attempts == attempts:
            self.apply(("unlease", id, now))
        return [OK, None]

    def _finish(self, now: int, token: Token, id: str, result: bytes, success: bool) -> Reply:
        """A result (workq ``complete``/``fail``). A job with no TTL (added
        over another protocol, none of which reads results) that it finishes
        is kept for ``keep_untimed_results`` (its result readable by
        ``result``), then goes, rather than stay for ever."""
        job = self._job(id)
        if job.finished:
            raise client_error("Duplicate result")
        self.apply(("complete" if success else "fail", id, result, now))
        after = self.jobs.get(id)   # (still here unless a run caller took its result)
        if after is not None and after.finished and not after.ttl:
            self.kept[id] = now
        return [OK, None]

    def _complete(self, now: int, token: Token, id: str, result: bytes) -> Reply:
        return self._finish(now, token, id, result, True)

    def _fail(self, now: int, token: Token, id: str, result: bytes) -> Reply:
        return self._finish(now, token, id, result, False)

    def _retry(self, now: int, token: Token, id: str, name: Optional[str] = None) -> Reply:
        """Make a job ready again at its original place in add order (as the
        original takeanumber did), charging its retry budget.

        With the budget spent, the job fails (as a fail past its max-fails
        would) and is removed, and an error returned.
        """
        job = self._job(id, name)
        if job.fails >= job.max_fails:
            self._finish_and_remove(job, "fail", now)
            raise client_error("No retries remaining.")
        self.apply(("retry", id, now))
        return [OK, None]

    def _delete(self, now: int, token: Token, id: str, name: Optional[str] = None) -> Reply:
        """Remove a job. A delete naming the job's queue is takeanumber's DONE
        (``done``, a consumer's verb where ``delete`` is an administrator's):
        of a leased job, it is how that protocol's worker finishes it."""
        job = self._job(id, name)
        if name is not None and job.state == J.LEASED:
            self._finish_and_remove(job, "complete", now)
        else:
            self.apply(("delete", id))
        return [OK, None]

    def _finish_and_remove(self, job: Job, kind: str, now: int) -> None:
        """``job`` ends (``complete`` or ``fail``, with no result; one that
        has ended already keeps its outcome), then goes: how takeanumber and
        goqueue, whose workers remove the jobs they are done with, finish
        one. Its outcome is thus told by the very events that tell it for
        every protocol (the metrics and the history read it there), and logs
        replay with the handlers they always had."""
        if not job.finished:
            self.apply((kind, job.id, b"", now))
        if job.id in self.jobs:   # unless a ``run`` caller took its result, which removes it
            self.apply(("delete", job.id))

    def _numbered(self) -> Dict[int, Job]:
        """Jobs by number, built on first use (only goqueue asks by number)."""
        if self.by_number is None:
            self.by_number = {job.number: job for job in self.jobs.values()}
        return self.by_number

    def has_number(self, number: int) -> bool:
        """Whether a job numbered ``number`` is here."""
        return number in self._numbered()

    def _delete_number(self, now: int, token: Token, number: int) -> Reply:
        """goqueue's DELETE: of a reserved job, how its worker finishes it."""
        job = self._numbered().get(number)
        if job is None:
            raise not_found()
        if job.state == J.LEASED:
            self._finish_and_remove(job, "complete", now)
        else:
            self.apply(("delete", job.id))
        return [OK, job.id]

    def _result(self, now: int, token: Token, id: str, timeout: int) -> Optional[Reply]:
        job = self._job(id)
        if job.finished:
            return [OK, result_view(job)]
        if timeout == 0:
            return [TIMEOUT, ""]
        waiter = Waiter(token, "result")
        waiter.job_id = id
        self.result_waiters.setdefault(id, []).append(waiter)
        self._park(waiter, now, timeout)
        return None

    def _withdraw_new(self, now: int, token: Token, id: str) -> Reply:
        """A job just made whose id another shard's job turned out to hold
        (its home refused the claim): it goes, and a ``run`` caller waiting
        for it hears ``Duplicate job``."""
        if id in self.jobs:
            for waiter in list(self.result_waiters.get(id, ())):
                self._reply(waiter, [CLIENT_ERROR, "Duplicate job"])
            self.apply(("delete", id))
        return [OK, None]

    def _cancel(self, now: int, token: Token, waiting: Token) -> Reply:
        """Withdraw the parked request ``waiting`` (its client is gone); it is
        answered ``TIMEOUT`` at once."""
        waiter = self.waiters.get(waiting)
        if waiter is not None:
            # Answered, so that the shell can forget the request.
            self._reply(waiter, [TIMEOUT, ""])
            if waiter.role == "run":
                assert waiter.job_id is not None   # a run waiter waits for its job
                job = self.jobs.get(waiter.job_id)
                if job is not None and not job.finished:
                    self.apply(("delete", job.id))
        return [OK, None]

    def _take(self, now: int, token: Token, name: str, must_exist: bool = False) -> Reply:
        """Remove and return the first ready job: a dequeue with no acknowledgement."""
        queue = self.queues.get(name)
        if queue is None and must_exist:
            raise not_found()
        best = self._best((queue,), now) if queue is not None else None
        if best is None:
            return [TIMEOUT, ""]
        view = lease_view(best, self.shard)
        self.apply(("take", best.id))
        return [OK, view]

    def _restore(self, now: int, token: Token, view: Sequence[Any]) -> Reply:
        """Put back a job whose ``take`` could not be delivered (its client left),
        at the very place it had; TTL and attempt limits do not come back."""
        id, name, payload, number, priority, ttr, _attempts, order = as_lease(view)[:8]
        if id not in self.jobs:
            self.apply(("restore", id, number, name, payload, priority, ttr, list(order), now))
        return [OK, None]

    def _size(self, now: int, token: Token, name: str, must_exist: bool = False) -> Reply:
        """Ready jobs in the queue (leased and sleeping ones are not waiting in line)."""
        queue = self.queues.get(name)
        if queue is None and must_exist:
            raise not_found()
        return [OK, len(queue.ready) if queue is not None else 0]

    def _has(self, now: int, token: Token, name: str, content_digest: bytes) -> Reply:
        queue = self.queues.get(name)
        return [OK, queue is not None and queue.holds(content_digest)]

    def _create_queue(self, now: int, token: Token, name: str) -> Reply:
        self._admit(name)
        if name not in self.queues:
            self.apply(("queue", name))
        return [OK, None]

    def _disown(self, now: int, token: Token, owner: Owner) -> Reply:
        """``owner`` is gone: every job still leased to it is ready again
        (charged as an attempt, like an expired lease)."""
        for id in list(self.owned.get(owner, ())):
            self.apply(("release", id, now))
        return [OK, None]

    def queue_of(self, key: Union[str, int]) -> Optional[str]:
        """The queue of the job named by id (a str) or number (an int); None: no such job here."""
        job = self.jobs.get(key) if isinstance(key, str) else self._numbered().get(key)
        return None if job is None else job.name

    def _queue_of(self, now: int, token: Token, key: Union[str, int]) -> Reply:
        """What a router checks an identity's permission on before it sends a
        request naming a job: the job's queue (a job never changes queue)."""
        name = self.queue_of(key)
        if name is None:
            raise not_found()
        return [OK, name]

    def _exists(self, now: int, token: Token, id: str) -> Reply:
        self._job(id)
        return [OK, None]

    def _inspect_job(self, now: int, token: Token, id: str) -> Reply:
        return [OK, inspect_view(self._job(id))]

    def _inspect_jobs(self, now: int, token: Token, name: str, offset: int, limit: int) -> Reply:
        queue = self.queues.get(name)
        if queue is None:
            raise not_found()
        return [OK, [inspect_view(j) for j in queue.ready.islice(offset, offset + limit)]]

    def _inspect_scheduled(self, now: int, token: Token, name: str, offset: int, limit: int) -> Reply:
        queue = self.queues.get(name)
        if queue is None:
            raise not_found()
        return [OK, [inspect_view(j) for j in queue.scheduled.islice(offset, offset + limit)]]

    def _inspect_queue(self, now: int, token: Token, name: str) -> Reply:
        queue = self.queues.get(name)
        if queue is None:
            raise not_found()
        return [OK, [name, len(queue.ready), len(queue.scheduled)]]

    def _inspect_queues(self, now: int, token: Token, offset: int, limit: int) -> Reply:
        """The first ``offset + limit`` queues by name: the router merges the
        shards' lists and cuts the page."""
        names = sorted(self.queues)[:offset + limit]
        return [OK, [[n, len(self.queues[n].ready), len(self.queues[n].scheduled)] for n in names]]

    def _inspect_server(self, now: int, token: Token) -> Reply:
        return [OK, {"evicted-jobs": self.evicted, "jobs": len(self.jobs),
                     "queues": len(self.queues), "waiters": len(self.waiters),
                     "last-number": self.last_number}]


    # ---------------------------------------------------------------- helpers
    def _check_new(self, id: str) -> None:
        if id in self.jobs:
            raise client_error("Duplicate job")

    def _job(self, id: str, name: Optional[str] = None) -> Job:
        job = self.jobs.get(id)
        if job is None or (name is not None and job.name != name):
            raise not_found()
        return job

    def _queue(self, name: str) -> JobQueue:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = JobQueue(name)
            self.idle[name] = self.now  # unused until a job or a waiter comes
        return queue

    def _new_number(self) -> int:
        """The next job number: from this shard's block of the server's one
        counter (:mod:`queueserver.jobnumbers`), or without blocks the next of
        its residue class (shard ``i`` of ``n`` makes ``i + 1``, ``i + 1 +
        n``, ...). Either way unique across shards, starting at 1."""
        block = self.block
        if block is None:
            number = self.last_number + 1
            return number + (self.shard + 1 - number) % self.shards
        number = block[0]
        if number >= block[1]:
            raise server_error("No job numbers left; try again")
        block[0] = number + 1
        return number

    def needs_numbers(self) -> bool:
        """Whether a request that makes a job needs a fresh block first."""
        block = self.block
        return block is not None and block[0] >= block[1]

    def give_numbers(self, start: int, end: int) -> None:
        """Number jobs from ``start`` up to ``end`` (exclusive) from now on."""
        self.block = [start, end]

    def _admit(self, name: str) -> None:
        """Make room for queue ``name`` if it does not exist yet: at the cap,
        the longest-unused queue goes; with none unused, the request fails."""
        if self.max_queues is None or name in self.queues or len(self.queues) < self.max_queues:
            return
        if not self._drop_unused(None, 1):
            raise server_error("Too many queues")

    def _note_unused(self, queue: JobQueue) -> None:
        if queue.jobs == 0 and not queue.waiters:
            self.idle[queue.name] = self.now
            self.idle.move_to_end(queue.name)

    def _drop_unused(self, before: Optional[int], most: Optional[int] = None) -> int:
        """Remove queues unused since ``before`` (None: any), longest unused
        first, at most ``most``; returns how many went. An entry whose queue
        was used again meanwhile is just dropped from the list."""
        idle, queues = self.idle, self.queues
        dropped = 0
        while idle and (most is None or dropped < most):
            name = next(iter(idle))
            if before is not None and idle[name] > before:
                break
            del idle[name]
            queue = queues.get(name)
            if queue is not None and queue.jobs == 0 and not queue.waiters:
                del queues[name]
                dropped += 1
        return dropped

    def _own(self, job: Job, owner: Owner) -> None:
        if owner is not None:
            self.owned.setdefault(owner, set()).add(job.id)
            self._owner_of[job.id] = owner

    def _unown(self, job: Job) -> None:
        """The lease of ``job`` ended: it no longer belongs to its owner."""
        if self._owner_of:
            owner = self._owner_of.pop(job.id, None)
            if owner is not None:
                ids = self.owned[owner]
                ids.discard(job.id)
                if not ids:
                    del self.owned[owner]
    def _park(self, waiter: Waiter, now: int, timeout: Optional[int]) -> None:
        self.waiters[waiter.token] = waiter
        if timeout is not None:
            waiter.due = now + timeout * MS
            self.timers.add(waiter)

    def _unpark(self, waiter: Waiter) -> None:
        self.waiters.pop(waiter.token, None)
        if waiter.due is not None:
            self.timers.cancel(waiter)
            waiter.due = None
        for queue in waiter.queues:
            queue.waiters.pop(waiter, None)
            self._note_unused(queue)
        if waiter.job_id is not None:
            waiting = self.result_waiters.get(waiter.job_id)
            if waiting is not None:
                waiting.remove(waiter)
                if not waiting:
                    del self.result_waiters[waiter.job_id]

    def _reply(self, waiter: Waiter, reply: Reply) -> None:
        self._unpark(waiter)
        self._fx.later.append((waiter.token, reply))

    def _caller_waits(self, id: str) -> bool:
        return any(w.role == "run" for w in self.result_waiters.get(id, ()))

    def _wait_expired(self, waiter: Waiter) -> None:
        if waiter.role == "run":
            assert waiter.job_id is not None   # a run waiter waits for its job
            job = self.jobs.get(waiter.job_id)
            if job is not None and job.state == J.LEASED:
                # A worker has it: the caller now waits out this lease's TTR.
                waiter.role = "run-leased"
                return
            self._reply(waiter, [TIMEOUT, ""])
            if job is not None:
                self.apply(("delete", job.id))
            return
        self._reply(waiter, [TIMEOUT, ""])

    def _best(self, queues: Sequence[JobQueue], now: int) -> Optional[Job]:
        """The first job among ``queues``; jobs out of attempts fail on the way."""
        while True:
            best = None
            for queue in queues:
                if queue.ready:
                    candidate = queue.ready[0]
                    if best is None or candidate.key < best.key:  # key: order as one int
                        best = candidate
            if best is None or best.attempts_left:
                return best
            self.apply(("exhaust", best.id))

    def _offer(self, queue: JobQueue, now: int) -> None:
        """Hand newly ready jobs of ``queue`` to its parked lessees."""
        while queue.waiters:
            job = self._best((queue,), now)
            if job is None:
                return
            waiter = next(iter(queue.waiters))
            self._lessee = waiter.token
            self.apply(("lease", job.id, now))
            self._own(job, waiter.owner)
            self._reply(waiter, [OK, lease_view(job, self.shard)])

    def _deliver_result(self, job: Job) -> None:
        waiting = self.result_waiters.get(job.id)
        if not waiting:
            return
        reply = [OK, result_view(job)]
        foreground = False
        for waiter in list(waiting):
            foreground = foreground or waiter.role in ("run", "run-leased")
            self._reply(waiter, reply)
        if foreground:
            self.apply(("delete", job.id))

    # ----------------------------------------------------------------- events
    def _step(self) -> Effects:
        """The effects of a new step, with its job history when one is kept."""
        fx = self._fx = Effects()
        if self.history:
            fx.history = []
        return fx

    def apply(self, event: Event) -> None:
        """Record one state change in the step's effects, then carry it out.

        Recording first keeps causal order: events an event causes (an add
        handing its job to a parked lessee) come after it.
        """
        fx = self._fx
        fx.events.append(event)
        handler = EVENTS[event[0]]
        observer = self.observer
        if fx.history is None:
            if observer is None:
                handler(self, *event[1:])
            else:
                observer.observe(self, event, handler)
            return
        # The entry's place is taken first, so that events this one sets off
        # (an add handed to a parked lessee) come after it; its values are
        # read after them (a job that left is read before it goes).
        history = fx.history
        at = len(history)
        key = event[1] if len(event) > 1 and type(event[1]) is str else None   # a job's id
        job = self.jobs.get(key) if key is not None else None
        if observer is None:
            handler(self, *event[1:])
        else:
            observer.observe(self, event, handler)
        if job is None and key is not None:
            job = self.jobs.get(key)
        if job is None:
            return
        history.insert(at, (event[0], job.id, job.name, job.number, job.attempts, job.priority,
                            len(job.payload), job.state, self._lessee))

    def replay(self, events: Iterable[Event]) -> None:
        """Rebuild state from recorded events: no waiters exist, so nothing
        is offered, nothing is recorded again, and no observer sees them."""
        handlers = EVENTS
        for event in events:
            handlers[event[0]](self, *event[1:])
        self._fx = Effects()

    def recovered(self, now: int) -> Effects:
        """After a restart's :meth:`replay`: nobody holds a lease and no
        ``run`` caller waits any more, so leased jobs are ready again (their
        attempt stays counted: delivery is at least once) and ``run`` jobs go."""
        fx = self._step()
        self.now = now
        for job in list(self.jobs.values()):
            if job.foreground:
                self.apply(("delete", job.id))
            elif job.state == J.LEASED:
                self.apply(("release", job.id, now))
            elif job.finished and not job.ttl:
                self.kept[job.id] = now   # kept anew from the restart
        return fx

    def snapshot(self) -> Iterator[Event]:
        """Events that rebuild this state exactly (a compacted log's base):
        the counters, every queue, and one ``job`` event per job."""
        yield ("counters", self.last_number, self.evicted)
        if self.slots is not None:
            yield from self.slots.snapshot()
        for name in self.queues:
            yield ("queue", name)
        for job in self.jobs.values():
            yield self.job_event(job)

    @staticmethod
    def job_event(job: Job) -> JobEvent:
        """The ``job`` event that makes ``job`` again as it is, its lease's
        deadline included (a snapshot's entry, and a job moving to another shard)."""
        timer = job.timer
        sleeping = timer is not None and timer.kind == T_WAKE
        lease_due = timer.due if timer is not None and timer.kind == T_TTR else None
        return ("job", job.id, job.number, job.name, job.payload, job.priority, job.ttr,
                job.ttl, job.max_attempts, job.max_fails, job.created, job.sched,
                job.foreground, job.scheduled, job.state, job.attempts, job.fails,
                job.result if job.finished else None, sleeping, lease_due)

    # The handlers of the events, by kind: their arguments are the event's
    # items after the kind, as :mod:`.effects` gives them.
    def _ev_add(self, id: str, number: int, name: str, payload: bytes, priority: int, ttr: int,
                ttl: int, max_attempts: int, max_fails: int, now: int, sched: Optional[int],
                foreground: bool) -> None:
        queue = self._queue(name)
        # Jobs share their queue's name, and jobs added alike one flags int
        # (TTR, TTL, limits): less memory per job.
        job = Job(id, number, queue.name, payload, priority=priority, ttr=ttr, ttl=ttl,
                  max_attempts=max_attempts, max_fails=max_fails, created=now, sched=sched,
                  foreground=foreground, scheduled=sched is not None)
        self._register(job, queue)
        if sched is not None and sched > now:
            queue.sleep(job)
            job.timer = self.timers.add(Timer(sched, T_WAKE, job.id))
        else:
            queue.push(job)
            self._offer(queue, now)

    def _ev_restore(self, id: str, number: int, name: str, payload: bytes, priority: int, ttr: int,
                    order: Sequence[int], now: int) -> None:
        queue = self._queue(name)
        minus_priority, sched, created, order_number = order
        job = Job(id, number, queue.name, payload, priority=priority, ttr=ttr,
                  max_attempts=J.UNLIMITED_ATTEMPTS, created=created, sched=sched)
        job.order = (minus_priority, sched, created, order_number)
        self._register(job, queue)
        queue.push(job)
        self._offer(queue, now)

    def _ev_job(self, id: str, number: int, name: str, payload: bytes, priority: int, ttr: int,
                ttl: int, max_attempts: int, max_fails: int, created: int, sched: int,
                foreground: bool, scheduled: bool, state: int, attempts: int, fails: int,
                result: Optional[bytes], sleeping: bool, lease_due: Optional[int] = None) -> None:
        """One job as :meth:`snapshot` saw it (logs written before leases'
        deadlines were kept lack ``lease_due``)."""
        queue = self._queue(name)
        job = Job(id, number, queue.name, payload, priority=priority, ttr=ttr, ttl=ttl,
                  max_attempts=max_attempts, max_fails=max_fails, created=created, sched=sched,
                  foreground=foreground, scheduled=scheduled)
        job.attempts = attempts
        if fails:
            job.fails = fails
        self._register(job, queue)
        job.state = state
        if job.finished:
            job.result = result
        elif state == J.LEASED:
            if lease_due is not None:
                job.timer = self.timers.add(Timer(lease_due, T_TTR, job.id))
            elif ttr:   # the lease's deadline is not known: it runs a whole TTR from here
                job.timer = self.timers.add(Timer(self.now + ttr * MS, T_TTR, job.id))
        elif sleeping:
            queue.sleep(job)
            job.timer = self.timers.add(Timer(sched, T_WAKE, job.id))
        else:
            queue.push(job)

    def _ev_queue(self, name: str) -> None:
        self._queue(name)

    def _ev_counters(self, last_number: int, evicted: int) -> None:
        self.last_number = max(self.last_number, last_number)
        self.evicted = evicted

    def _register(self, job: Job, queue: JobQueue) -> None:
        """A new job joins the shard (not yet any line): counted, found by id
        (and number), reported as placed; its TTL starts."""
        queue.jobs += 1
        self.jobs[job.id] = job
        number = job.number
        if self.by_number is not None:
            self.by_number[number] = job
        self._fx.placed.append(job.id)
        if number > self.last_number:
            self.last_number = number
        if job.ttl:
            self._start_ttl(job)

    def _start_ttl(self, job: Job) -> None:
        self.timers.add(job)  # its due follows from its schedule and TTL

    def _ev_wake(self, id: str, now: int) -> None:
        job = self.jobs[id]
        queue = self.queues[job.name]
        queue.wake(job)
        self.timers.cancel(job.timer)
        job.timer = None
        self._offer(queue, now)

    def _ev_lease(self, id: str, now: int) -> None:
        job = self.jobs[id]
        self.queues[job.name].remove(job)
        job.state = J.LEASED
        job.attempts += 1
        ttr = job.ttr
        if ttr:
            job.timer = self.timers.add(Timer(now + ttr * MS, T_TTR, job.id))

    def _ev_unlease(self, id: str, now: int) -> None:
        job = self.jobs[id]
        self._unown(job)
        job.attempts -= 1
        job.state = J.NEW if job.attempts == 0 and job.fails == 0 else J.PENDING
        self.timers.cancel(job.timer)
        job.timer = None
        queue = self.queues[job.name]
        queue.push(job)
        self._offer(queue, now)

    def _ev_ttr(self, id: str, now: int) -> None:
        """A lease ran out: back in line, or failed when max-attempts is used up."""
        job = self.jobs[id]
        self.timers.cancel(job.timer)
        job.timer = None
        if job.max_attempts > 0 and job.attempts >= job.max_attempts:
            self._settle(job, J.FAILED, b"")
        else:
            self._requeue(job, now)

    def _ev_exhaust(self, id: str) -> None:
        """A job met at lease time with no attempts left fails without a result."""
        self._settle(self.jobs[id], J.FAILED, None)

    def _ev_complete(self, id: str, result: bytes, now: int) -> None:
        self._settle(self.jobs[id], J.COMPLETED, result)

    def _ev_fail(self, id: str, result: bytes, now: int) -> None:
        job = self.jobs[id]
        job.fails += 1
        if job.fails < job.max_fails and job.attempts_left:
            if job.state == J.LEASED:
                self.timers.cancel(job.timer)
                job.timer = None
                self._requeue(job, now)
            else:
                job.state = J.PENDING
        else:
            self._settle(job, J.FAILED, result)

    def _ev_retry(self, id: str, now: int) -> None:
        job = self.jobs[id]
        job.fails += 1
        queue = self.queues[job.name]
        self._detach(job, queue)  # its order is untouched: back at its place
        job.state = J.PENDING
        queue.push(job)
        self._offer(queue, now)

    def _ev_release(self, id: str, now: int) -> None:
        """A job's owner is gone: its lease ends and it is ready again."""
        job = self.jobs[id]
        self.timers.cancel(job.timer)
        job.timer = None
        self._requeue(job, now)

    def _ev_delete(self, id: str) -> None:
        self._remove(self.jobs[id], [NOT_FOUND, ""])

    def _remove(self, job: Job, to_waiters: Reply) -> None:
        """Take ``job`` off the shard; whoever waits for its result gets ``to_waiters``."""
        id = job.id
        del self.jobs[id]
        if self.kept:
            self.kept.pop(id, None)
        if self.by_number is not None:
            del self.by_number[job.number]
        queue = self.queues[job.name]
        self._detach(job, queue)
        queue.jobs -= 1
        self._note_unused(queue)
        if job.due is not None:
            self.timers.cancel(job)
            job.due = None
        self._fx.forgotten.append(id)
        waiting = self.result_waiters.get(id)
        for waiter in list(waiting or ()):
            self._reply(waiter, to_waiters)

    def _ev_evict(self, id: str, now: int) -> None:
        job = self.jobs[id]
        if not job.finished:
            self.evicted += 1
        self._ev_delete(id)

    # ---------------------------------------------------- slots (a cluster)
    def _ev_own(self, ranges: Sequence[Sequence[int]], epoch: int) -> None:
        if self.slots is None:
            self.slots = SlotOwnership()
        self.slots.own(ranges, epoch)

    # The events of a move come after the shard's first ``own``: slots are set.
    def _ev_moving(self, ranges: Sequence[Sequence[int]], target: int, epoch: int) -> None:
        assert self.slots is not None
        self.slots.begin(ranges, target, epoch)

    def _ev_export(self, id: str, epoch: int) -> None:
        """A job of a slot being given away is set aside, out of every line
        and timer: nothing here changes it any more."""
        job = self.jobs[id]
        self._ev_exported(epoch, self.job_event(job))
        self._remove(job, [TIMEOUT, ""])

    def _ev_exported(self, epoch: int, event: Sequence[Any]) -> None:
        """``event``: a ``job`` event (a :data:`JobEvent`; read back from a log,
        whatever that held)."""
        assert self.slots is not None
        move = self.slots.moves[epoch]
        move.jobs.append(tuple(event))
        move.ids.add(event[1])
        move.numbers.add(event[2])

    def _ev_gave(self, epoch: int) -> None:
        assert self.slots is not None
        self.slots.finish(epoch)

    def _ev_hints(self, hints: Sequence[Sequence[int]]) -> None:
        assert self.slots is not None
        self.slots.set_hints(hints)

    def _move_out(self, now: int, token: Token, ranges: Sequence[Sequence[int]], target: int, epoch: int,
                  start: int = 0, budget: int = MOVE_CHUNK_BYTES) -> Reply:
        """Stop serving the slots of ``ranges`` and set their jobs aside for
        ``target``. Answers ``{"jobs": [job events], "next": index or None}``:
        the jobs from index ``start``, about ``budget`` bytes of payloads and
        results at most (at least one), so that a slot of big jobs goes in
        many frames. Asked again (the mover lost the answer), the same jobs."""
        slots = self.slots
        if slots is None:
            raise client_error("Not a cluster shard")
        move = slots.moves.get(epoch)
        if move is None:
            wanted = set(from_ranges(ranges))
            strays = [slot for slot in wanted if not slots.serving(slot)]
            if strays:
                raise client_error(f"Slot {min(strays)} is not served here")
            self.apply(("moving", ranges, target, epoch))
            names = {name for name in self.queues if slot_of(name) in wanted}
            for waiter in list(self.waiters.values()):   # their queues will fill elsewhere
                if waiter.role == "lease" and any(q.name in names for q in waiter.queues):
                    self._reply(waiter, [TIMEOUT, ""])
            for id in [job.id for job in self.jobs.values() if job.name in names]:
                self.apply(("export", id, epoch))
            move = slots.moves[epoch]
        jobs, size, end = move.jobs, 0, start
        while end < len(jobs) and (end == start or size < budget):
            size += len(jobs[end][4]) + len(jobs[end][17] or b"") + 100
            end += 1
        return [OK, {"jobs": [list(job) for job in jobs[start:end]],
                     "next": end if end < len(jobs) else None}]

    def _move_in(self, now: int, token: Token, ranges: Sequence[Sequence[int]], epoch: int,
                 jobs: Sequence[Sequence[Any]], last: bool = True) -> Reply:
        """Take jobs (``job`` events) of the slots of ``ranges``, and with the
        ``last`` part the slots themselves: served from then on. A repeat of
        a move already taken changes nothing; a part sent again replaces
        the jobs it brought before (the giver's copy is the right one until
        the slots are taken)."""
        if self.slots is None:
            self.slots = SlotOwnership()
        slots = self.slots
        if all(slots.epochs[slot] >= epoch for slot in from_ranges(ranges)):
            return [OK, 0]
        for event in jobs:
            if event[1] in self.jobs:   # left by an earlier try cut short: the giver's is right
                self.apply(("delete", event[1]))
            self.apply(tuple(event))
        if not last:
            return [OK, len(jobs)]
        self.apply(("own", ranges, epoch))
        for name in {event[3] for event in jobs}:
            queue = self.queues.get(name)
            if queue is not None:
                self._offer(queue, now)
        return [OK, len(jobs)]

    def _claim(self, now: int, token: Token, ranges: Sequence[Sequence[int]]) -> Reply:
        """A shard joins a cluster: the slots it starts with (its log keeps them)."""
        if self.slots is None:
            self.apply(("own", ranges, 1))
        return [OK, None]

    def _move_done(self, now: int, token: Token, epoch: int) -> Reply:
        """The receiver holds the jobs: drop them here for good."""
        if self.slots is not None and epoch in self.slots.moves:
            self.apply(("gave", epoch))
        return [OK, None]


    def _requeue(self, job: Job, now: int) -> None:
        self._unown(job)
        job.state = J.PENDING
        queue = self.queues[job.name]
        queue.push(job)
        self._offer(queue, now)

    def _detach(self, job: Job, queue: JobQueue) -> None:
        """Take ``job`` out of whatever line or timer holds it."""
        if job.state == J.LEASED:
            self.timers.cancel(job.timer)
            self._unown(job)
        elif job.timer is not None:  # sleeping until its schedule
            self.timers.cancel(job.timer)
            queue.unsleep(job)
        elif not job.finished:
            queue.discard(job)
        job.timer = None

    def _settle(self, job: Job, state: int, result: Optional[bytes]) -> None:
        """Give ``job`` its final state and result; wake whoever waits for it."""
        self._detach(job, self.queues[job.name])
        job.state = state
        job.result = result
        self._deliver_result(job)


#: The requests :meth:`Engine.execute` serves, by name: ``handler(engine,
#: now, token, *args)`` -> its reply, or None when it waits (the traits of
#: each are declared in :data:`.ops.OPS`). Module-level
#: tables, not class attributes: what mypyc compiles keeps no dicts of
#: methods in a class body.
REQUESTS: Final[Dict[str, Callable[..., Optional[Reply]]]] = {
    "add": Engine._add, "run": Engine._run, "lease": Engine._lease, "unlease": Engine._unlease,
    "complete": Engine._complete, "fail": Engine._fail, "retry": Engine._retry, "delete": Engine._delete,
    "done": Engine._delete, "queue_of": Engine._queue_of,
    "delete_number": Engine._delete_number, "result": Engine._result, "cancel": Engine._cancel,
    "disown": Engine._disown, "withdraw_new": Engine._withdraw_new, "take": Engine._take,
    "restore": Engine._restore, "size": Engine._size, "has": Engine._has,
    "create_queue": Engine._create_queue, "exists": Engine._exists, "inspect_job": Engine._inspect_job,
    "inspect_jobs": Engine._inspect_jobs, "inspect_scheduled": Engine._inspect_scheduled,
    "inspect_queue": Engine._inspect_queue, "inspect_queues": Engine._inspect_queues,
    "inspect_server": Engine._inspect_server,
    "move_out": Engine._move_out, "move_in": Engine._move_in, "move_done": Engine._move_done,
    "claim": Engine._claim,
}

#: The state changes :meth:`Engine.apply` carries out, by event name:
#: ``handler(engine, *event[1:])`` (what each means for its job is declared
#: in :data:`.ops.EVENT_KINDS`; an :class:`.observer.EventObserver` may look on).
EVENTS: Final[Dict[str, Callable[..., None]]] = {
    "add": Engine._ev_add, "restore": Engine._ev_restore, T_WAKE: Engine._ev_wake,
    "lease": Engine._ev_lease, "unlease": Engine._ev_unlease, T_TTR: Engine._ev_ttr,
    "exhaust": Engine._ev_exhaust, "complete": Engine._ev_complete, "fail": Engine._ev_fail,
    "retry": Engine._ev_retry, "delete": Engine._ev_delete, T_TTL: Engine._ev_evict,
    "release": Engine._ev_release, "job": Engine._ev_job, "queue": Engine._ev_queue,
    "counters": Engine._ev_counters,
    "take": Engine._ev_delete,   # a dequeue with no acknowledgement: the job leaves
    "own": Engine._ev_own, "moving": Engine._ev_moving, "export": Engine._ev_export,
    "exported": Engine._ev_exported, "gave": Engine._ev_gave, "hints": Engine._ev_hints,
}
