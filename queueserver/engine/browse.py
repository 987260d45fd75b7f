"""Reading an engine's state for the web console, in bounded pieces, and
the console's two state changes that no client request makes.

Pure like the rest of the engine: no I/O and no clock (every function that
needs the time takes ``now`` in µs). The shard's console handlers
(:mod:`queueserver.shard.console`) call these in the shard's loop, a
bounded piece per loop turn, so that no console request walks a million
jobs at once:

* a queue's ready and scheduled jobs are its sorted lines: a page is an
  ``islice`` (``O(log n + page)``);
* leased and finished jobs are in no line of their queue: a page of them is
  found by :func:`match_jobs` over the shard's jobs, a chunk at a time
  (the caller yields between chunks);
* the age of a queue's oldest ready job (:func:`oldest_ready`) looks at the
  first job of each priority in its line (the line sorts by priority, then
  by when the job became ready), at most :data:`MAX_PRIORITY_GROUPS` of them.

Rows are plain dicts (msgpack-ready), times in µs; the console's data
source turns them into :mod:`queueserver.console.model` records.

The console's state changes are engine events applied in a step of their
own (:func:`console_step`), recorded like any request's, so a shard's log
replays them: :func:`release_events` (a leased job back in line, its
attempt charged, as when its holder leaves) and :func:`requeue_events` (a
failed job made anew: ready at its old place, no attempts, no fails).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import job as J
from .effects import Effects, Event
from .engine import T_TTR, T_WAKE, Engine
from .job import Job
from .jobqueue import JobQueue

#: The console's job states (the order of :data:`queueserver.console.model.STATES`).
READY, SCHEDULED, LEASED, FINISHED = "ready", "scheduled", "leased", "finished"
STATES = (READY, SCHEDULED, LEASED, FINISHED)
#: Deepest offset a page may start at: deeper pages are refused, whatever the queue holds.
MAX_OFFSET = 10_000
#: Most jobs one page lists.
MAX_LIMIT = 100
#: Jobs looked at per chunk of a scan (the caller yields to other work between chunks).
SCAN_CHUNK = 20_000
#: Priorities of one queue whose first ready job :func:`oldest_ready` looks at.
MAX_PRIORITY_GROUPS = 64
#: Bytes of a payload or result a job's detail carries.
PREVIEW_BYTES = 4096
#: Bytes of a failed job's result a row carries (its error, as listed).
ERROR_BYTES = 200
#: A finished job's outcome, by its engine state.
OUTCOMES = {J.COMPLETED: "completed", J.FAILED: "failed"}

#: A job as the console lists it (see :func:`job_row`).
Row = Dict[str, Any]


def state_of(job: Job) -> str:
    """The console's state of ``job``: ready, scheduled, leased or finished."""
    state = job.state
    if state == J.LEASED:
        return LEASED
    if state == J.COMPLETED or state == J.FAILED:
        return FINISHED
    timer = job.timer
    return SCHEDULED if timer is not None and timer.kind == T_WAKE else READY


def lease_due(job: Job) -> Optional[int]:
    """When a leased job's lease runs out (µs); None: not leased, or no TTR."""
    timer = job.timer
    if timer is not None and timer.kind == T_TTR:
        return timer.due
    return None


def job_row(job: Job, now: int) -> Row:
    """One job as a page lists it: ids, state, priority, attempts, and its
    times (``age``, ``ttr_left``, ``ttl_left``: µs; the latter two None
    when they do not apply); a finished job's ``outcome`` and, if it
    failed, its ``error`` (the first :data:`ERROR_BYTES` of its result;
    None for one that failed with none: its attempts ran out)."""
    due = lease_due(job)
    ttl_due = job.due
    state = job.state
    result = job.result if state == J.FAILED else None
    return {"id": job.id, "number": job.number, "queue": job.name, "state": state_of(job),
            "priority": job.priority, "attempts": job.attempts, "age": now - job.created,
            "ttr_left": None if due is None else due - now,
            "ttl_left": None if ttl_due is None else ttl_due - now,
            "outcome": OUTCOMES.get(state), "error": None if result is None else result[:ERROR_BYTES]}


