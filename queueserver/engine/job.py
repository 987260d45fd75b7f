"""The job record every protocol shares, and its states.

A job is one object with fixed slots: all five protocols map onto these
fields, so a job added over one protocol can be taken over any other.
Times are integer microseconds since the Unix epoch; durations given by
clients (TTR, TTL) are kept in their original milliseconds.

A shard holds up to millions of queued jobs, so a job is kept small
(tests/test_engine_memory.py guards the figure): five slots, an 80-byte
object in plain Python (CPython 3.11, with its GC header) and a 64-byte one
compiled (mypyc's vtable pointer, no GC header), where eight took 96.

* ``key``, one int, is its place in a ready queue and holds its priority,
  schedule time, creation time and number (see :func:`pack_order`); the
  ``order`` tuple other code sees is made from it on demand.
* ``flags``, one int, holds everything else that is a small number: its
  state, attempts, TTR, TTL, max-attempts, max-fails, fails, and whether it
  is a ``run`` job or was scheduled. Equal flags are one shared int object
  (:func:`_intern`): the jobs waiting in a shard were mostly added alike and
  are all new with no attempt yet, so they pay nothing for them; a lease or
  a result swaps the job's flags for another shared one.
* ``due`` (when the TTL evicts it) is derived from the schedule time and
  the TTL, so it costs no int per job either (see timers.py).
* ``_payload`` is the payload, or, while the job has a timer (TTR or
  wake-up) or once it has a result, a :class:`_Held` of the payload and
  that timer or result (a finished job has no timer). Queued jobs, the
  millions, pay no slot for what only leased, sleeping and finished ones use.
"""
from __future__ import annotations

from typing import ClassVar, Dict, Final, Literal, Optional, Tuple, Union, final

from mypy_extensions import mypyc_attr

from .timers import Timer

NEW: Final = 0
COMPLETED: Final = 1
FAILED: Final = 2
PENDING: Final = 3
LEASED: Final = 4

#: Hard cap on attempts when a workq job says "unlimited" (max-attempts 0).
ATTEMPTS_CAP: Final = 255
#: max_attempts of jobs from protocols with no attempt limit at all.
UNLIMITED_ATTEMPTS: Final = -1

MS: Final = 1000  # microseconds per millisecond

# ``key`` layout, most significant first: -priority (any size, signed), then
# schedule + 2**62 (63 bits), creation + 2**57 (58 bits), number (58 bits).
# Comparing keys compares (-priority, sched, created, number) as the tuple
# did; a priority-0 job's key stays within 179 bits, a 48-byte int.
_N_BITS: Final = 58
_C_BITS: Final = 58
_S_BITS: Final = 63
_C_SHIFT: Final = _N_BITS
_S_SHIFT: Final = _N_BITS + _C_BITS
_P_SHIFT: Final = _S_SHIFT + _S_BITS
_S_BIAS: Final = 1 << (_S_BITS - 1)
_C_BIAS: Final = 1 << (_C_BITS - 1)
_N_MASK: Final = (1 << _N_BITS) - 1
_C_MASK: Final = (1 << _C_BITS) - 1
_S_MASK: Final = (1 << _S_BITS) - 1

# ``flags`` layout, least significant first: the state and the attempts
# (set on every lease and result, so at the bottom: changing them touches
# only a small int before the one big addition), ttr (ms, read on every
# lease), the attempt and fail limits, the fail count, two bits, and ttl
# (ms) as the top field, so any TTL fits.
_STATE_MASK: Final = 0b111
_ATTEMPTS_SHIFT: Final = 3
_ATTEMPTS_BITS: Final = 45                                   # 3.5e13 leases of one job
_ATTEMPTS_MAX: Final = (1 << _ATTEMPTS_BITS) - 1
_ATTEMPTS_MASK: Final = _ATTEMPTS_MAX << _ATTEMPTS_SHIFT     # in place
_TTR_SHIFT: Final = _ATTEMPTS_SHIFT + _ATTEMPTS_BITS
_TTR_BITS: Final = 64
_TTR_MASK: Final = (1 << _TTR_BITS) - 1
_FIELD_BITS: Final = 32
_FIELD_MASK: Final = (1 << _FIELD_BITS) - 1
_MAX_ATTEMPTS_SHIFT: Final = _TTR_SHIFT + _TTR_BITS          # max_attempts + 1
_MAX_FAILS_SHIFT: Final = _MAX_ATTEMPTS_SHIFT + _FIELD_BITS
_FAILS_SHIFT: Final = _MAX_FAILS_SHIFT + _FIELD_BITS         # fails <= max(max_fails, 1)
_FAILS_MASK: Final = (1 << (_FIELD_BITS + 1)) - 1
_FOREGROUND: Final = 1 << (_FAILS_SHIFT + _FIELD_BITS + 1)
_SCHEDULED: Final = _FOREGROUND << 1
_TTL_SHIFT: Final = _FAILS_SHIFT + _FIELD_BITS + 3
_BELOW_TTL: Final = (1 << _TTL_SHIFT) - 1
_NOT_FAILS: Final = ~(_FAILS_MASK << _FAILS_SHIFT)

