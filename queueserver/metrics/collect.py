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
from typing import (Any, Callable, Dict, Iterable, List, Literal, NotRequired, Optional, Set, Tuple,
                    TypedDict, Union, cast)

from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
)
from prometheus_client.utils import floatToGoString

from .. import COMPILED, WHY_PURE, __version__
from . import FSYNC_BUCKETS, LATENCY_BUCKETS, LOCAL_NODE, MAX_QUEUE_LABELS
from .control import ASK_TIMEOUT, Answer, ask_all
from .histogram import Snapshot, add_snapshots, empty_snapshot
from .refusals import snapshot as own_refusals

COUNTERS = ("added", "leased", "completed", "failed", "expired")
#: a shard's history retention counters: segments dropped, and of those unread by the checkpoint
HISTORY_COUNTERS = ("history_dropped", "history_unread_dropped")
#: the counters of a shard's /status entry; a router's are its client traffic's
ShardCounter = Literal["accepted", "bytes_received", "bytes_sent", "log_records", "history_dropped",
                       "history_unread_dropped"]
SHARD_COUNTERS: Tuple[ShardCounter, ...] = ("accepted", "bytes_received", "bytes_sent", "log_records",
                                            "history_dropped", "history_unread_dropped")
TRAFFIC_COUNTERS: Tuple[Literal["accepted", "bytes_received", "bytes_sent"], ...] = (
    "accepted", "bytes_received", "bytes_sent")
#: what a shard's entry shows only while it answers, in this order
#: (the last four count since the process started: frames it sent over every
#: link, frames over its links to other shards, requests it executed, and the
#: event-loop turns that executed any; ``make bench-cores`` takes their differences)
ShardGauge = Literal["jobs", "queues", "log_bytes", "connections", "slots_owned", "history_bytes",
                     "history_segments", "link_frames_sent", "shard_link_frames", "requests",
                     "request_turns", "tls_relays", "tls_moves"]
SHARD_GAUGES: Tuple[ShardGauge, ...] = ("jobs", "queues", "log_bytes", "connections", "slots_owned",
                                        "history_bytes", "history_segments", "link_frames_sent",
                                        "shard_link_frames", "requests", "request_turns", "tls_relays",
                                        "tls_moves")
STATES = ("ready", "scheduled", "leased", "finished")
NCOUNTERS = len(COUNTERS)
OTHER = "other"
#: Queue rows a process's base may hold before the least busy are summed into its ``other``.
BASE_ROWS = 4 * MAX_QUEUE_LABELS
#: A queue without a label takes the place of a labelled one only when it has
#: added more than this many times as many jobs (and more than SWAP_MIN more).
SWAP_FACTOR = 2
SWAP_MIN = 10

#: a process: ("shard", index) or ("router", index)
ProcessKey = Tuple[str, int]
Asker = Callable[[Dict[ProcessKey, str], float], Dict[ProcessKey, Optional[Answer]]]
#: a counter series of /status, e.g. ("queue", name, "added") (see NodeView._monotonic)
Series = Tuple[Union[str, int], ...]


# ------------------------------------------------------------ /status
class QueueStatus(TypedDict):
    """A queue (or ``other``): its counters (:data:`COUNTERS`) and jobs per state (:data:`STATES`)."""
    counters: Dict[str, int]
    jobs: Dict[str, int]


class ShardStatus(TypedDict):
    """A shard in ``/status``: counters always, gauges while it answers."""
    shard: int
    up: bool
    pid: Optional[int]
    counters: Dict[str, int]
    log_records: int
    durable: bool
    history: bool
    history_dropped: int
    history_unread_dropped: int
    accepted: int
    bytes_received: int
    bytes_sent: int
    jobs: NotRequired[int]
    queues: NotRequired[int]
    log_bytes: NotRequired[int]
    connections: NotRequired[int]
    slots_owned: NotRequired[int]
    history_bytes: NotRequired[int]
    history_segments: NotRequired[int]
    link_frames_sent: NotRequired[int]
    shard_link_frames: NotRequired[int]
    requests: NotRequired[int]
    request_turns: NotRequired[int]
    tls_relays: NotRequired[int]
    tls_moves: NotRequired[int]


