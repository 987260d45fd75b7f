"""The job history of a cluster, analysed on Spark across nodes: a job that
moved between nodes mid-life (added and leased on one, finished on the
other) is one job, finished, not stuck."""
from __future__ import annotations

import uuid

from cluster_nodes import Nodes
from queueserver.client import Client
from queueserver.placement import slot_of
from queueserver.history.app import run
from test_cluster import name_on


def test_jobs_that_moved_between_nodes_are_one_history_each(tmp_path, spark):
    with Nodes(tmp_path, shards=(1, 1), protocols=["workq"]) as nodes:
        nodes.start()
        name = name_on(0, "moving", founders=2)
        ids = [str(uuid.uuid4()) for _ in range(10)]
        with Client(*nodes.address("b")) as b:
            for id in ids:
                b.add(id, name, b"p", 60_000, 600_000)
            leased = [b.lease([name], 1000).id for _ in range(4)]     # leased on a/0 ...
            result = nodes.cli("move", "--slots", str(slot_of(name)), "--to", "b/0")
            assert result.returncode == 0, result.stderr
            for id in leased:                                          # ... completed on b/0
                b.complete(id, b"done")
            for _ in range(6):
                b.complete(b.lease([name], 1000).id, b"done")
    summary = run([str(tmp_path / "data-a" / "history"), str(tmp_path / "data-b" / "history")],
                  str(tmp_path / "out"), spark=spark, stale_after=3600)
    assert summary.jobs == 10
    assert summary.outcomes["completed"] == 10
    assert summary.outcomes["unfinished"] == 0
    jobs = {r["id"]: r.asDict() for r in spark.read.parquet(str(tmp_path / "out" / "jobs")).collect()}
    assert set(jobs) == set(ids)
    assert {jobs[id]["shard"] for id in ids} == {0}   # where each was added
