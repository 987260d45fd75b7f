"""The supervisor's side: ask every shard and router, add their answers up
into one view of the node, and turn it into Prometheus metric families
(``/metrics``) or JSON (``/status``). Both are made from the same view,
gathered afresh at each request.

Counters stay counters across restarts: the supervisor keeps each
process's last answer, and when a shard or router comes back as a new
process (another pid or start time) the counters of the old one are kept
as that process's *base* and added to the new one's. A process that does
not answer is reported down (``queueserver_shard_up 0``) and its gauges are
left out, but its counters stay at their last values, so the node's sums
never go back (only what happened between its last answer and its death is
lost). The bases hold a bounded number of queue rows (:data:`BASE_ROWS`).

Queue labels are capped (:data:`~queueserver.metrics.MAX_QUEUE_LABELS`):
:class:`QueueLabels` picks the busiest queues by jobs added and keeps a
queue it picked as long as it can (see there); every other queue is summed
into ``queue="other"``, so sums over the label stay exact. A real queue
named ``other`` is always summed there.
"""
from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
)
from prometheus_client.utils import floatToGoString

from .. import __version__
from . import FSYNC_BUCKETS, LATENCY_BUCKETS, LOCAL_NODE, MAX_QUEUE_LABELS
from .control import ASK_TIMEOUT, ask_all
from .histogram import add_snapshots, empty_snapshot

COUNTERS = ("added", "leased", "completed", "failed", "expired")
#: a shard's history retention counters: segments dropped, and of those unread by the checkpoint
HISTORY_COUNTERS = ("history_dropped", "history_unread_dropped")
STATES = ("ready", "scheduled", "leased", "finished")
NCOUNTERS = len(COUNTERS)
OTHER = "other"
#: Queue rows a process's base may hold before the least busy are summed into its ``other``.
BASE_ROWS = 4 * MAX_QUEUE_LABELS
#: A queue without a label takes the place of a labelled one only when it has
#: added more than this many times as many jobs (and more than SWAP_MIN more).
SWAP_FACTOR = 2
SWAP_MIN = 10

Asker = Callable[[Dict[Any, str], float], Dict[Any, Optional[Dict[str, Any]]]]


# ------------------------------------------------------------ adding up
def _add(into: Any, more: Any) -> Any:
    """``into + more`` for the counters' plain data: numbers, lists of
    numbers (element by element), maps (key by key), histogram snapshots."""
    if isinstance(more, dict):
        if "bounds" in more and "counts" in more:
            if not isinstance(into, dict) or "counts" not in into:
                return copy.deepcopy(more)
            add_snapshots(into, more)
            return into
        if not isinstance(into, dict):
            into = {}
        for key, value in more.items():
            into[key] = _add(into[key], value) if key in into else copy.deepcopy(value)
        return into
    if isinstance(more, list):
        if not isinstance(into, list) or len(into) != len(more):
            return list(more)
        for i, value in enumerate(more):
            into[i] += value
        return into
    if isinstance(more, (int, float)) and isinstance(into, (int, float)):
        return into + more
    return more


def _counters(answer: Dict[str, Any]) -> Dict[str, Any]:
    """The parts of a process's answer that only grow (its counters)."""
    part: Dict[str, Any] = {key: answer.get(key, 0) for key in ("accepted", "bytes_received", "bytes_sent")}
    if answer.get("kind") == "shard":
        part["rows"] = {name: list(row[:NCOUNTERS]) for name, row in answer.get("rows", {}).items()}
        part["other"] = list(answer.get("other", [0] * NCOUNTERS)[:NCOUNTERS])
        for key, bounds in (("wait", LATENCY_BUCKETS), ("lease", LATENCY_BUCKETS),
                            ("fsync", FSYNC_BUCKETS)):
            part[key] = copy.deepcopy(answer.get(key) or empty_snapshot(bounds))
        part["log_records"] = answer.get("log_records", 0)
        for key in HISTORY_COUNTERS:
            part[key] = answer.get(key, 0)
        part["slot_moves"] = dict(answer.get("slot_moves", {"in": 0, "out": 0}))
    return part


