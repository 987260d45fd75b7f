"""How many shards and routers a server runs when not told: one shard per
core this process may use (its CPU affinity, capped by its cgroup's CPU
quota), a router per eight such cores; checked against cgroup files laid
out as the kernel writes them, and through a real server started with a
narrowed CPU affinity."""
from __future__ import annotations

import os

import pytest

from queueserver import hostsize
from serverproc import ServerProcess


def cgroup_v2(tmp_path, cpu_max: str):
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    return str(tmp_path)


def cgroup_v1(tmp_path, quota: int, period: int):
    (tmp_path / "cpu").mkdir(parents=True)
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return str(tmp_path)


def test_a_cgroup_v2_quota_in_cores(tmp_path):
    assert hostsize.cgroup_quota(cgroup_v2(tmp_path, "150000 100000")) == 1.5
    assert hostsize.cgroup_quota(cgroup_v2(tmp_path, "max 100000")) is None


def test_a_cgroup_v1_quota_in_cores(tmp_path):
    assert hostsize.cgroup_quota(cgroup_v1(tmp_path / "limited", 300000, 100000)) == 3.0
    assert hostsize.cgroup_quota(cgroup_v1(tmp_path / "unlimited", -1, 100000)) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert hostsize.cgroup_quota(str(tmp_path)) is None


def test_the_quota_caps_the_affinity_rounded_up(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert hostsize.usable_cores(str(tmp_path)) == affinity
    assert hostsize.usable_cores(cgroup_v2(tmp_path, "50000 100000")) == 1      # half a core: one shard
    if affinity >= 2:
        assert hostsize.usable_cores(cgroup_v2(tmp_path, "110000 100000")) == 2


@pytest.mark.parametrize("cores, shards, routers", [(1, 1, 1), (2, 2, 1), (8, 8, 1), (16, 16, 2), (64, 64, 8)])
def test_the_defaults_by_cores(cores, shards, routers):
    assert (hostsize.default_shards(cores), hostsize.default_routers(cores)) == (shards, routers)


def test_a_server_on_one_allowed_core_starts_one_shard():
    """The affinity a container's cpuset gives (here: narrowed before exec)."""
    proc = ServerProcess(shards=None, protocols=["workq"], preexec=lambda: os.sched_setaffinity(0, {0}))
    proc.start()
    try:
        assert "runtime directory" in proc.log() and ", 1 shards" in proc.log()
        assert set(proc.child_pids()) == {"shard-0", "router"}
    finally:
        proc.stop()
