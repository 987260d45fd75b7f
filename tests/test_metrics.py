"""``/metrics`` (Prometheus) and ``/status`` (JSON) of a node.

Real servers (2 shards, a data directory) do known work over workq, and a
scrape over real HTTP, parsed by prometheus_client's own parser, must show
exactly that work (polled until it does: answers may still be on their
way; nothing here is a timing assertion). Then: a shard killed or stopped
is reported down while the scrape still answers, the queue label cap,
``--no-metrics``, a metrics port in use, and the collector alone on fake
answers.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Dict, List, Optional, Tuple

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import queueserver
from queueserver.client import Client
from queueserver.metrics import FSYNC_BUCKETS, LATENCY_BUCKETS, MAX_QUEUE_LABELS
from queueserver.metrics.collect import NodeCollector, NodeView, families
from queueserver.metrics.control import ask
from queueserver.placement import shard_for

from serverproc import ServerProcess, http_get, one_line_error, run_cli, wait_for

Samples = Dict[str, Dict[Tuple[Tuple[str, str], ...], float]]


# ------------------------------------------------------------------ helpers
def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


get = http_get


def scrape(proc: ServerProcess) -> Samples:
    return parse(get(proc, "/metrics").decode())


def status(proc: ServerProcess) -> Dict[str, Any]:
    return json.loads(get(proc, "/status"))


def by(samples: Samples, name: str, label: str, **where: str) -> Dict[str, float]:
    """``name``'s values by the value of ``label`` (summed over other labels)."""
    out: Dict[str, float] = {}
    for labels, value in samples.get(name, {}).items():
        labels = dict(labels)
        if all(labels.get(k) == v for k, v in where.items()):
            out[labels[label]] = out.get(labels[label], 0) + value
    return out


def one(samples: Samples, name: str, **where: str) -> float:
    values = [value for labels, value in samples.get(name, {}).items()
              if all(dict(labels).get(k) == v for k, v in where.items())]
    assert len(values) == 1, (name, where, samples.get(name))
    return values[0]


def settle(proc: ServerProcess, check, what: str, timeout: float = 20.0) -> Samples:
    """Scrape until ``check(samples)`` holds (answers may still be in flight)."""
    last: List[Any] = [None]

    def ok() -> bool:
        last[0] = scrape(proc)
        return bool(check(last[0]))

    wait_for(ok, timeout, lambda: f"{what}; last scrape:\n{last[0]}")
    return last[0]


def queues_on_both_shards(prefix: str, count: int = 3) -> List[str]:
    names, i = [], 0
    while len(names) < count or {shard_for(n, 2) for n in names} != {0, 1}:
        names = names[1:] if len(names) == count else names
        names.append(f"{prefix}-{i}")
        i += 1
    return names


def new_id() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------- the work done
@pytest.fixture()
def durable(tmp_path):
    proc = ServerProcess(shards=2, protocols=["workq"], extra=["--data-dir", str(tmp_path / "data"),
                                                               "--fsync", "always"])
    with proc:
        yield proc