class RouterStatus(TypedDict):
    """A router in ``/status``: counters always, gauges while it answers."""
    router: int
    up: bool
    pid: Optional[int]
    accepted: int
    bytes_received: int
    bytes_sent: int
    connections: NotRequired[int]
    clients: NotRequired[int]
    shard_links_up: NotRequired[int]
    shard_links: NotRequired[int]
    link_frames_sent: NotRequired[int]
    link_frames: NotRequired[int]


class Status(TypedDict):
    """The ``/status`` document: the node at one scrape."""
    node: str
    version: str
    compiled: bool             # the compiled (mypyc) modules run (queueserver.COMPILED)
    why_pure: Optional[str]    # why not (queueserver.WHY_PURE); None when compiled
    uptime_seconds: float
    shards: List[ShardStatus]
    routers: List[RouterStatus]
    totals: Dict[str, int]   # COUNTERS, and jobs, queues, connections, accepted, bytes_*
    queues: Dict[str, QueueStatus]
    histograms: Dict[str, Snapshot]   # wait_seconds, lease_seconds, fsync_seconds
    slot_moves: Dict[str, int]        # in, out
    refusals: NotRequired[Dict[str, Dict[str, int]]]   # by the access rules: identity -> verb -> count


# ------------------------------------------------------------ adding up
def _add(into: Any, more: Any) -> Any:
    """``into + more`` for the counters' plain data: numbers, lists of
    numbers (element by element), maps (key by key), histogram snapshots.
    (``Any``: the processes' decoded answers, walked by their shape.)"""
    if isinstance(more, dict):
        if "bounds" in more and "counts" in more:
            if not isinstance(into, dict) or "counts" not in into:
                return copy.deepcopy(more)
            # both decoded histogram snapshots (Histogram.snapshot, sent by a shard)
            add_snapshots(cast(Snapshot, into), cast(Snapshot, more))
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