def _bound_rows(part: Dict[str, Any], most: int = BASE_ROWS) -> None:
    """Sum the least busy rows of a base into its ``other`` beyond ``most`` rows."""
    rows = part.get("rows")
    if not rows or len(rows) <= most:
        return
    keep = sorted(rows, key=lambda name: (-rows[name][0], name))[:most]
    other = part.setdefault("other", [0] * NCOUNTERS)
    for name in set(rows) - set(keep):
        for i, value in enumerate(rows.pop(name)):
            other[i] += value


class _Process:
    """What the supervisor remembers of one shard or router between scrapes."""

    __slots__ = ("identity", "last", "base", "up")

    def __init__(self) -> None:
        self.identity: Optional[Tuple[Any, Any]] = None   # (pid, start time) last seen
        self.last: Optional[Dict[str, Any]] = None        # its last answer
        self.base: Dict[str, Any] = {}                    # counters of its earlier incarnations
        self.up = False

    def update(self, answer: Optional[Dict[str, Any]]) -> None:
        self.up = answer is not None
        if answer is None:
            return
        identity = (answer.get("pid"), answer.get("started"))
        if self.last is not None and identity != self.identity:
            self.base = _add(self.base, _counters(self.last))   # a restart: keep what it had counted
            _bound_rows(self.base)
        self.identity, self.last = identity, answer

    def counters(self) -> Dict[str, Any]:
        """Everything this process (all its incarnations) has counted."""
        total = copy.deepcopy(self.base)
        if self.last is not None:
            total = _add(total, _counters(self.last))
        return total


# -------------------------------------------------------------- labels
class QueueLabels:
    """Which queues get a label of their own: at most ``cap``, the busiest by
    jobs added (then by jobs held), stable from scrape to scrape.

    A queue once chosen keeps its label while it is in the answers, and its
    place is kept while it is not (a shard that does not answer); a queue
    without a label takes a free place, the place of a queue no longer seen,
    or that of the least busy labelled queue only when it added more than
    :data:`SWAP_FACTOR` times as many jobs. So labels change only when
    the busiest queues really change, and a series does not flap between
    its own label and ``other``.
    """

    def __init__(self, cap: int = MAX_QUEUE_LABELS) -> None:
        self.cap = cap
        self.chosen: Dict[str, None] = {}   # insertion-ordered set

    def choose(self, busy: Dict[str, Tuple[int, int]]) -> List[str]:
        """``busy``: queue -> (jobs added, jobs held). The labelled queues present."""
        chosen = self.chosen
        candidates = sorted((name for name in busy if name not in chosen and name != OTHER),
                            key=lambda name: (-busy[name][0], -busy[name][1], name))
        for name in candidates:
            if len(chosen) < self.cap:
                chosen[name] = None
                continue
            absent = next((c for c in chosen if c not in busy), None)
            if absent is not None:
                del chosen[absent]
                chosen[name] = None
                continue
            weakest = min(chosen, key=lambda c: (busy[c][0], busy[c][1]))
            added, weakest_added = busy[name][0], busy[weakest][0]
            if added > SWAP_FACTOR * weakest_added and added - weakest_added > SWAP_MIN:
                del chosen[weakest]
                chosen[name] = None
            else:
                break   # candidates come busiest first: no later one qualifies
        return [name for name in chosen if name in busy]


