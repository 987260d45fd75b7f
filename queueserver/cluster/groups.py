"""Each shard group's record in etcd: who is primary, at which epoch, who is in sync.

``<prefix>/groups/<ordinal>`` holds, as JSON::

    {"primary": "b", "epoch": 2, "isr": ["c"], "copy": true}

``copy``: the primary serves from the copy it kept as a follower
(``DATA/replicas/<ordinal>``) rather than its home shard's directory.

Every write is a compare-and-swap on the key's modification revision, so of
two nodes acting on one record, one wins and the other reads again. The
rules that make failover safe live in who writes what:

- the primary writes ``isr``: a follower is taken out *before* an answer is
  released without it, so every node listed holds every acknowledged change;
- a follower writes ``primary``/``epoch`` (promoting itself) only when the
  primary's node has no lease and it is listed in ``isr``;
- a primary whose write finds another primary or epoch is deposed: it
  releases nothing more (fencing).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Tuple, TypedDict

from .coordination import Etcd, compare_and_put, read_with_revision


class Group(TypedDict):
    primary: str
    epoch: int
    isr: List[str]
    copy: bool


#: (the record, its modification revision); (None, 0) when absent
Read = Tuple[Optional[Group], int]


def key(etcd: Etcd, ordinal: int) -> str:
    return etcd.key("groups", str(ordinal))


def decode(value: bytes) -> Group:
    """A group record as etcd holds it (JSON)."""
    record: Any = json.loads(value)
    return Group(primary=str(record["primary"]), epoch=int(record["epoch"]),
                 isr=[str(n) for n in record.get("isr", [])], copy=bool(record.get("copy", False)))


def read(etcd: Etcd, ordinal: int) -> Read:
    value, revision = read_with_revision(etcd, key(etcd, ordinal))
    return (None, 0) if value is None else (decode(value), revision)


def read_all(etcd: Etcd) -> Dict[int, Group]:
    prefix = etcd.key("groups", "")
    found = etcd.call(lambda client: client.get_prefix(prefix))
    return {int(meta["key"].decode()[len(prefix):]): decode(value) for value, meta in found}


def swap(etcd: Etcd, ordinal: int, revision: int, group: Group) -> bool:
    """Write ``group`` if the record is still at ``revision`` (0: still absent)."""
    return compare_and_put(etcd, key(etcd, ordinal), revision, json.dumps(group, sort_keys=True))


class Deposed(ValueError):
    """Another node is the group's primary: this one must not serve it."""


def take_primary(etcd: Etcd, ordinal: int, node: str, copy: bool, logged: int = 0) -> int:
    """At a primary's start: the group's record says ``node`` is primary (made
    so if there is none yet) and lists no follower in sync (each is listed
    again once it caught up with this process's stream); its epoch, never
    below ``logged`` (the newest epoch the primary's log holds: a record
    lost with etcd, or older than the log, starts again there, so followers
    that saw that epoch still take the stream, and refuse a deposed one's).
    Deposed if another node is the primary."""
    while True:
        group, revision = read(etcd, ordinal)
        if group is None:
            fresh = Group(primary=node, epoch=max(1, logged), isr=[], copy=copy)
            if swap(etcd, ordinal, 0, fresh):
                return fresh["epoch"]
            continue
        if group["primary"] != node:
            raise Deposed(f"node {group['primary']} is the primary of shard {ordinal} (epoch "
                          f"{group['epoch']})")
        epoch = max(group["epoch"], logged)
        if swap(etcd, ordinal, revision, Group(primary=node, epoch=epoch, isr=[], copy=group["copy"])):
            return epoch


def isr_store(etcd: Etcd, ordinal: int, node: str, epoch: int) -> Callable[[List[str]], bool]:
    """What a primary records its in-sync followers with (see :mod:`.replication`)."""

    def store(members: List[str]) -> bool:
        while True:
            group, revision = read(etcd, ordinal)
            if group is None or group["primary"] != node or group["epoch"] != epoch:
                return False
            if swap(etcd, ordinal, revision, Group(primary=node, epoch=epoch, isr=sorted(members),
                                                   copy=group["copy"])):
                return True
    return store


def promote(etcd: Etcd, ordinal: int, node: str, alive: Callable[[str], bool]) -> Optional[Group]:
    """Make ``node`` the group's primary if its primary's node has no lease
    and ``node`` is in sync (one compare-and-swap); the new record, or None."""
    group, revision = read(etcd, ordinal)
    if group is None or group["primary"] == node or node not in group["isr"] or alive(group["primary"]):
        return None
    new = Group(primary=node, epoch=group["epoch"] + 1, isr=[], copy=True)
    return new if swap(etcd, ordinal, revision, new) else None