def job_detail(job: Job, now: int) -> Dict[str, Any]:
    """Everything the engine keeps of ``job``: its row, then the first
    :data:`PREVIEW_BYTES` of its payload and result, its limits, counts,
    schedule and outcome."""
    detail = job_row(job, now)
    result = job.result if job.finished else None
    state = job.state
    detail.update({
        "payload": job.payload[:PREVIEW_BYTES], "payload_size": len(job.payload),
        "result": None if result is None else result[:PREVIEW_BYTES],
        "result_size": None if result is None else len(result),
        "max_attempts": job.max_attempts, "max_fails": job.max_fails, "fails": job.fails,
        "ttr": job.ttr, "ttl": job.ttl, "created": job.created,
        "sched": job.sched if job.scheduled else None, "foreground": job.foreground,
        "outcome": "completed" if state == J.COMPLETED else "failed" if state == J.FAILED else None,
        "lease_due": lease_due(job),
    })
    return detail


def ready_since(job: Job, requeued: Optional[Dict[str, int]] = None) -> int:
    """When ``job`` became ready (µs): the later of its creation and its
    schedule, or when it went back in line if ``requeued`` (job id -> µs,
    as the shard's statistics keep it) says."""
    if requeued:
        since = requeued.get(job.id)
        if since is not None:
            return since
    created, sched = job.created, job.sched
    return sched if sched > created else created


def oldest_ready(queue: JobQueue, requeued: Optional[Dict[str, int]] = None,
                 groups: int = MAX_PRIORITY_GROUPS) -> Optional[int]:
    """When the longest-waiting ready job of ``queue`` became ready (µs);
    None when nothing is ready.

    The ready line sorts by priority first, then schedule and creation: the
    first job of each priority is the oldest of that priority. Those are
    found by bisecting, one per priority, for the first ``groups``
    priorities (the rest are not looked at: a queue of more distinct
    priorities than that may show a younger oldest job).
    """
    line = queue.ready
    size = len(line)
    if not size:
        return None
    first = line[0]
    if line[size - 1].priority == first.priority:   # one priority: the first is the oldest
        return ready_since(first, requeued)
    oldest: Optional[int] = None
    index = 0
    bisect_left: Callable[[Job], int] = getattr(line, "bisect_left")
    for _ in range(groups):
        job = line[index]
        since = ready_since(job, requeued)
        if oldest is None or since < oldest:
            oldest = since
        # The first job of the next lower priority: below any job of this one.
        probe = Job("", 0, "", b"", priority=job.priority - 1, created=-(1 << 56),
                    sched=-(1 << 61))
        index = bisect_left(probe)
        if index >= size:
            break
    return oldest


def page_bounds(page: int, per_page: int) -> Tuple[int, int]:
    """``(offset, limit)`` of page ``page`` (1-based) of ``per_page`` jobs
    (cut to :data:`MAX_LIMIT`); ValueError past :data:`MAX_OFFSET` or for
    a page or size below 1."""
    if page < 1:
        raise ValueError(f"page {page}: pages start at 1")
    if per_page < 1:
        raise ValueError(f"per_page {per_page}: at least 1")
    limit = min(per_page, MAX_LIMIT)
    offset = (page - 1) * limit
    if offset >= MAX_OFFSET:
        raise ValueError(f"page {page} starts past job {MAX_OFFSET}, the deepest a page may start")
    return offset, limit


def line_page(queue: JobQueue, state: str, offset: int, limit: int, now: int) -> Tuple[List[Row], int]:
    """A page of ``queue``'s ready or scheduled jobs, in serving order (ready:
    priority, schedule, creation; scheduled: their time), and how many it holds."""
    line = queue.ready if state == READY else queue.scheduled
    return [job_row(job, now) for job in line.islice(offset, offset + limit)], len(line)


def wanted(name: str, state: str) -> Callable[[Job], bool]:
    """Whether a job is ``name``'s in the leased or finished ``state``."""
    if state == LEASED:
        return lambda job: job.name == name and job.state == J.LEASED
    return lambda job: job.name == name and job.finished


