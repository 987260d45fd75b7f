"""How each binary protocol's ordering field maps onto the engine's ``priority``.

The engine serves the HIGHEST ``priority`` first (workq semantics). goqueue
serves the LOWEST ``<priority>`` (unsigned 32-bit) first and TaskFlux the
SMALLEST ``Key`` (signed 64-bit) first, so both store the negated value.
FIFO within one value is the engine's own tie-break (schedule time, creation,
job number).

Rendering goes the other way and clamps into the protocol's range, because a
job may come from another protocol: a workq job with priority 5 (engine 5)
shows over goqueue as priority 0, one with priority -7 as 7; over TaskFlux
both keep their exact (negated) value.
"""
from __future__ import annotations

from typing import Final

U32_MAX: Final = 2 ** 32 - 1
I64_MIN: Final = -2 ** 63
I64_MAX: Final = 2 ** 63 - 1


def _clamp(value: int, low: int, high: int) -> int:
    return low if value < low else high if value > high else value


def from_goqueue(priority: int) -> int:
    """Engine priority of a goqueue ``<priority>`` (0..2**32-1, lowest served first)."""
    return -priority


def to_goqueue(priority: int) -> int:
    """goqueue ``<priority>`` of a job with engine ``priority``, clamped to 0..2**32-1."""
    return _clamp(-priority, 0, U32_MAX)


def from_taskflux(key: int) -> int:
    """Engine priority of a TaskFlux ``Key`` (signed 64-bit, smallest served first)."""
    return -key


def to_taskflux(priority: int) -> int:
    """TaskFlux ``Key`` of a job with engine ``priority``, clamped to the Int64 range."""
    return _clamp(-priority, I64_MIN, I64_MAX)