def _counters(answer: Answer) -> Dict[str, Any]:
    """The parts of a process's answer that only grow (its counters)."""
    part: Dict[str, Any] = {key: answer.get(key, 0) for key in ("accepted", "bytes_received", "bytes_sent")}
    part["refusals"] = copy.deepcopy(answer.get("refusals") or {})
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
        self.identity: Optional[Tuple[object, object]] = None   # (pid, start time) last seen
        self.last: Optional[Answer] = None                      # its last answer
        self.base: Dict[str, Any] = {}                          # counters of its earlier incarnations
        self.up = False

    def update(self, answer: Optional[Answer]) -> None:
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
        self._processes: Dict[ProcessKey, _Process] = {}
        #: every counter series' highest value so far (see :meth:`_monotonic`);
        #: the histograms' sums (seconds) apart, the counts are ints
        self._high: Dict[Series, int] = {}
        self._high_sums: Dict[Series, float] = {}
        self._labelled: Set[str] = set()   # the queues with a label of their own at the last scrape

    def gather(self) -> Status:
        """Ask every process now and add the answers up: the ``/status`` document."""
        paths: Dict[ProcessKey, str] = {("shard", i): path for i, path in self.shards.items()}
        paths.update({("router", i): path for i, path in self.routers.items()})
        answers = self.asker(paths, self.timeout)
        with self._lock:
            for key in paths:
                self._processes.setdefault(key, _Process()).update(answers.get(key))
            return self._monotonic(self._view())

    def _monotonic(self, status: Status) -> Status:
        """Keep every counter at its highest value so far.

        A shard undoes a count now and then (an unlease, a take given back),
        and Prometheus would take any decrease for a restart of the counter.
        The one exception is ``queue="other"`` at a scrape where a queue
        gets its own label (back): what it takes out of ``other`` is gone
        from there, so that the sum over the label stays exact.
        """
        high, seen = self._high, {}
        high_sums, seen_sums = self._high_sums, {}
        labelled = {name for name in status["queues"] if name != OTHER}
        gained = labelled - self._labelled
        self._labelled = labelled

        def keep(key: Series, value: int) -> int:
            if not (gained and key[:2] == ("queue", OTHER)):
                value = max(value, high.get(key, 0))
            seen[key] = value
            return value

        def keep_sum(key: Series, value: float) -> float:
            value = max(value, high_sums.get(key, 0))
            seen_sums[key] = value
            return value

        for name, queue in status["queues"].items():
            counters = queue["counters"]
            for key in counters:
                counters[key] = keep(("queue", name, key), counters[key])
        totals = status["totals"]
        for key in (*COUNTERS, "accepted", "bytes_received", "bytes_sent"):
            totals[key] = keep(("total", key), totals[key])
        for shard in status["shards"]:
            index = shard["shard"]
            for counter in SHARD_COUNTERS:
                shard[counter] = keep(("shards", index, counter), shard[counter])
            for key, value in shard["counters"].items():
                shard["counters"][key] = keep(("shards", index, "counters", key), value)
        for router in status["routers"]:
            index = router["router"]
            for counter in TRAFFIC_COUNTERS:
                router[counter] = keep(("routers", index, counter), router[counter])
        for name, snapshot in status["histograms"].items():
            counts = snapshot["counts"]
            for i, value in enumerate(counts):
                counts[i] = keep(("histogram", name, i), value)
            snapshot["sum"] = keep_sum(("histogram", name, "sum"), snapshot["sum"])
        for key, value in status["slot_moves"].items():
            status["slot_moves"][key] = keep(("slot_moves", key), value)
        for identity, verbs in status.get("refusals", {}).items():
            for verb, value in verbs.items():
                verbs[verb] = keep(("refusals", identity, verb), value)
        # series that went (a queue without its label any more) are forgotten
        self._high, self._high_sums = seen, seen_sums
        return status

    def _view(self) -> Status:
        rows: Dict[str, List[int]] = {}
        other = [0] * (NCOUNTERS + len(STATES))
        wait = empty_snapshot(LATENCY_BUCKETS)
        lease = empty_snapshot(LATENCY_BUCKETS)
        fsync = empty_snapshot(FSYNC_BUCKETS)
        slot_moves = {"in": 0, "out": 0}
        refused: Dict[str, Dict[str, int]] = {}
        shards: List[ShardStatus] = []
        routers: List[RouterStatus] = []
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
            refused = _add(refused, counted.get("refusals", {}))
            shard_counts = [0] * NCOUNTERS
            for counts in [*counted.get("rows", {}).values(), counted.get("other", [0] * NCOUNTERS)]:
                for i in range(NCOUNTERS):
                    shard_counts[i] += counts[i]
            entry: ShardStatus = {
                "shard": index, "up": answer is not None,
                "pid": answer.get("pid") if answer else None,
                "counters": dict(zip(COUNTERS, shard_counts)),
                "log_records": counted.get("log_records", 0),
                "durable": bool((answer or process.last or {}).get("durable")),
                "history": bool((answer or process.last or {}).get("history")),
                "history_dropped": counted.get("history_dropped", 0),
                "history_unread_dropped": counted.get("history_unread_dropped", 0),
                "accepted": counted.get("accepted", 0),
                "bytes_received": counted.get("bytes_received", 0),
                "bytes_sent": counted.get("bytes_sent", 0),
            }
            if answer is not None:
                for gauge in SHARD_GAUGES:
                    entry[gauge] = answer.get(gauge, 0)
                totals["jobs"] += entry["jobs"]
                totals["queues"] += entry["queues"]
                totals["connections"] += entry["connections"]
            for counter in TRAFFIC_COUNTERS:
                totals[counter] += entry[counter]
            shards.append(entry)
        for index in sorted(self.routers):
            process = self._processes[("router", index)]
            counted = process.counters()
            answer = process.last if process.up else None
            router: RouterStatus = {"router": index, "up": answer is not None,
                                    "pid": answer.get("pid") if answer else None,
                                    "accepted": counted.get("accepted", 0),
                                    "bytes_received": counted.get("bytes_received", 0),
                                    "bytes_sent": counted.get("bytes_sent", 0)}
            if answer is not None:
                router["connections"] = answer.get("connections", 0)
                router["clients"] = answer.get("clients", 0)
                # linked to how many of the shards it should reach (a cluster's other hosts')
                router["shard_links_up"] = answer.get("shard_links_up", 0)
                router["shard_links"] = answer.get("shard_links", 0)
                router["link_frames_sent"] = answer.get("link_frames_sent", 0)
                router["link_frames"] = answer.get("link_frames", 0)
                totals["connections"] += router["connections"]
            refused = _add(refused, counted.get("refusals", {}))
            for counter in TRAFFIC_COUNTERS:
                totals[counter] += router[counter]
            routers.append(router)

        refused = _add(refused, own_refusals())   # this process's own: the HTTP port's (in the supervisor)

        # Labels: the chosen queues on their own, the rest (and "other") summed.
        held: Callable[[List[int]], int] = lambda row: sum(row[NCOUNTERS:])   # noqa: E731
        labelled = self.labels.choose({name: (row[0], held(row)) for name, row in rows.items()
                                       if name != OTHER})
        queues: Dict[str, QueueStatus] = {}
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
            "node": self.node, "version": __version__, "compiled": COMPILED, "why_pure": WHY_PURE,
            "uptime_seconds": round(time.monotonic() - self.started, 3),
            "shards": shards, "routers": routers, "totals": totals, "queues": queues,
            "histograms": {"wait_seconds": wait, "lease_seconds": lease, "fsync_seconds": fsync},
            "slot_moves": slot_moves, "refusals": refused,
        }


