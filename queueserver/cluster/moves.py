"""What shards and the cluster command say about slots and their moves.

A shard accounts for its slots (:class:`SlotsSummary`: in its hello and its
answer to ``slots``); a command plans moves (:class:`PlannedMove`) and
carries each out in steps, the giver handing the jobs set aside over in
parts (:class:`MoveOutPart`). All plain data, as msgpack and etcd carry it;
slot sets are ``[start, end)`` ranges (:mod:`queueserver.placement`).
"""
from __future__ import annotations

from typing import Any, Dict, List, NotRequired, Optional, TypedDict

from ..placement import Ranges


class MovingSlots(TypedDict):
    """A move under way, as a shard tells of it."""
    epoch: int
    ranges: Ranges
    target: int
    jobs: int               # jobs set aside for it


class SlotsSummary(TypedDict):
    """A shard's account of its slots (``SlotOwnership.summary``, plain data
    for msgpack): in its hello, and in its answer to ``slots``."""
    served: List[List[int]]     # [start, end, epoch] runs of slots it serves
    moving: List[MovingSlots]
    hints: List[List[int]]      # [slot, owner, epoch] of slots it gave away
    max_epoch: int


class SlotsAnswer(SlotsSummary):
    """A shard's answer to ``slots``: its summary, its ordinal and its job count
    (and, a replicated cluster's, each follower's state and lag)."""
    shard: int
    jobs: int
    followers: NotRequired[List[Dict[str, Any]]]


class PlannedMove(TypedDict):
    """One move of a command's plan: ``ranges`` from shard ``giver`` to shard
    ``target``, as the move of ``epoch`` (fixed when planned, so that every
    step of it, repeated by whoever resumes it, is the same move)."""
    giver: int
    target: int
    ranges: Ranges
    epoch: int


class MoveOutPart(TypedDict):
    """A giver's answer to ``move_out``: a part of the jobs set aside."""
    jobs: List[List[Any]]       # "job" events, as plain lists
    next: Optional[int]         # where the next part starts; None: this was the last
    homes: NotRequired[List[List[int]]]   # with the first part: the id-home entries of the slots