_interned: Final[Dict[int, int]] = {}


def _intern(flags: int) -> int:
    """One int object per distinct value: most jobs share a handful."""
    interned = _interned.get(flags)
    if interned is None:
        if len(_interned) >= 4096:  # many distinct TTLs: start over rather than grow
            _interned.clear()
        interned = _interned[flags] = flags
    return interned


def pack_order(priority: int, sched: int, created: int, number: int) -> int:
    """One int that sorts as ``(-priority, sched, created, number)`` does.

    ``sched`` may be any time within ±146,000 years of the epoch, ``created``
    within ±4,500 years, ``number`` below 2**58; priority is unbounded.
    """
    s = sched + _S_BIAS
    c = created + _C_BIAS
    if not (0 <= s <= _S_MASK and 0 <= c <= _C_MASK and 0 <= number <= _N_MASK):
        raise ValueError(f"job order out of range: sched={sched} created={created} number={number}")
    # `|` makes an int of exactly the digits it needs (`+` may leave one spare).
    rest = (s << _S_SHIFT) | (c << _C_SHIFT) | number
    return rest if not priority else (-priority << _P_SHIFT) + rest


def unpack_order(key: int) -> Tuple[int, int, int, int]:
    """``(-priority, sched, created, number)`` of a key made by :func:`pack_order`."""
    return (key >> _P_SHIFT, ((key >> _S_SHIFT) & _S_MASK) - _S_BIAS,
            ((key >> _C_SHIFT) & _C_MASK) - _C_BIAS, key & _N_MASK)


def schedule_key(job: "Job") -> int:
    """Sorts sleeping jobs as ``(sched, number)`` does."""
    key = job.key
    return (((key >> _S_SHIFT) & _S_MASK) << _N_BITS) | (key & _N_MASK)


def _fields_out_of_range(**fields: int) -> ValueError:
    """The error for a flags field that does not fit its bits."""
    return ValueError("job field out of range: " + " ".join(f"{k}={v}" for k, v in fields.items()))


@final
@mypyc_attr(acyclic=True)
class _Held:
    """A job's payload with its timer or its result: what a job keeps in its
    payload's slot while it has either (see the module's docstring)."""

    __slots__ = ("payload", "aux")

    def __init__(self, payload: bytes, aux: Union[Timer, bytes]) -> None:
        self.payload = payload
        self.aux = aux