# ---------------------------------------------------------------- view
class NodeView:
    """The node as one set of numbers, gathered afresh by :meth:`gather`.

    ``shards``/``routers``: index -> control socket path (see
    :mod:`.control`). ``asker``: how to ask them all (tests give a fake).
    Thread-safe: concurrent scrapes each ask, then update the memory under a lock.
    """

    def __init__(self, node: Optional[str], shards: Dict[int, str], routers: Dict[int, str],
                 asker: Asker = ask_all, timeout: float = ASK_TIMEOUT,
                 cap: int = MAX_QUEUE_LABELS) -> None:
        self.node = node or LOCAL_NODE
        self.shards = dict(shards)
        self.routers = dict(routers)
        self.asker = asker
        self.timeout = timeout
        self.labels = QueueLabels(cap)
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._processes: Dict[Tuple[str, int], _Process] = {}
        #: every counter series' highest value so far (see :meth:`_monotonic`)
        self._high: Dict[Tuple[Any, ...], float] = {}
        self._labelled: set = set()   # the queues with a label of their own at the last scrape

    def gather(self) -> Dict[str, Any]:
        """Ask every process now and add the answers up: the ``/status`` document."""
        paths = {("shard", i): path for i, path in self.shards.items()}
        paths.update({("router", i): path for i, path in self.routers.items()})
        answers = self.asker(paths, self.timeout)
        with self._lock:
            for key in paths:
                self._processes.setdefault(key, _Process()).update(answers.get(key))
            return self._monotonic(self._view())

    def _monotonic(self, status: Dict[str, Any]) -> Dict[str, Any]:
        """Keep every counter at its highest value so far.

        A shard undoes a count now and then (an unlease, a take given back),
        and Prometheus would take any decrease for a restart of the counter.
        The one exception is ``queue="other"`` at a scrape where a queue
        gets its own label (back): what it takes out of ``other`` is gone
        from there, so that the sum over the label stays exact.
        """
        high, seen = self._high, {}
        labelled = {name for name in status["queues"] if name != OTHER}
        gained = labelled - self._labelled
        self._labelled = labelled

        def keep(key: Tuple[Any, ...], value: float) -> float:
            if not (gained and key[:2] == ("queue", OTHER)):
                value = max(value, high.get(key, 0))
            seen[key] = value
            return value

        for name, queue in status["queues"].items():
            counters = queue["counters"]
            for key in counters:
                counters[key] = keep(("queue", name, key), counters[key])
        totals = status["totals"]
        for key in (*COUNTERS, "accepted", "bytes_received", "bytes_sent"):
            totals[key] = keep(("total", key), totals[key])
        for kind in ("shards", "routers"):
            for entry in status[kind]:
                index = entry.get("shard", entry.get("router"))
                for key in ("accepted", "bytes_received", "bytes_sent", "log_records", *HISTORY_COUNTERS):
                    if key in entry:
                        entry[key] = keep((kind, index, key), entry[key])
                for key, value in entry.get("counters", {}).items():
                    entry["counters"][key] = keep((kind, index, "counters", key), value)
        for name, snapshot in status["histograms"].items():
            counts = snapshot["counts"]
            for i, value in enumerate(counts):
                counts[i] = keep(("histogram", name, i), value)
            snapshot["sum"] = keep(("histogram", name, "sum"), snapshot["sum"])
        for key, value in status["slot_moves"].items():
            status["slot_moves"][key] = keep(("slot_moves", key), value)
        self._high = seen   # series that went (a queue without its label any more) are forgotten
        return status

    def _view(self) -> Dict[str, Any]:
        rows: Dict[str, List[int]] = {}
        other = [0] * (NCOUNTERS + len(STATES))
        wait = empty_snapshot(LATENCY_BUCKETS)
        lease = empty_snapshot(LATENCY_BUCKETS)
        fsync = empty_snapshot(FSYNC_BUCKETS)
        slot_moves = {"in": 0, "out": 0}
        shards: List[Dict[str, Any]] = []
        routers: List[Dict[str, Any]] = []
        totals = {"jobs": 0, "queues": 0, "connections": 0, "accepted": 0, "bytes_received": 0,
                  "bytes_sent": 0}
        for index in sorted(self.shards):
            process = self._processes[("shard", index)]
            counted = process.counters()
            answer = process.last if process.up else None
            for name, counts in counted.get("rows", {}).items():
                row = rows.setdefault(name, [0] * len(other))
                for i, value in enumerate(counts):
                    row[i] += value
            for i, value in enumerate(counted.get("other", ())):
                other[i] += value
            if answer is not None:
                for name, values in answer.get("rows", {}).items():
                    row = rows.setdefault(name, [0] * len(other))
                    for i in range(NCOUNTERS, len(other)):
                        row[i] += values[i]
                for i in range(NCOUNTERS, len(other)):
                    other[i] += answer.get("other", [0] * len(other))[i]
            for key, into in (("wait", wait), ("lease", lease), ("fsync", fsync)):
                if key in counted:
                    add_snapshots(into, counted[key])
            for key in slot_moves:
                slot_moves[key] += counted.get("slot_moves", {}).get(key, 0)
            shard_counts = [0] * NCOUNTERS
            for counts in [*counted.get("rows", {}).values(), counted.get("other", [0] * NCOUNTERS)]:
                for i in range(NCOUNTERS):
                    shard_counts[i] += counts[i]
            entry: Dict[str, Any] = {
                "shard": index, "up": answer is not None,
                "pid": answer.get("pid") if answer else None,
                "counters": dict(zip(COUNTERS, shard_counts)),
                "log_records": counted.get("log_records", 0),
                "durable": bool((answer or process.last or {}).get("durable")),
                "history": bool((answer or process.last or {}).get("history")),
                **{key: counted.get(key, 0) for key in HISTORY_COUNTERS},
                "accepted": counted.get("accepted", 0),
                "bytes_received": counted.get("bytes_received", 0),
                "bytes_sent": counted.get("bytes_sent", 0),
            }
            if answer is not None:
                entry.update({key: answer.get(key, 0) for key in
                              ("jobs", "queues", "log_bytes", "connections", "slots_owned",
                               "history_bytes", "history_segments", "link_frames_sent")})
                for key in ("jobs", "queues", "connections"):
                    totals[key] += entry[key]
            for key in ("accepted", "bytes_received", "bytes_sent"):
                totals[key] += entry[key]
            shards.append(entry)
        for index in sorted(self.routers):
            process = self._processes[("router", index)]
            counted = process.counters()
            answer = process.last if process.up else None
            entry = {"router": index, "up": answer is not None,
                     "pid": answer.get("pid") if answer else None,
                     "accepted": counted.get("accepted", 0),
                     "bytes_received": counted.get("bytes_received", 0),
                     "bytes_sent": counted.get("bytes_sent", 0)}
            if answer is not None:
                entry["connections"] = answer.get("connections", 0)
                entry["clients"] = answer.get("clients", 0)
                # linked to how many of the shards it should reach (a cluster's other hosts')
                entry["shard_links_up"] = answer.get("shard_links_up", 0)
                entry["shard_links"] = answer.get("shard_links", 0)
                entry["link_frames_sent"] = answer.get("link_frames_sent", 0)
                totals["connections"] += entry["connections"]
            for key in ("accepted", "bytes_received", "bytes_sent"):
                totals[key] += entry[key]
            routers.append(entry)

        # Labels: the chosen queues on their own, the rest (and "other") summed.
        held = lambda row: sum(row[NCOUNTERS:])   # noqa: E731
        labelled = self.labels.choose({name: (row[0], held(row)) for name, row in rows.items()
                                       if name != OTHER})
        queues: Dict[str, Dict[str, int]] = {}
        picked = set(labelled)
        for name, row in rows.items():
            if name not in picked:
                for i, value in enumerate(row):
                    other[i] += value
        for name in sorted(picked) + [OTHER]:
            row = other if name == OTHER else rows[name]
            queues[name] = {"counters": dict(zip(COUNTERS, row[:NCOUNTERS])),
                            "jobs": dict(zip(STATES, row[NCOUNTERS:]))}
        counted_totals = [sum(queue["counters"][key] for queue in queues.values()) for key in COUNTERS]
        totals.update(zip(COUNTERS, counted_totals))
        return {
            "node": self.node, "version": __version__,
            "uptime_seconds": round(time.monotonic() - self.started, 3),
            "shards": shards, "routers": routers, "totals": totals, "queues": queues,
            "histograms": {"wait_seconds": wait, "lease_seconds": lease, "fsync_seconds": fsync},
            "slot_moves": slot_moves,
        }