def test_metrics_and_status_show_exactly_the_work_done(durable):
    proc = durable
    queues = queues_on_both_shards("work")
    expired_queue = "work-ttl"
    counts = {q: {"added": 0, "leased": 0, "completed": 0, "failed": 0} for q in queues}
    with Client("127.0.0.1", proc.port("workq")) as client:
        for q in queues:
            pipe = client.pipeline()
            for _ in range(10):
                pipe.add(new_id(), q, b"payload", 60_000, 600_000)
            assert pipe.execute() == [None] * 10
            counts[q]["added"] = 10
        client.add(new_id(), expired_queue, b"short-lived", 60_000, 300)   # expires in 300 ms
        leased = []
        for q, n in zip(queues, (7, 7, 6)):
            for _ in range(n):
                leased.append((q, client.lease(q, 5000).id))
            counts[q]["leased"] = n
        for q, id in leased[:15]:
            client.complete(id, b"done")
            counts[q]["completed"] += 1
        for q, id in leased[15:18]:
            client.fail(id, b"broken")       # no fails allowed: it fails for good
            counts[q]["failed"] += 1
        # leased[18:] stay leased

    def matches(s: Samples) -> bool:
        for key in ("added", "leased", "completed", "failed"):
            got = by(s, f"queueserver_jobs_{key}_total", "queue")
            want = {q: c[key] for q, c in counts.items()}
            want[expired_queue] = 1 if key == "added" else 0
            if any(got.get(q, 0) != v for q, v in want.items()) or sum(got.values()) != sum(want.values()):
                return False
        return by(s, "queueserver_jobs_expired_total", "queue").get(expired_queue) == 1

    s = settle(proc, matches, "the counters of the work done")
    assert sum(by(s, "queueserver_jobs_expired_total", "queue").values()) == 1
    # histograms: a wait per lease, a lease time per completion or failure
    assert one(s, "queueserver_wait_seconds_count") == 20
    assert one(s, "queueserver_lease_seconds_count") == 18
    assert one(s, "queueserver_wait_seconds_bucket", le="+Inf") == 20
    assert 0 <= one(s, "queueserver_wait_seconds_sum") < 60 * 20
    # the jobs held now, per queue and state
    for q, c in counts.items():
        states = by(s, "queueserver_queue_jobs", "state", queue=q)
        assert states == {"ready": 10 - c["leased"], "scheduled": 0,
                          "leased": c["leased"] - c["completed"] - c["failed"],
                          "finished": c["completed"] + c["failed"]}, (q, states)
    assert sum(by(s, "queueserver_queue_jobs", "queue", queue=expired_queue).values()) == 0
    assert by(s, "queueserver_jobs", "shard") == {
        str(i): sum(10 for q in queues if shard_for(q, 2) == i) for i in (0, 1)}
    assert by(s, "queueserver_shard_up", "shard") == {"0": 1, "1": 1}
    # the log
    assert one(s, "queueserver_fsync_seconds_count") > 0
    assert one(s, "queueserver_fsync_seconds_bucket", le="+Inf") == one(s, "queueserver_fsync_seconds_count")
    assert all(v > 0 for v in by(s, "queueserver_log_bytes", "shard").values())
    assert set(by(s, "queueserver_log_bytes", "shard")) == {"0", "1"}
    assert all(v > 0 for v in by(s, "queueserver_log_records_total", "shard").values())
    # client traffic
    assert one(s, "queueserver_connections_accepted_total") >= 1
    assert one(s, "queueserver_bytes_received_total") > 0
    assert one(s, "queueserver_bytes_sent_total") > 0
    assert by(s, "queueserver_slot_moves_total", "direction") == {"in": 0, "out": 0}
    # every sample is of this node
    assert {dict(labels)["node"] for series in s.values() for labels in series} == {"local"}

    # /status: the same numbers
    doc = status(proc)
    assert doc["node"] == "local" and doc["version"] and doc["uptime_seconds"] >= 0
    # compiled or plain, and why: as this process (same install, same environment) decided
    assert (doc["compiled"], doc["why_pure"]) == (queueserver.COMPILED, queueserver.WHY_PURE)
    totals = doc["totals"]
    assert [totals[k] for k in ("added", "leased", "completed", "failed", "expired")] == [31, 20, 15, 3, 1]
    for q, c in counts.items():
        assert {k: doc["queues"][q]["counters"][k] for k in c} == c
    assert [shard["up"] for shard in doc["shards"]] == [True, True]
    assert sum(shard["jobs"] for shard in doc["shards"]) == 30
    assert all(shard["log_bytes"] > 0 and shard["counters"]["added"] > 0 for shard in doc["shards"])
    assert doc["routers"][0]["up"] and doc["routers"][0]["accepted"] >= 1
    assert doc["totals"]["bytes_sent"] >= one(s, "queueserver_bytes_sent_total") > 0


def test_connections_gauge_counts_open_clients(durable):
    proc = durable
    queues = queues_on_both_shards("conn")
    clients = [Client("127.0.0.1", proc.port("workq")) for _ in range(3)]
    try:
        for i, client in enumerate(clients):   # each served somewhere (a router or, moved, a shard)
            client.add(new_id(), queues[i % len(queues)], b"x", 60_000, 600_000)
        settle(proc, lambda s: one(s, "queueserver_connections") == 3, "3 connections")
        s = scrape(proc)
        assert one(s, "queueserver_connections_accepted_total") >= 3
    finally:
        for client in clients:
            client.close()
    s = settle(proc, lambda s: one(s, "queueserver_connections") == 0, "no connections")
    assert one(s, "queueserver_connections_accepted_total") >= 3


