"""Per-node metrics: ``/metrics`` (Prometheus text) and ``/status`` (JSON).

The processes that do the work count cheaply as they go, into plain ints
and bucket arrays (:mod:`.histogram`, :mod:`.traffic`, :mod:`.uses`,
:mod:`queueserver.shard.stats`). Each shard and router answers ``["stats"]``
on a control socket of its own in the runtime directory (:mod:`.control`).
The supervisor asks them all at scrape time, adds their answers up
(:mod:`.collect`) and serves them over HTTP from a thread (the node's HTTP
port, which serves the web console too: :mod:`queueserver.console.http`).

Only :mod:`.collect` and :mod:`queueserver.console.http` import
``prometheus_client``; the worker processes never do.
"""
from __future__ import annotations

#: At most this many ``queue`` label values per node (plus ``other``, the rest summed).
MAX_QUEUE_LABELS = 100

#: What the node is called in the ``node`` label outside a cluster.
LOCAL_NODE = "local"

#: Bucket bounds (seconds) of the wait and lease histograms: 1 ms to 60 s.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)

#: Bucket bounds (seconds) of the fsync histogram: 100 µs to 10 s.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                 0.5, 1.0, 2.5, 5.0, 10.0)