# ----------------------------------------------------------- Prometheus
def _buckets(snapshot: Dict[str, Any]) -> List[Tuple[str, float]]:
    """Per-bucket counts -> Prometheus's cumulative ``(le, count)`` pairs, +Inf last."""
    out, running = [], 0
    for bound, count in zip(snapshot["bounds"], snapshot["counts"]):
        running += count
        out.append((floatToGoString(bound), running))
    running += sum(snapshot["counts"][len(snapshot["bounds"]):])
    out.append(("+Inf", running))
    return out


def families(status: Dict[str, Any]) -> List[Metric]:
    """The metric families of a :meth:`NodeView.gather` document (every one
    labelled ``node``)."""
    node = status["node"]
    out: List[Metric] = []

    def counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["node", *labels])
        out.append(family)
        return family

    def gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["node", *labels])
        out.append(family)
        return family

    def histogram(name: str, doc: str, snapshot: Dict[str, Any]) -> None:
        family = HistogramMetricFamily(name, doc, labels=["node"])
        family.add_metric([node], _buckets(snapshot), snapshot["sum"])
        out.append(family)

    docs = {
        "added": "Jobs added.",
        "leased": "Jobs leased (a take, a dequeue that needs no completion, counts too).",
        "completed": "Jobs completed.",
        "failed": "Jobs failed for good: a fail that finished the job, or attempts used up.",
        "expired": "Unfinished jobs removed when their time to live was over.",
    }
    queues = status["queues"]
    for key in COUNTERS:
        family = counter(f"queueserver_jobs_{key}_total", docs[key], ["queue"])
        for name, queue in queues.items():
            family.add_metric([node, name], queue["counters"][key])
    family = gauge("queueserver_queue_jobs", "Jobs held per queue and state.", ["queue", "state"])
    for name, queue in queues.items():
        for state in STATES:
            family.add_metric([node, name, state], queue["jobs"][state])
    hist = status["histograms"]
    histogram("queueserver_wait_seconds", "Time from ready (added, or back in line) to leased.",
              hist["wait_seconds"])
    histogram("queueserver_lease_seconds", "Time from leased to completed or failed.",
              hist["lease_seconds"])
    totals = status["totals"]
    gauge("queueserver_connections", "Client connections open now (routers and shards).") \
        .add_metric([node], totals["connections"])
    counter("queueserver_connections_accepted_total", "Client connections accepted.") \
        .add_metric([node], totals["accepted"])
    counter("queueserver_bytes_received_total", "Bytes received from clients.") \
        .add_metric([node], totals["bytes_received"])
    counter("queueserver_bytes_sent_total", "Bytes of answers sent to clients.") \
        .add_metric([node], totals["bytes_sent"])
    histogram("queueserver_fsync_seconds", "Duration of the log's fsyncs.", hist["fsync_seconds"])
    log_bytes = gauge("queueserver_log_bytes", "Bytes of the shard's log on disk.", ["shard"])
    log_records = counter("queueserver_log_records_total", "Records appended to the shard's log.",
                          ["shard"])
    slots = gauge("queueserver_slots_owned", "Cluster slots the shard owns.", ["shard"])
    up = gauge("queueserver_shard_up", "Whether the shard answered this scrape.", ["shard"])
    jobs = gauge("queueserver_jobs", "Jobs the shard holds.", ["shard"])
    history_bytes = gauge("queueserver_history_bytes", "Bytes of the shard's job history files.",
                          ["shard"])
    history_segments = gauge("queueserver_history_segments", "The shard's job history files.",
                             ["shard"])
    dropped = counter("queueserver_history_segments_dropped_total",
                      "History files removed by retention (max_bytes, max_age).", ["shard"])
    unread = counter("queueserver_history_unread_segments_dropped_total",
                     "History files removed by retention before the history checkpoint had read "
                     "them all.", ["shard"])
    for shard in status["shards"]:
        label = str(shard["shard"])
        up.add_metric([node, label], 1 if shard["up"] else 0)
        if shard["durable"]:
            log_records.add_metric([node, label], shard["log_records"])
        if shard["history"]:
            dropped.add_metric([node, label], shard["history_dropped"])
            unread.add_metric([node, label], shard["history_unread_dropped"])
        if shard["up"]:
            jobs.add_metric([node, label], shard["jobs"])
            slots.add_metric([node, label], shard["slots_owned"])
            if shard["durable"]:
                log_bytes.add_metric([node, label], shard["log_bytes"])
            if shard["history"]:
                history_bytes.add_metric([node, label], shard["history_bytes"])
                history_segments.add_metric([node, label], shard["history_segments"])
    moves = counter("queueserver_slot_moves_total", "Cluster slots moved in or out.", ["direction"])
    for direction in ("in", "out"):
        moves.add_metric([node, direction], status["slot_moves"][direction])
    router_up = gauge("queueserver_router_up", "Whether the router answered this scrape.", ["router"])
    for router in status["routers"]:
        router_up.add_metric([node, str(router["router"])], 1 if router["up"] else 0)
    return out


class NodeCollector:
    """A custom collector: every value is read when a scrape asks, from the
    processes themselves; nothing is kept in a global registry."""

    def __init__(self, view: NodeView) -> None:
        self.view = view

    def collect(self) -> Iterable[Metric]:
        return families(self.view.gather())

    def describe(self) -> Iterable[Metric]:
        return []   # registering asks no process
