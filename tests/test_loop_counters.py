"""``/status`` counts what ``make bench-cores`` divides by the jobs done:
frames between shards, frames between routers and shards, requests and the
event-loop turns that executed them (a real 2-shard server, real clients).

Known work, known counts: an add whose id is at home on the other shard
is claimed there, one request frame and one answer on the adding shard's
link; an add whose id is at home where it is made sends nothing. Adds one
at a time each run in a turn of their own; adds pipelined in one write
share one.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List

import pytest

from queueserver.client import Client
from queueserver.sharding import shard_for

from serverproc import ServerProcess, http_get, poll

ADDS = 6
PIPELINED = 20


def status(proc: ServerProcess) -> Dict[str, Any]:
    return json.loads(http_get(proc, "/status"))


def counts(proc: ServerProcess) -> Dict[str, int]:
    doc = status(proc)
    shards, routers = doc["shards"], doc["routers"]
    return {"shard_frames": sum(s["shard_link_frames"] for s in shards),
            "router_frames": sum(r["link_frames"] for r in routers),
            "requests": sum(s["requests"] for s in shards),
            "turns": sum(s["request_turns"] for s in shards)}


def settled(proc: ServerProcess) -> Dict[str, int]:
    """The counts once two reads in a row agree (a router's report of its
    clients may still be on its way)."""
    last = [counts(proc)]

    def same() -> bool:
        now = counts(proc)
        agree, last[0] = now == last[0], now
        return agree

    assert poll(same, 10), last[0]
    return last[0]


def ids_at_home(shard: int, count: int) -> List[str]:
    ids: List[str] = []
    while len(ids) < count:
        id = str(uuid.uuid4())
        if shard_for(id, 2) == shard:
            ids.append(id)
    return ids


def queue_on(shard: int) -> str:
    return next(name for name in (f"counted-{i}" for i in range(100)) if shard_for(name, 2) == shard)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "forwarded"])
def test_status_counts_frames_requests_and_turns(direct: bool) -> None:
    extra = [] if direct else ["--no-direct-path"]
    with ServerProcess(shards=2, protocols=["workq"], extra=extra) as proc:
        queue = queue_on(0)
        with Client("127.0.0.1", proc.port("workq")) as client:
            # The links are up and the homes have listed each other's jobs once
            # an add claimed at the other shard is answered; then nothing moves.
            client.add(ids_at_home(1, 1)[0], queue, b"x", 60_000, 600_000)
            before = settled(proc)

            for id in ids_at_home(1, ADDS):   # claimed at shard 1, one at a time
                client.add(id, queue, b"x", 60_000, 600_000)
            claimed = counts(proc)
            assert claimed["shard_frames"] - before["shard_frames"] == 2 * ADDS
            assert claimed["requests"] - before["requests"] == ADDS
            assert claimed["turns"] - before["turns"] == ADDS
            if not direct:   # each add forwarded: its frame and its answer's on the router's link
                assert claimed["router_frames"] - before["router_frames"] >= 2 * ADDS

            for id in ids_at_home(0, ADDS):   # at home where they are made: no frame between shards
                client.add(id, queue, b"x", 60_000, 600_000)
            home = counts(proc)
            assert home["shard_frames"] == claimed["shard_frames"]
            assert home["requests"] - claimed["requests"] == ADDS

            pipe = client.pipeline()
            for id in ids_at_home(0, PIPELINED):
                pipe.add(id, queue, b"x", 60_000, 600_000)
            assert pipe.execute() == [None] * PIPELINED
            together = counts(proc)
            assert together["requests"] - home["requests"] == PIPELINED
            # one write, read at once (a second read at most, should the kernel split it)
            assert 1 <= together["turns"] - home["turns"] <= 2