# ----------------------------------------------------------- Prometheus
#: prometheus_client leaves it unannotated: a float as Go prints it ("+Inf", "0.005")
_go_float: Callable[[float], str] = floatToGoString


def _buckets(snapshot: Snapshot) -> List[Tuple[str, int]]:
    """Per-bucket counts -> Prometheus's cumulative ``(le, count)`` pairs, +Inf last."""
    out: List[Tuple[str, int]] = []
    running = 0
    for bound, count in zip(snapshot["bounds"], snapshot["counts"]):
        running += count
        out.append((_go_float(bound), running))
    running += sum(snapshot["counts"][len(snapshot["bounds"]):])
    out.append(("+Inf", running))
    return out


def families(status: Status) -> List[Metric]:
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

    def histogram(name: str, doc: str, snapshot: Snapshot) -> None:
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
    held = gauge("queueserver_queue_jobs", "Jobs held per queue and state.", ["queue", "state"])
    for name, queue in queues.items():
        for state in STATES:
            held.add_metric([node, name, state], queue["jobs"][state])
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
    relays = gauge("queueserver_tls_relays", "TLS connections whose TLS the shard terminated and "
                                             "relays, as plaintext, to where they are served.", ["shard"])
    tls_moves = counter("queueserver_tls_moves_total", "TLS 1.3 connections whose TLS the shard terminated "
                                                       "and handed on with the connection.", ["shard"])
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
            relays.add_metric([node, label], shard["tls_relays"])
            tls_moves.add_metric([node, label], shard["tls_moves"])
            if shard["durable"]:
                log_bytes.add_metric([node, label], shard["log_bytes"])
            if shard["history"]:
                history_bytes.add_metric([node, label], shard["history_bytes"])
                history_segments.add_metric([node, label], shard["history_segments"])
    moves = counter("queueserver_slot_moves_total", "Cluster slots moved in or out.", ["direction"])
    for direction in ("in", "out"):
        moves.add_metric([node, direction], status["slot_moves"][direction])
    refusals = counter("queueserver_access_refusals_total",
                       "Requests (and, verb connect, connections) refused by the access rules.",
                       ["identity", "verb"])
    for identity, verbs in sorted(status.get("refusals", {}).items()):
        for verb, count in sorted(verbs.items()):
            refusals.add_metric([node, identity, verb], count)
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