#: What a list may be narrowed by (every key optional; None: not asked):
#: ``outcome`` ("completed" or "failed": finished jobs), ``min_age`` and
#: ``max_age`` (µs since the job was made), ``priority`` (exactly), ``text``
#: (bytes in its payload or, for a failed job, its error).
Filters = Dict[str, Any]
FILTER_KEYS = ("outcome", "min_age", "max_age", "priority", "text")


def matching(name: Optional[str], state: str, filters: Filters, now: int) -> Callable[[Job], bool]:
    """Whether a job is of queue ``name`` (None: any queue), in the
    console's ``state`` and passes ``filters`` (as of ``now``, µs)."""
    tests: List[Callable[[Job], bool]] = []
    if name is not None:
        tests.append(lambda job: job.name == name)
    tests.append(lambda job: state_of(job) == state)
    outcome = filters.get("outcome")
    if outcome is not None:
        wanted_state = J.FAILED if outcome == "failed" else J.COMPLETED
        tests.append(lambda job: job.state == wanted_state)
    min_age, max_age = filters.get("min_age"), filters.get("max_age")
    if min_age is not None:
        born_before = now - int(min_age)
        tests.append(lambda job: job.created <= born_before)
    if max_age is not None:
        born_after = now - int(max_age)
        tests.append(lambda job: job.created >= born_after)
    priority = filters.get("priority")
    if priority is not None:
        tests.append(lambda job: job.priority == priority)
    text = filters.get("text")
    if text:
        needle = text if isinstance(text, bytes) else str(text).encode()

        def has_text(job: Job) -> bool:
            if needle in job.payload:
                return True
            return job.state == J.FAILED and needle in (job.result or b"")
        tests.append(has_text)
    return lambda job: all(test(job) for test in tests)


def filtered(filters: Optional[Filters]) -> bool:
    """Whether ``filters`` narrow a list at all."""
    if not filters:
        return False
    return any(filters.get(key) not in (None, b"", "") for key in FILTER_KEYS)


class Matcher:
    """The jobs of a scan that match, after skipping ``skip`` of them, up
    to ``limit``: fed a chunk at a time (:meth:`feed`), each job read as it
    is then (a job that changed since it was listed is looked up again)."""

    def __init__(self, want: Callable[[Job], bool], skip: int, limit: int, now: int,
                 count_all: bool = False) -> None:
        self.want = want
        self.skip = skip
        self.limit = limit
        self.now = now
        self.rows: List[Row] = []
        #: go on past a full page, counting every match (``matched``)
        self.count_all = count_all
        self.matched = 0

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.limit

    def feed(self, jobs: Dict[str, Job], ids: Iterable[str]) -> bool:
        """Look at the jobs ``ids`` names (those still in ``jobs``); True once
        the page is full (and, counting all, never)."""
        want, rows = self.want, self.rows
        for id in ids:
            job = jobs.get(id)
            if job is None or not want(job):
                continue
            self.matched += 1
            if self.skip:
                self.skip -= 1
                continue
            if len(rows) < self.limit:
                rows.append(job_row(job, self.now))
            if len(rows) >= self.limit and not self.count_all:
                return True
        return False


def match_jobs(jobs: Dict[str, Job], ids: Sequence[str], want: Callable[[Job], bool], skip: int,
               limit: int, now: int, chunk: int = SCAN_CHUNK,
               between: Optional[Callable[[], None]] = None) -> List[Row]:
    """Rows of the jobs of ``ids`` that ``want`` picks, after the first ``skip``,
    at most ``limit``: ``chunk`` ids at a time, with ``between()`` (a yield
    to other work) after each chunk but the last."""
    matcher = Matcher(want, skip, limit, now)
    for start in range(0, len(ids), chunk):
        if matcher.feed(jobs, ids[start:start + chunk]):
            break
        if between is not None and start + chunk < len(ids):
            between()
    return matcher.rows


def find_jobs(jobs: Dict[str, Job], ids: Sequence[str], want: Callable[[Job], bool], skip: int,
              limit: int, now: int, chunk: int = SCAN_CHUNK,
              between: Optional[Callable[[], None]] = None) -> Tuple[List[Row], int]:
    """As :func:`match_jobs`, but every id is looked at: the page's rows
    and how many jobs match in all (a filtered list's true total)."""
    matcher = Matcher(want, skip, limit, now, count_all=True)
    for start in range(0, len(ids), chunk):
        matcher.feed(jobs, ids[start:start + chunk])
        if between is not None and start + chunk < len(ids):
            between()
    return matcher.rows, matcher.matched