def test_other_paths_are_404_and_control_sockets_are_private(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    with ServerProcess(shards=2, protocols=["workq"], runtime_dir=str(rt)) as proc:
        with pytest.raises(urllib.error.HTTPError) as err:
            get(proc, "/nothing")
        assert err.value.code == 404
        assert get(proc, "/metrics?name[]=x").startswith(b"# HELP")
        names = sorted(n for n in os.listdir(rt) if n.endswith(".ctl"))
        assert names == ["router-0.ctl", "shard-0.ctl", "shard-1.ctl"]
        for name in names:
            assert os.stat(rt / name).st_mode & 0o777 == 0o600
        answer = ask(str(rt / "shard-1.ctl"))
        assert answer["kind"] == "shard" and answer["index"] == 1
        with socket.socket(socket.AF_UNIX) as sock:   # anything but ["stats"] is an error answer
            sock.connect(str(rt / "router-0.ctl"))
            sock.sendall(b"\x91\xa4ping")
            assert b"error" in sock.recv(4096)
        with open(rt / "ports.json") as f:
            assert json.load(f)["metrics"] == proc.ports["metrics"]
    assert not [n for n in os.listdir(rt) if n.endswith(".ctl")]   # removed at exit


# ------------------------------------------------------- a shard that is down
def test_a_killed_shard_is_down_while_the_scrape_answers():
    with ServerProcess(shards=2, protocols=["workq"]) as proc:
        queues = queues_on_both_shards("kill")
        with Client("127.0.0.1", proc.port("workq")) as client:
            for q in queues:
                client.add(new_id(), q, b"x", 60_000, 600_000)
        before = settle(proc, lambda s: sum(by(s, "queueserver_jobs_added_total", "queue").values()) == 3,
                        "3 jobs added")
        pid = proc.child_pids()["shard-1"]
        os.kill(pid, signal.SIGKILL)
        seen: List[Samples] = []

        def down() -> bool:
            seen.append(scrape(proc))
            return by(seen[-1], "queueserver_shard_up", "shard").get("1") == 0

        wait_for(down, 30, "shard 1 reported down")
        s = seen[-1]
        assert by(s, "queueserver_shard_up", "shard")["0"] == 1
        assert "1" not in by(s, "queueserver_jobs", "shard")   # its gauges are left out...
        # ...its counters are not: the node's counters never go back
        assert by(s, "queueserver_jobs_added_total", "queue") == by(before, "queueserver_jobs_added_total",
                                                                    "queue")
        # the supervisor restarts it; it is up again, its counters carried on
        s = settle(proc, lambda s: by(s, "queueserver_shard_up", "shard").get("1") == 1, "shard 1 up again")
        assert sum(by(s, "queueserver_jobs_added_total", "queue").values()) == 3
        assert proc.child_pids()["shard-1"] != pid


def test_a_stopped_shard_does_not_hold_the_scrape():
    with ServerProcess(shards=2, protocols=["workq"]) as proc:
        pid = proc.child_pids()["shard-0"]
        os.kill(pid, signal.SIGSTOP)   # alive, never answers
        try:
            started = time.monotonic()
            s = scrape(proc)
            took = time.monotonic() - started
            assert by(s, "queueserver_shard_up", "shard") == {"0": 0, "1": 1}
            assert took < 10, took     # a generous bound: the ask gives up after 1 s
        finally:
            os.kill(pid, signal.SIGCONT)
        settle(proc, lambda s: by(s, "queueserver_shard_up", "shard") == {"0": 1, "1": 1}, "both up")


# ------------------------------------------------------------ the label cap
def test_at_most_100_queue_labels_and_other_holds_the_rest():
    with ServerProcess(shards=2, protocols=["workq"]) as proc:
        names = [f"cap-{i:03d}" for i in range(150)]
        with Client("127.0.0.1", proc.port("workq")) as client:
            pipe = client.pipeline()
            for i, name in enumerate(names):
                for _ in range(1 + i % 4):
                    pipe.add(new_id(), name, b"x", 60_000, 600_000)
            total = len(pipe)
            assert pipe.execute() == [None] * total
        s = settle(proc, lambda s: sum(by(s, "queueserver_jobs_added_total", "queue").values()) == total,
                   "every add counted")
        added = by(s, "queueserver_jobs_added_total", "queue")
        assert len(added) == MAX_QUEUE_LABELS + 1 and "other" in added
        assert set(added) - {"other"} <= set(names)
        # the busiest got labels: every labelled queue added at least as many as any in "other"
        per_queue = {name: 1 + i % 4 for i, name in enumerate(names)}
        unlabelled = [per_queue[n] for n in names if n not in added]
        assert added["other"] == sum(unlabelled)
        assert min(added[n] for n in added if n != "other") >= max(unlabelled)
        ready = by(s, "queueserver_queue_jobs", "queue", state="ready")
        assert set(ready) == set(added) and sum(ready.values()) == total
        # stable: the same labels at the next scrape
        assert set(by(scrape(proc), "queueserver_jobs_added_total", "queue")) == set(added)


# ----------------------------------------------------------- off, and in use
def test_no_metrics_serves_no_port_and_counts_nothing():
    with ServerProcess(shards=1, protocols=["workq"], extra=["--no-metrics"], log_level="debug") as proc:
        assert "metrics" not in proc.ports
        with Client("127.0.0.1", proc.port("workq")) as client:
            client.add(new_id(), "q", b"x", 60_000, 600_000)
        assert "metrics on http" not in proc.log()
        assert "--no-metrics" in proc.child_argv("shard-0")   # no per-event hooks in the shard


def test_a_metrics_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--runtime-dir", str(tmp_path / "rt"), "--shards", "1",
                         "--workq-port", "0", "--no-takeanumber", "--no-goqueue", "--no-queued",
                         "--no-taskflux", "--metrics-port", str(port))
        line = one_line_error(result)
    assert line.endswith(f"cannot listen for metrics on 127.0.0.1:{port}: address already in use "
                         f"(another server running? pick another port with --metrics-port)")


