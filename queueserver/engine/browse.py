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
    when they do not apply)."""
    due = lease_due(job)
    ttl_due = job.due
    return {"id": job.id, "number": job.number, "queue": job.name, "state": state_of(job),
            "priority": job.priority, "attempts": job.attempts, "age": now - job.created,
            "ttr_left": None if due is None else due - now,
            "ttl_left": None if ttl_due is None else ttl_due - now}


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


class Matcher:
    """The jobs of a scan that match, after skipping ``skip`` of them, up
    to ``limit``: fed a chunk at a time (:meth:`feed`), each job read as it
    is then (a job that changed since it was listed is looked up again)."""

    def __init__(self, want: Callable[[Job], bool], skip: int, limit: int, now: int) -> None:
        self.want = want
        self.skip = skip
        self.limit = limit
        self.now = now
        self.rows: List[Row] = []

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.limit

    def feed(self, jobs: Dict[str, Job], ids: Iterable[str]) -> bool:
        """Look at the jobs ``ids`` names (those still in ``jobs``); True once the page is full."""
        want, rows = self.want, self.rows
        for id in ids:
            job = jobs.get(id)
            if job is None or not want(job):
                continue
            if self.skip:
                self.skip -= 1
                continue
            rows.append(job_row(job, self.now))
            if len(rows) >= self.limit:
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
