"""What a router's control socket answers (see :mod:`queueserver.metrics.control`)."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Dict

from ..metrics import refusals, traffic
from ..metrics.linkframes import LinkFrames
from ..net.channel import FRAMES_SENT

if TYPE_CHECKING:
    from .router import Router

_STARTED = time.time()
#: frames over this router's links to the shards (every frame between it and them)
_LINK_FRAMES = LinkFrames()


def router_stats(router: "Router") -> Dict[str, Any]:
    """``connections``: clients served by this router now (a connection
    handed to a shard is counted by that shard while it is there);
    ``clients``: every connection it accepted that is still open, wherever
    it is served; ``accepted`` and the byte counters: since it started;
    ``link_frames``: frames sent and received over its links to the shards
    (:mod:`queueserver.metrics.linkframes`); in
    a cluster on etcd, what it took of the state etcd holds (``etcd_*``)."""
    answer: Dict[str, Any] = {"kind": "router", "index": router.index, "pid": os.getpid(),
                              "started": _STARTED, "clients": router.clients,
                              "shard_links_up": sum(1 for link in router.links if link.up),
                              "shard_links": sum(1 for link in router.links if link.path is not None),
                              "link_frames_sent": FRAMES_SENT[0],
                              "link_frames": _LINK_FRAMES.count([link.channel for link in router.links])}
    answer.update(traffic.snapshot())
    answer["refusals"] = refusals.snapshot()   # by the access rules: identity -> verb -> count
    answer.update(router.cluster_counts())
    return answer