# ------------------------------------------------- the collector, on its own
def shard_answer(index: int, rows: Dict[str, List[int]], pid: int = 100, other: Optional[List[int]] = None,
                 **more: Any) -> Dict[str, Any]:
    """A shard's control answer: rows are [added, leased, completed, failed,
    expired, ready, scheduled, leased now, finished]."""
    answer = {"kind": "shard", "index": index, "pid": pid + index, "started": 1.0,
              "jobs": sum(sum(r[5:]) for r in rows.values()), "queues": len(rows),
              "rows": rows, "other": other or [0] * 9,
              "wait": {"bounds": list(LATENCY_BUCKETS), "counts": [1] + [0] * len(LATENCY_BUCKETS),
                       "sum": 0.0005},
              "lease": {"bounds": list(LATENCY_BUCKETS), "counts": [0] * (len(LATENCY_BUCKETS) + 1),
                        "sum": 0.0},
              "fsync": {"bounds": list(FSYNC_BUCKETS), "counts": [0, 2] + [0] * (len(FSYNC_BUCKETS) - 1),
                        "sum": 0.0003},
              "durable": True, "log_bytes": 1000 + index, "log_records": 10, "slots_owned": 0,
              "slot_moves": {"in": 0, "out": 0}, "connections": 1, "accepted": 0,
              "bytes_received": 5, "bytes_sent": 7}
    answer.update(more)
    return answer


def router_answer(pid: int = 50, **more: Any) -> Dict[str, Any]:
    answer = {"kind": "router", "index": 0, "pid": pid, "started": 1.0, "clients": 3, "connections": 2,
              "accepted": 9, "bytes_received": 100, "bytes_sent": 200}
    answer.update(more)
    return answer


class FakeNode:
    """The processes' answers, changed by the test between scrapes."""

    def __init__(self, cap: int = MAX_QUEUE_LABELS) -> None:
        self.answers: Dict[Any, Optional[Dict[str, Any]]] = {}
        self.view = NodeView("n1", {0: "s0", 1: "s1"}, {0: "r0"}, asker=self.ask, cap=cap)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(self.view))

    def ask(self, paths, timeout):
        return {key: self.answers.get(key) for key in paths}

    def scrape(self) -> Samples:
        return parse(generate_latest(self.registry).decode())


def test_collector_adds_up_the_processes_answers():
    node = FakeNode()
    node.answers = {("shard", 0): shard_answer(0, {"a": [5, 4, 3, 1, 0, 1, 0, 0, 4]}),
                    ("shard", 1): shard_answer(1, {"b": [2, 2, 2, 0, 1, 0, 0, 0, 1]}),
                    ("router", 0): router_answer()}
    s = node.scrape()
    assert by(s, "queueserver_jobs_added_total", "queue") == {"a": 5, "b": 2, "other": 0}
    assert by(s, "queueserver_jobs_expired_total", "queue") == {"a": 0, "b": 1, "other": 0}
    assert by(s, "queueserver_queue_jobs", "state", queue="a") == {"ready": 1, "scheduled": 0, "leased": 0,
                                                                   "finished": 4}
    assert one(s, "queueserver_wait_seconds_count") == 2
    assert one(s, "queueserver_wait_seconds_bucket", le="0.001") == 2
    assert one(s, "queueserver_fsync_seconds_count") == 4
    assert one(s, "queueserver_connections") == 1 + 1 + 2
    assert one(s, "queueserver_connections_accepted_total") == 9
    assert one(s, "queueserver_bytes_received_total") == 5 + 5 + 100
    assert by(s, "queueserver_log_bytes", "shard") == {"0": 1000, "1": 1001}
    assert by(s, "queueserver_shard_up", "shard") == {"0": 1, "1": 1}
    assert {dict(labels)["node"] for series in s.values() for labels in series} == {"n1"}
    doc = node.view.gather()
    assert doc["totals"]["added"] == 7 and doc["queues"]["a"]["counters"]["failed"] == 1


