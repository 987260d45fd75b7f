"""``/status`` counts what ``make bench-cores`` divides by the jobs done:
frames between shards, frames between routers and shards, the requests
shards executed and the event-loop turns that executed them (a real
2-shard server, real clients).

Known work, known counts. On one host an add's id is claimed in the table
the shards share (:mod:`queueserver.shard.hostids`): no frame between
shards, wherever the id's home is. An add of an id another shard's job
has asks that shard (``exists``): one request frame and its answer on the
asking shard's link, a request for the shard asked, and the add is refused. Adds one at a time each run
in a turn of their own; adds pipelined in one write share one.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List

import pytest

from queueserver.client import Client
from queueserver.client.client import ClientError
from queueserver.placement import shard_for

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


def ids(count: int) -> List[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


def queue_on(shard: int) -> str:
    return next(name for name in (f"counted-{i}" for i in range(100)) if shard_for(name, 2) == shard)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "forwarded"])
def test_status_counts_frames_requests_and_turns(direct: bool) -> None:
    extra = ["--direct-path"] if direct else ["--no-direct-path"]
    with ServerProcess(shards=2, protocols=["workq"], extra=extra) as proc:
        zero, one = queue_on(0), queue_on(1)
        with Client("127.0.0.1", proc.port("workq")) as client, \
                Client("127.0.0.1", proc.port("workq")) as other:
            client.add(ids(1)[0], zero, b"x", 60_000, 600_000)   # the links are up once it is answered
            other.add(ids(1)[0], one, b"x", 60_000, 600_000)
            before = settled(proc)

            added = ids(ADDS)   # random ids, homes on either shard: claimed in the host's table
            for id in added:
                client.add(id, zero, b"x", 60_000, 600_000)
            claimed = counts(proc)
            assert claimed["shard_frames"] == before["shard_frames"]
            assert claimed["requests"] - before["requests"] == ADDS
            assert claimed["turns"] - before["turns"] == ADDS
            if not direct:   # each add forwarded: its frame and its answer's on the router's link
                assert claimed["router_frames"] - before["router_frames"] >= 2 * ADDS

            for id in added:   # shard 0's jobs' ids, on shard 1: it asks shard 0, which has them
                with pytest.raises(ClientError, match="Duplicate job"):
                    other.add(id, one, b"x", 60_000, 600_000)
            refused = counts(proc)
            assert refused["shard_frames"] - claimed["shard_frames"] == 2 * ADDS
            # each: the add on shard 1 and the ask on shard 0, a turn each; the
            # shard's own step (the refused job withdrawn) is no request
            assert refused["requests"] - claimed["requests"] == 2 * ADDS
            assert refused["turns"] - claimed["turns"] == 2 * ADDS

            pipe = client.pipeline()
            for id in ids(PIPELINED):
                pipe.add(id, zero, b"x", 60_000, 600_000)
            assert pipe.execute() == [None] * PIPELINED
            together = counts(proc)
            assert together["requests"] - refused["requests"] == PIPELINED
            # one write, read at once (a second read at most, should the kernel split it)
            assert 1 <= together["turns"] - refused["turns"] <= 2
