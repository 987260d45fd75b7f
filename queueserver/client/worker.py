"""A worker loop: lease, call a function, complete or fail, repeat.

The function receives a :class:`~queueserver.client.Job` and returns the
result (``bytes``, ``str`` or ``None``); an exception fails the job with
the traceback as its result. The worker respects the job's TTR: when the
function outlives the lease, the worker reports nothing (the server has
already given the job back to its queue). SIGTERM and SIGINT stop the loop
after the current job; leases use a short wait so stopping is prompt.

When the server cannot be reached (or answers a lease with a server error,
as while a shard restarts), the worker retries with exponential backoff
(0.1 s doubling to at most 30 s, each wait drawn from its upper half so a
crowd of workers spreads out) and logs one line when the trouble starts (or
becomes another) and one when it is over; each attempt in between is logged
at DEBUG only.
"""
from __future__ import annotations

import importlib
import logging
import random
import signal
import threading
import time
import traceback
from types import FrameType
from typing import Callable, Iterable, NoReturn, Optional, Union

from .client import Client, ConnectionLost, Job, ServerError, TimedOut, WorkqError

log = logging.getLogger("queueserver.worker")

#: A job's function: it should return bytes, str or None; what it returns is
#: checked (anything else fails the job), so any function of a job will do.
Handler = Callable[[Job], object]


#: The first wait after a failed attempt, and the most any wait grows to (seconds).
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 30.0


def backoff_delay(failures: int, first: float = FIRST_BACKOFF, cap: float = MAX_BACKOFF,
                  rng: Callable[[float, float], float] = random.uniform) -> float:
    """How long to wait after the ``failures``-th failure in a row (1, 2, ...):
    ``first`` doubling per failure up to ``cap``, drawn from the upper half of
    that (jitter, so workers that lost the same server do not return in step)."""
    ceiling = min(cap, first * 2.0 ** min(failures - 1, 64))
    return rng(ceiling / 2, ceiling)


class LeaseExpired(Exception):
    """Raised inside the handler when the job's TTR runs out."""