def line_ids(queue: JobQueue, state: str, chunk: int = SCAN_CHUNK,
             between: Optional[Callable[[], None]] = None) -> List[str]:
    """The ids of ``queue``'s ready or scheduled line, in serving order, a
    chunk at a time (a filtered look at a line reads it whole)."""
    line = queue.ready if state == READY else queue.scheduled
    ids: List[str] = []
    for start in range(0, len(line), chunk):
        ids += [job.id for job in line.islice(start, start + chunk)]
        if between is not None and start + chunk < len(line):
            between()
    return ids


def find_number(jobs: Dict[str, Job], ids: Sequence[str], number: int, chunk: int = SCAN_CHUNK,
                between: Optional[Callable[[], None]] = None) -> Optional[Job]:
    """The job numbered ``number`` among ``ids``, a chunk at a time (the
    engine's index by number is used when it exists; this is for when it
    does not, since building it costs a dict entry per job)."""
    for start in range(0, len(ids), chunk):
        for id in ids[start:start + chunk]:
            job = jobs.get(id)
            if job is not None and job.number == number:
                return job
        if between is not None and start + chunk < len(ids):
            between()
    return None


def count_states(jobs: Iterable[Job], counts: Dict[str, List[int]]) -> None:
    """Add each job to ``counts[its queue]`` = ``[leased, finished]`` (for
    a shard whose statistics do not count leased jobs)."""
    for job in jobs:
        state = job.state
        if state == J.LEASED:
            counts.setdefault(job.name, [0, 0])[0] += 1
        elif state == J.COMPLETED or state == J.FAILED:
            counts.setdefault(job.name, [0, 0])[1] += 1


def queue_depth(queue: JobQueue, leased: int, requeued: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """A queue's jobs by state (``leased``: its leased jobs, as counted
    elsewhere; finished ones are the rest) and when its oldest ready job
    became ready (µs, or None)."""
    ready, scheduled = len(queue.ready), len(queue.scheduled)
    return {"ready": ready, "scheduled": scheduled, "leased": leased,
            "finished": max(0, queue.jobs - ready - scheduled - leased),
            "oldest_ready": oldest_ready(queue, requeued)}


# ------------------------------------------------------------ state changes
def release_events(job: Job, now: int) -> List[Event]:
    """A leased job back in line, its attempt counted (as when its holder leaves)."""
    if job.state != J.LEASED:
        raise ValueError(f"job {job.id} is not leased")
    return [("release", job.id, now)]


def requeue_events(job: Job) -> List[Event]:
    """A failed job made anew in its queue: ready at its old place (its
    priority, schedule, creation and number), with no attempts, no fails
    and no result; its TTL runs from its schedule as before. The events
    are the job leaving and a ``job`` event (as a snapshot or a slot move
    brings a job), which a log replays."""
    if job.state != J.FAILED:
        raise ValueError(f"job {job.id} has not failed")
    fresh: Event = ("job", job.id, job.number, job.name, job.payload, job.priority, job.ttr, job.ttl,
                    job.max_attempts, job.max_fails, job.created, job.sched, job.foreground,
                    job.scheduled, J.PENDING, 0, 0, None, False, None)
    return [("delete", job.id), fresh]


def console_step(engine: Engine, events: Sequence[Event], now: int) -> Effects:
    """Apply ``events`` as one step of their own (what they cause is in the
    effects, as for a request), then offer the ready jobs of their queues
    to parked lessees."""
    fx = engine._step()
    engine.now = now
    names = set()
    for event in events:
        engine.apply(event)
        if len(event) > 1 and isinstance(event[1], str):
            job = engine.jobs.get(event[1])
            if job is not None:
                names.add(job.name)
    for name in names:
        queue = engine.queues.get(name)
        if queue is not None:
            engine._offer(queue, now)
    return fx