def test_collector_a_down_shard_keeps_its_counters_and_a_restart_continues_them():
    node = FakeNode()
    node.answers = {("shard", 0): shard_answer(0, {"a": [5, 5, 5, 0, 0, 0, 0, 0, 5]}),
                    ("shard", 1): shard_answer(1, {"b": [3, 0, 0, 0, 0, 3, 0, 0, 0]}),
                    ("router", 0): router_answer()}
    node.scrape()
    node.answers[("shard", 1)] = None   # down
    s = node.scrape()
    assert by(s, "queueserver_shard_up", "shard") == {"0": 1, "1": 0}
    assert by(s, "queueserver_jobs_added_total", "queue")["b"] == 3
    assert "1" not in by(s, "queueserver_jobs", "shard")
    assert by(s, "queueserver_queue_jobs", "queue", state="ready").get("b", 0) == 0
    # back as a new process, counting from zero again
    node.answers[("shard", 1)] = shard_answer(1, {"b": [1, 0, 0, 0, 0, 4, 0, 0, 0]}, pid=999)
    node.answers[("router", 0)] = router_answer(pid=51, accepted=1)   # the router restarted too
    s = node.scrape()
    assert by(s, "queueserver_jobs_added_total", "queue")["b"] == 4
    assert one(s, "queueserver_connections_accepted_total") == 10
    assert one(s, "queueserver_wait_seconds_count") == 3   # 1 + 1 of the old incarnation + 1 new


def test_collector_keeps_counters_from_going_back():
    node = FakeNode()
    node.answers = {("shard", 0): shard_answer(0, {"a": [5, 3, 0, 0, 0, 2, 0, 3, 0]}),
                    ("shard", 1): shard_answer(1, {}), ("router", 0): router_answer()}
    assert by(node.scrape(), "queueserver_jobs_leased_total", "queue")["a"] == 3
    node.answers[("shard", 0)] = shard_answer(0, {"a": [5, 2, 0, 0, 0, 3, 0, 2, 0]})   # an unlease
    assert by(node.scrape(), "queueserver_jobs_leased_total", "queue")["a"] == 3
    node.answers[("shard", 0)] = shard_answer(0, {"a": [5, 4, 0, 0, 0, 1, 0, 4, 0]})
    assert by(node.scrape(), "queueserver_jobs_leased_total", "queue")["a"] == 4


def test_collector_caps_queue_labels_and_keeps_them_stable():
    node = FakeNode(cap=3)
    rows = {f"q{i}": [10 * i, 0, 0, 0, 0, 10 * i, 0, 0, 0] for i in range(1, 7)}
    node.answers = {("shard", 0): shard_answer(0, rows), ("shard", 1): shard_answer(1, {}),
                    ("router", 0): router_answer()}
    added = by(node.scrape(), "queueserver_jobs_added_total", "queue")
    assert added == {"q6": 60, "q5": 50, "q4": 40, "other": 60}
    # q1 grows past the smallest labelled one, but not twice past: labels stay
    rows["q1"][0] = 45
    added = by(node.scrape(), "queueserver_jobs_added_total", "queue")
    assert set(added) == {"q6", "q5", "q4", "other"} and added["other"] == 45 + 20 + 30
    # far busier: it takes the place of the least busy labelled queue; sums stay exact
    rows["q1"][0] = 200
    added = by(node.scrape(), "queueserver_jobs_added_total", "queue")
    assert set(added) == {"q6", "q5", "q1", "other"}
    assert sum(added.values()) == sum(r[0] for r in rows.values())
    # a real queue named "other" is summed into other
    rows["other"] = [7, 0, 0, 0, 0, 0, 0, 0, 0]
    added = by(node.scrape(), "queueserver_jobs_added_total", "queue")
    assert added["other"] == 40 + 20 + 30 + 7


def test_families_of_an_empty_node():
    view = NodeView(None, {0: "s0"}, {0: "r0"}, asker=lambda paths, timeout: {})
    names = {family.name for family in families(view.gather())}
    assert {"queueserver_jobs_added", "queueserver_queue_jobs", "queueserver_wait_seconds",
            "queueserver_lease_seconds", "queueserver_connections", "queueserver_fsync_seconds",
            "queueserver_shard_up", "queueserver_jobs", "queueserver_slots_owned",
            "queueserver_slot_moves", "queueserver_log_bytes", "queueserver_log_records"} <= names
    assert view.gather()["node"] == "local"