def load_handler(spec: str) -> Handler:
    """``package.module:function`` to the function; ``ValueError`` (one line
    saying what to fix) when it cannot be had, so the command need not show a
    traceback for a typo."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected module:function (e.g. tasks:shout), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} for {spec}: {err} (run from its "
                         f"directory or add it to PYTHONPATH)") from None
    except Exception as err:
        raise ValueError(f"importing module {module_name!r} for {spec} failed: "
                         f"{type(err).__name__}: {err}") from None
    handler: object = getattr(module, attr, None)
    if handler is None:
        raise ValueError(f"module {module_name!r} has no function {attr!r} (check the name in {spec})")
    if not callable(handler):
        raise ValueError(f"{spec} is not a function (it is of type {type(handler).__name__})")
    return handler


def _as_bytes(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a handler must return bytes, str or None, not {type(value).__name__}")


class Worker:
    def __init__(self, client: Client, queues: Union[str, Iterable[str]], handler: Handler,
                 wait_timeout: int = 1000, max_jobs: Optional[int] = None,
                 first_backoff: float = FIRST_BACKOFF, max_backoff: float = MAX_BACKOFF) -> None:
        self.client = client
        self.queues = [queues] if isinstance(queues, str) else list(queues)
        self.handler = handler
        self.wait_timeout = wait_timeout
        self.max_jobs = max_jobs
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.processed = 0
        self._stop = threading.Event()
        #: failed attempts in a row (0: the server answers), when they began,
        #: and whether it ever answered (for the line that says it is back)
        self._failures = 0
        self._trouble_since = 0.0
        self._ever_answered = False
        self._state: Optional[str] = None   # the trouble last logged (None: none)

    def stop(self, *_args: object) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def run(self) -> int:
        """Work until stopped (or ``max_jobs`` done); returns jobs processed."""
        while not self._stop.is_set():
            if self.max_jobs is not None and self.processed >= self.max_jobs:
                break
            try:
                job = self.client.lease(self.queues, self.wait_timeout)
            except TimedOut:
                self._answered()
                continue
            except (ConnectionLost, OSError) as err:   # OSError: refused, unreachable, timed out
                self._back_off("unreachable", f"cannot reach server {self._server()}: {_reason(err)}")
                continue
            except ServerError as err:   # e.g. a shard restarting: it answers, but cannot serve
                self._back_off("refusing", f"server {self._server()} cannot serve the lease: {err}")
                continue
            self._answered()
            self.process(job)
        return self.processed

    def _server(self) -> str:
        return f"{getattr(self.client, 'host', '?')}:{getattr(self.client, 'port', '?')}"

    def _back_off(self, state: str, problem: str) -> None:
        """One failed attempt: logged at WARNING when the server has just
        entered ``state`` (unreachable, refusing), else at DEBUG; then wait
        (a stop ends the wait at once)."""
        self._failures += 1
        delay = backoff_delay(self._failures, self.first_backoff, self.max_backoff)
        if self._failures == 1:
            self._trouble_since = time.monotonic()
        if state != self._state:   # the trouble began, or became another
            log.warning("%s; retrying with backoff (at most %g s apart)", problem, self.max_backoff)
            self._state = state
        log.debug("attempt %d failed (%s); next in %.2f s", self._failures, problem, delay)
        self._stop.wait(delay)

    def _answered(self) -> None:
        """The server answered: if attempts had been failing, say once that it is back."""
        if self._failures:
            log.info("%s server %s after %.1f s (%d failed attempts)",
                     "reconnected to" if self._ever_answered else "connected to", self._server(),
                     time.monotonic() - self._trouble_since, self._failures)
            self._failures = 0
            self._state = None
        self._ever_answered = True

    def process(self, job: Job) -> None:
        """Run the handler on ``job`` and report it; logs one line per job
        (queue, id, outcome, milliseconds) so an operator can follow the work."""
        ttr_ms = self._ttr(job)
        started = time.monotonic()
        try:
            with _deadline(ttr_ms):
                result = _as_bytes(self.handler(job))
            ok = True
        except LeaseExpired:
            _log_job(job, started, logging.WARNING, f"outlived its TTR of {ttr_ms} ms; left to the server")
            return
        except Exception:
            result = traceback.format_exc().encode()
            ok = False
        self.processed += 1
        if ttr_ms and (time.monotonic() - started) * 1000 >= ttr_ms:
            _log_job(job, started, logging.WARNING, "finished after its TTR; not reported")
            return
        try:
            (self.client.complete if ok else self.client.fail)(job.id, result)
        except (WorkqError, ConnectionLost, OSError) as err:   # the next lease retries the connection
            _log_job(job, started, logging.WARNING, f"{'completed' if ok else 'failed'}, but reporting "
                                                    f"it failed: {err}")
            return
        _log_job(job, started, logging.INFO, "completed" if ok else "failed")

    def _ttr(self, job: Job) -> int:
        try:
            return int(self.client.inspect_job(job.id)["ttr"])
        except (WorkqError, ConnectionLost, OSError, KeyError, ValueError):
            return 0


def _reason(err: BaseException) -> str:
    """``connection refused``, not ``[Errno 111] Connection refused``."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror.lower()
    return str(err) or type(err).__name__


def _log_job(job: Job, started: float, level: int, outcome: str) -> None:
    log.log(level, "queue %s job %s %s in %.1f ms", job.name, job.id, outcome,
            (time.monotonic() - started) * 1000)


class _deadline:
    """Raise :class:`LeaseExpired` in the handler after ``ms`` (main thread only)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms
        self.armed = ms > 0 and threading.current_thread() is threading.main_thread()

    def __enter__(self) -> None:
        if self.armed:
            self._previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.ms / 1000.0)

    def __exit__(self, *exc: object) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)

    @staticmethod
    def _expire(signum: int, frame: Optional[FrameType]) -> NoReturn:
        raise LeaseExpired()