@mypyc_attr(acyclic=True)
class Job:
    """One job. ``key`` is its place in a ready queue (smallest first).

    Compiled, it is kept out of the cyclic GC (``acyclic``): no GC header
    (64 bytes with five slots, where the GC header and a sixth slot made 96),
    and no collector pass over millions of jobs. Nothing it holds can lead
    back to it (its timer names it by id).
    """

    #: as an entry of the shard's timers, a job stands for its TTL
    kind: ClassVar[Literal["ttl"]] = "ttl"

    __slots__ = ("id", "name", "_payload", "key", "flags")

    def __init__(
        self,
        id: str,
        number: int,
        name: str,
        payload: bytes,
        *,
        priority: int = 0,
        ttr: int = 0,
        ttl: int = 0,
        max_attempts: int = 0,
        max_fails: int = 0,
        created: int = 0,
        sched: Optional[int] = None,
        foreground: bool = False,
        scheduled: bool = False,
    ) -> None:
        if sched is None:
            sched = created
        self.id = id
        self.name = name
        self._payload: Union[bytes, _Held] = payload
        # Higher priority first, then earlier schedule, creation, arrival
        # (pack_order, inlined: this is the add path).
        s = sched + _S_BIAS
        c = created + _C_BIAS
        if not (0 <= s <= _S_MASK and 0 <= c <= _C_MASK and 0 <= number <= _N_MASK):
            pack_order(priority, sched, created, number)  # raises, saying what
        key = (s << _S_SHIFT) | (c << _C_SHIFT) | number
        self.key = (-priority << _P_SHIFT) + key if priority else key
        if not (0 <= ttr <= _TTR_MASK and ttl >= 0 and -1 <= max_attempts < _FIELD_MASK
                and 0 <= max_fails <= _FIELD_MASK):
            raise _fields_out_of_range(ttr=ttr, ttl=ttl, max_attempts=max_attempts, max_fails=max_fails)
        # State NEW (0), no attempts, no fails.
        flags = ((ttl << _TTL_SHIFT) | (ttr << _TTR_SHIFT) | (max_fails << _MAX_FAILS_SHIFT)
                 | ((max_attempts + 1) << _MAX_ATTEMPTS_SHIFT))
        if foreground:
            flags |= _FOREGROUND
        if scheduled:
            flags |= _SCHEDULED
        self.flags = _interned.get(flags) or _intern(flags)

    # ------------------------------------------------------------ ordering
    def __lt__(self, other: Job) -> bool:
        """Jobs sort by ``key``: how the ready lines and TTL lines (sorted
        lists of the jobs themselves, timers.py) order them with no stored
        key. Only ``<``: equality stays identity (jobs are found by it, and
        hashed by it)."""
        return self.key < other.key

    def __hash__(self) -> int:
        """By identity, said outright: a compiled class that defines a
        comparison inherits no hash (CPython's rule for C types)."""
        return id(self) >> 4

    @property
    def order(self) -> Tuple[int, int, int, int]:
        """``(-priority, sched, created, number)``: its place, as plain data."""
        return unpack_order(self.key)

    @order.setter
    def order(self, order: Tuple[int, int, int, int]) -> None:
        minus_priority, sched, created, number = order
        self.key = pack_order(-minus_priority, sched, created, number)

    @property
    def priority(self) -> int:
        return -(self.key >> _P_SHIFT)

    @property
    def sched(self) -> int:
        return ((self.key >> _S_SHIFT) & _S_MASK) - _S_BIAS

    @property
    def created(self) -> int:
        return ((self.key >> _C_SHIFT) & _C_MASK) - _C_BIAS

    @property
    def number(self) -> int:
        return self.key & _N_MASK

    # ------------------------------------------------------- state, attempts
    @property
    def state(self) -> int:
        """NEW, PENDING, LEASED, COMPLETED or FAILED."""
        return self.flags & _STATE_MASK

    @state.setter
    def state(self, state: int) -> None:
        if not NEW <= state <= LEASED:
            raise ValueError(f"no such state: {state}")
        flags = self.flags
        flags += state - (flags & _STATE_MASK)  # one operation on the big int
        self.flags = _interned.get(flags) or _intern(flags)

    @property
    def attempts(self) -> int:
        """Leases so far."""
        return (self.flags & _ATTEMPTS_MASK) >> _ATTEMPTS_SHIFT

    @attempts.setter
    def attempts(self, attempts: int) -> None:
        if not 0 <= attempts <= _ATTEMPTS_MAX:
            raise ValueError(f"attempts out of range: {attempts}")
        flags = self.flags
        flags += (attempts << _ATTEMPTS_SHIFT) - (flags & _ATTEMPTS_MASK)
        self.flags = _interned.get(flags) or _intern(flags)

    @property
    def attempts_left(self) -> bool:
        flags = self.flags
        max_attempts = ((flags >> _MAX_ATTEMPTS_SHIFT) & _FIELD_MASK) - 1
        if max_attempts < 0:
            return True
        return (flags & _ATTEMPTS_MASK) >> _ATTEMPTS_SHIFT < (max_attempts or ATTEMPTS_CAP)

    @property
    def success(self) -> bool:
        return self.flags & _STATE_MASK == COMPLETED

    @property
    def finished(self) -> bool:
        state = self.flags & _STATE_MASK
        return state == COMPLETED or state == FAILED

    # ------------------------------------------------------------ TTR, TTL
    @property
    def ttr(self) -> int:
        """ms; 0 means the lease never times out."""
        return (self.flags >> _TTR_SHIFT) & _TTR_MASK

    @property
    def ttl(self) -> int:
        """ms; 0 means the job never expires."""
        return self.flags >> _TTL_SHIFT

    @property
    def due(self) -> Optional[int]:
        """When the TTL evicts it (the job is its own TTL timer); None: never."""
        ttl = self.flags >> _TTL_SHIFT
        if not ttl:
            return None
        return ((self.key >> _S_SHIFT) & _S_MASK) - _S_BIAS + ttl * MS

    @due.setter
    def due(self, due: Optional[int]) -> None:
        """``None`` once its TTL no longer runs (it left the shard). Any other
        value is the one its schedule and TTL give already, and is not kept."""
        if due is None:
            self.flags = _intern(self.flags & _BELOW_TTL)

    @property
    def line(self) -> Tuple[int, int]:
        """``(ttl, -priority)``: among jobs alike in both, the order of their
        keys is the order of their deadlines (see timers.py)."""
        return self.flags >> _TTL_SHIFT, self.key >> _P_SHIFT

    # --------------------------------------------- payload, timer, result
    # One slot serves the three: a job has a timer only while leased or
    # sleeping, and a result only once finished (a finished job that is
    # retried keeps its old result until a timer replaces it; nobody reads it).
    @property
    def payload(self) -> bytes:
        held = self._payload
        return held if isinstance(held, bytes) else held.payload

    @property
    def timer(self) -> Optional[Timer]:
        """The wake-up or TTR Timer, if any."""
        held = self._payload
        if isinstance(held, bytes):
            return None
        aux = held.aux
        return aux if isinstance(aux, Timer) else None

    @timer.setter
    def timer(self, timer: Optional[Timer]) -> None:
        held = self._payload
        if timer is not None:
            self._payload = _Held(held if isinstance(held, bytes) else held.payload, timer)
        elif not isinstance(held, bytes) and isinstance(held.aux, Timer):
            self._payload = held.payload

    @property
    def result(self) -> Optional[bytes]:
        held = self._payload
        if isinstance(held, bytes):
            return None
        aux = held.aux
        return None if isinstance(aux, Timer) else aux

    @result.setter
    def result(self, result: Optional[bytes]) -> None:
        held = self._payload
        payload = held if isinstance(held, bytes) else held.payload
        self._payload = payload if result is None else _Held(payload, result)

    # ------------------------------------------------------ limits, flags
    @property
    def max_attempts(self) -> int:
        """0: up to ATTEMPTS_CAP; UNLIMITED_ATTEMPTS: no cap."""
        return ((self.flags >> _MAX_ATTEMPTS_SHIFT) & _FIELD_MASK) - 1

    @property
    def max_fails(self) -> int:
        return (self.flags >> _MAX_FAILS_SHIFT) & _FIELD_MASK

    @property
    def fails(self) -> int:
        return (self.flags >> _FAILS_SHIFT) & _FAILS_MASK

    @fails.setter
    def fails(self, fails: int) -> None:
        if not 0 <= fails <= _FAILS_MASK:
            raise ValueError(f"fails out of range: {fails}")
        self.flags = _intern((self.flags & _NOT_FAILS) | (fails << _FAILS_SHIFT))

    @property
    def foreground(self) -> bool:
        """A `run` job: removed once its caller has its answer."""
        return bool(self.flags & _FOREGROUND)

    @property
    def scheduled(self) -> bool:
        """Added by `schedule`: inspect shows its time."""
        return bool(self.flags & _SCHEDULED)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<Job {self.id} {self.name} state={self.state} attempts={self.attempts}>"
