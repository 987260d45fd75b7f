"""A replicated node's roles as etcd says (queueserver.cluster.failover),
with the group records given here instead of read from etcd: what the
supervisor is told to run at the start, after a promotion, for a deposed
shard, and around fencing (the processes themselves are the supervisor's:
tests/test_failover.py runs them against a real etcd)."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

from queueserver.cluster import failover as failover_module
from queueserver.cluster.clusterfile import ClusterSpec, load_cluster
from queueserver.cluster.coordination import CoordinationError
from queueserver.cluster.failover import FENCE_AFTER, Failover
from queueserver.cluster.groups import Group
from queueserver.cluster.roles import FOLLOWER, PRIMARY_COPY, PRIMARY_HOME

TTL = 4


def spec(tmp_path: Path) -> ClusterSpec:
    """Nodes a, b, c with a shard each, one copy of each shard on the next node."""
    secret = tmp_path / "s"
    secret.write_bytes(b"x" * 32)
    secret.chmod(0o600)
    nodes = "".join(f'[[node]]\nname = "{name}"\nhost = "127.0.0.{i + 1}"\nlink_port = 7400\nshards = 1\n'
                    for i, name in enumerate("abc"))
    path = tmp_path / "cluster.toml"
    path.write_text('secret_file = "s"\nreplicas = 1\n' + nodes + textwrap.dedent(f"""\
        [etcd]
        endpoints = ["http://127.0.0.1:2379"]
        lease_ttl = {TTL}
        """))
    return load_cluster(str(path))


def group(primary: str, copy: bool = False) -> Group:
    return Group(primary=primary, epoch=1, isr=[], copy=copy)


class Records:
    """What ``read_all`` finds in etcd (an error: etcd does not answer)."""

    def __init__(self, groups: Dict[int, Group]) -> None:
        self.groups = groups
        self.error = False

    def __call__(self, etcd: object) -> Dict[int, Group]:
        if self.error:
            raise CoordinationError("etcd does not answer")
        return dict(self.groups)


class Lease:
    def __init__(self) -> None:
        self.silent = 0.0

    def silent_for(self) -> float:
        return self.silent


@pytest.fixture
def records(monkeypatch: pytest.MonkeyPatch) -> Records:
    found = Records({0: group("a"), 1: group("b"), 2: group("c")})
    monkeypatch.setattr(failover_module, "read_all", found)
    return found


def node_a(tmp_path: Path, records: Records) -> Failover:
    """Node a: the home of shard 0, the follower of shard 2."""
    return Failover(spec(tmp_path), "a", object(), records(None))   # type: ignore[arg-type]


def test_the_roles_at_the_start_are_what_the_records_say(tmp_path: Path, records: Records) -> None:
    failover = node_a(tmp_path, records)
    assert failover.roles == {0: PRIMARY_HOME, 2: FOLLOWER}
    assert failover.watch.following == [2]
    records.groups[2] = group("a", copy=True)   # a was promoted in shard 2 before it restarted
    records.groups[0] = group("b", copy=True)   # and b in shard 0
    again = node_a(tmp_path, records)
    assert again.roles == {0: FOLLOWER, 2: PRIMARY_COPY}
    assert again.watch.following == [0]


def test_coordinate_waits_for_etcd_unless_told_to_stop(tmp_path: Path, records: Records,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failover_module, "Etcd", lambda spec: object())
    records.error = True
    asked: List[int] = []

    def stopping() -> bool:
        asked.append(1)
        if len(asked) == 2:
            records.error = False   # etcd answers on the second try
        return len(asked) > 3

    monkeypatch.setattr(failover_module.time, "sleep", lambda seconds: None)
    found = Failover.coordinate(spec(tmp_path), "a", stopping)
    assert found is not None and found.roles == {0: PRIMARY_HOME, 2: FOLLOWER} and len(asked) == 2
    records.error = True
    assert Failover.coordinate(spec(tmp_path), "a", lambda: True) is None


def test_a_promotion_won_is_handed_over_once(tmp_path: Path, records: Records) -> None:
    failover = node_a(tmp_path, records)
    failover.watch.promoted.put((2, group("a", copy=True)))
    assert failover.promotions() == [2]
    assert failover.promotions() == []
    failover.runs(2, PRIMARY_COPY)
    assert failover.roles[2] == PRIMARY_COPY and failover.watch.following == []


def test_a_deposed_shard_runs_what_etcd_says_if_it_is_another_role(tmp_path: Path, records: Records) -> None:
    failover = node_a(tmp_path, records)
    assert failover.replan(0) is None   # etcd still names a: restarted as usual
    records.groups[0] = group("b", copy=True)
    assert failover.replan(0) == FOLLOWER
    assert failover.roles[0] == PRIMARY_HOME   # until the supervisor runs it
    records.error = True
    assert failover.replan(0) is None


def test_a_silent_lease_fences_until_it_is_back_and_then_only_changed_roles_move(
        tmp_path: Path, records: Records) -> None:
    failover, lease = node_a(tmp_path, records), Lease()
    lease.silent = TTL * FENCE_AFTER
    assert not failover.silent(lease)
    lease.silent = TTL * FENCE_AFTER + 0.1
    assert failover.silent(lease)
    failover.fence(lease)
    assert failover.fenced and failover.watch.paused.is_set()
    records.error = True   # back, but etcd cannot be read yet: still fenced
    assert failover.lease_back() is None and failover.fenced
    records.error = False
    records.groups[0] = group("b", copy=True)   # b took shard 0 over meanwhile
    assert failover.lease_back() == {0: FOLLOWER}
    assert not failover.fenced and failover.roles == {0: FOLLOWER, 2: FOLLOWER}
    assert failover.watch.paused.is_set()   # until the supervisor has swapped the processes
    failover.resume()
    assert not failover.watch.paused.is_set() and failover.watch.following == [0, 2]
