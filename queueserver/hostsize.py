"""How many shard and router processes a server runs when it is not told.

Why: a shard per core is what makes lease and complete traffic scale, but
``os.cpu_count()`` counts the machine's cores, not the ones this process may
use. In a container limited by a cpuset (``docker --cpuset-cpus``) or a CPU
quota (``docker --cpus``, Kubernetes' ``limits.cpu``), a shard per host core
would have dozens of processes fight over two cores, each paying the
per-turn cost of its event loop for fewer requests. So the cores counted
are the fewest of: the CPUs this process may run on (its affinity), and the
cgroup's quota (v2 ``cpu.max``, or v1's ``cfs_quota_us``), rounded up.

Routers: with the direct path a router mostly accepts connections and
hands them to shards; one keeps up with many shards (docs/benchmarks.md,
*Choosing the default process counts*), so one more only per
:data:`CORES_PER_ROUTER` cores.
"""
from __future__ import annotations

import math
import os
from typing import Final, Optional

CORES_PER_ROUTER: Final = 8
_CGROUP: Final = "/sys/fs/cgroup"


def usable_cores(cgroup: str = _CGROUP) -> int:
    """Cores this process may keep busy: its affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_quota(cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def cgroup_quota(cgroup: str = _CGROUP) -> Optional[float]:
    """The CPU quota of this process's cgroup in cores (None: no quota, or no cgroup to read)."""
    try:
        with open(os.path.join(cgroup, "cpu.max")) as f:          # cgroup v2: "max 100000" or "200000 100000"
            quota, _, period = f.read().strip().partition(" ")
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:                                                           # cgroup v1
        with open(os.path.join(cgroup, "cpu", "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(cgroup, "cpu", "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def default_shards(cores: Optional[int] = None) -> int:
    """One shard per usable core."""
    return cores if cores is not None else usable_cores()


def default_routers(cores: Optional[int] = None) -> int:
    """One router, and one more per :data:`CORES_PER_ROUTER` cores beyond the first eight."""
    cores = cores if cores is not None else usable_cores()
    return max(1, cores // CORES_PER_ROUTER)
