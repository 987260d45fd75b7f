"""The epoch in every log record, as fencing uses it: a primary's epoch is
never older than its log's, and a follower's copy remembers the newest
epoch it holds, so a follower restarted refuses a deposed primary's stream.
On a real etcd and real log files."""
from __future__ import annotations

from pathlib import Path

import pytest

from queueserver.cluster import groups
from queueserver.cluster.clusterfile import MAX_SHARDS, EtcdSpec, load_cluster
from queueserver.cluster.coordination import Etcd
from queueserver.shard.follower import Copy, Follower
from queueserver.store import AppendLog, recover

from cluster_nodes import Nodes
from etcd_server import EtcdServer, etcd  # noqa: F401  (the fixture)


def test_a_primary_never_takes_an_epoch_older_than_its_log(etcd: EtcdServer) -> None:   # noqa: F811
    client = Etcd(EtcdSpec((etcd.endpoint,), "/qs-test"))
    try:
        # No record (etcd lost it): the group starts again at the log's epoch.
        assert groups.take_primary(client, 0, "a", False, logged=5) == 5
        assert groups.read(client, 0)[0] == groups.Group(primary="a", epoch=5, isr=[], copy=False)
        # A record older than the log (etcd restored from an old backup): raised to the log's.
        assert groups.take_primary(client, 1, "b", False) == 1
        assert groups.take_primary(client, 1, "b", False, logged=4) == 4
        # A newer record than the log: the record's.
        assert groups.take_primary(client, 1, "b", False, logged=2) == 4
        with pytest.raises(groups.Deposed):
            groups.take_primary(client, 1, "c", False, logged=9)
    finally:
        client.close()


def test_a_restarted_follower_refuses_a_stream_older_than_its_copy(tmp_path: Path) -> None:
    nodes = Nodes(tmp_path, shards=(1, 1))
    nodes.file.write_text("replicas = 1\n" + nodes.file.read_text())
    spec = load_cluster(str(nodes.file))
    primary = spec.shards()[0]
    directory = str(tmp_path / "replicas" / "0")
    # The copy a follower kept: records of the stream of epoch 4.
    rec = recover(directory, primary.ordinal, MAX_SHARDS)
    list(rec)
    wal = AppendLog(rec).start()
    wal.epoch = 4
    wal.append(("queue", "q"))
    wal.sync()
    wal.close()

    copy = Copy(directory, primary, "always", 1 << 20)
    follower = Follower(spec, "b", primary, copy)
    assert copy.epoch == 4 and follower.epoch == 4
    with pytest.raises(ValueError, match="epoch 3, older than 4: a deposed primary"):
        follower._check(3)
    follower._check(4)
    follower._check(6)
    with pytest.raises(ValueError):
        follower._check(5)
    # A new stream's records are written under its epoch.
    assert copy.snapshot_part(10, [("queue", "q")], True, 6)
    assert copy.epoch == 6
    copy.apply(11, [["queue", "r"]], 6)
    copy.close()
    rec = recover(directory, primary.ordinal, MAX_SHARDS)
    list(rec)
    assert rec.max_epoch == 6
