"""``make bench-cluster``: what running as a cluster costs per job, on this machine.

Why: ``bench.py`` measures one server. A cluster adds a hop whenever a
client's queue lives on another node (its router forwards the request over
an authenticated TCP link instead of handing the connection to a local
shard), and only a measurement says what that hop costs and how the
aggregate grows with nodes. Two parts, one report:

1. *The cross-node hop.* Two nodes of one shard each. Full job cycles
   (add + lease + complete over workq, as ``bench.py`` workload (1)) driven
   through node a's router against queues node a's shard serves (local: the
   direct path hands the connection to the shard) and queues node b's shard
   serves (remote: a's router forwards over TCP); cycles/s and the server CPU
   per cycle summed over every process of both nodes. The difference is the
   hop's cost. For reference the same with ``--no-direct-path`` on both
   nodes, which splits it into "through the router" and "over the link".
2. *Aggregate cycles/s for 1, 2, 3 and 5 nodes* of one shard each, load
   spread over the nodes' routers, each load process talking to its own node
   about queues its node serves (with job ids at home on it); one row of 3
   nodes with random job ids (claimed at their homes), and one whose queues
   are spread over all slots, so most requests cross nodes. Beside CPU,
   each row counts the link frames every process sent per cycle: messaging
   that cannot hide behind the machine's few cores. On a small machine the
   nodes fight for its cores, so the CPU per cycle (which carries over to
   real hosts) is reported beside cycles/s, with a projection from it.

Each row runs ``--repeat`` times (default 3), the rows of one cluster taking
turns so that a noisy moment does not fall on one row only, and the median
run is reported. Everything runs on loopback (nodes on 127.0.0.1/.2/.3 as the cluster tests
run them, via ``tests/cluster_nodes.py``; client ports bound on 127.0.0.1,
where ``loadgen.py`` connects), with the same load generator as ``bench.py``.
A node needs a data directory; they go in one temporary directory with
``--fsync never`` so the disk does not dominate (the job history is on, as by
default with a data directory). Every node started is stopped (on error,
Ctrl-C or SIGTERM too) and the directory removed; the figures are printed
and written as JSON (``--json``, default ``loadtests/results/cluster-<UTC
time>.json``).

    .venv/bin/python loadtests/cluster_bench.py [--seconds 5] [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))   # the cluster harness the tests use

import bench  # noqa: E402
import loadgen  # noqa: E402
from cluster_nodes import Nodes, ensure_loopback_aliases  # noqa: E402
from serverproc import http_get  # noqa: E402
from loadgen import CYCLE, LoadResult, LoadSpec  # noqa: E402
from queueserver import __version__  # noqa: E402
from queueserver.client import Client  # noqa: E402
from queueserver.placement import initial_owners, slot_of  # noqa: E402

FSYNC = "never"
READY_TIMEOUT = 30.0      # every router reaches every shard within this after the nodes start

#: Part 1's rows: (key, label, direct path, the shard ordinal its queues are on).
HOP_CASES = (
    ("local", "local: a's shard, direct path", True, 0),
    ("remote", "remote: b's shard, a's router forwards over TCP", True, 1),
    ("local_no_direct", "local, --no-direct-path: through a's router", False, 0),
    ("remote_no_direct", "remote, --no-direct-path", False, 1),
)
#: Part 2's rows: (key, nodes, queues: "own" (each node's clients on its own
#: shard's queues, with job ids at home there too), "own, any id" (random
#: job ids: most adds claim their id at another node) or "all slots").
SCALE_CASES = (("1_own", 1, "own"), ("2_own", 2, "own"), ("3_own", 3, "own"), ("5_own", 5, "own"),
               ("3_any_id", 3, "own, any id"), ("3_spread", 3, "all slots"))
#: The clusters started, in order: (nodes, direct path, the rows measured on it, taking turns).
PLAN = (
    (2, True, (("hop", "local"), ("hop", "remote"), ("scale", "2_own"))),
    (2, False, (("hop", "local_no_direct"), ("hop", "remote_no_direct"))),
    (1, True, (("scale", "1_own"),)),
    (3, True, (("scale", "3_own"), ("scale", "3_any_id"), ("scale", "3_spread"))),
    (5, True, (("scale", "5_own"),)),
)


# ---------------------------------------------------------------- the cluster
@dataclass
class NamedSpec(LoadSpec):
    """A load spec whose queues are the names given (workq: one per
    connection), chosen by which shard serves them, aimed at one node."""

    names: List[bytes] = field(default_factory=list)
    node: str = ""

    def queue_names(self) -> List[bytes]:
        return list(self.names)


def names_on(ordinals: Sequence[int], count: int, founders: int, prefix: str) -> List[bytes]:
    """``count`` queue names, the i-th in a slot a new cluster of ``founders``
    shards gives to ``ordinals[i % len(ordinals)]``."""
    owners = initial_owners(founders)
    names: List[bytes] = []
    k = 0
    while len(names) < count:
        name = f"{prefix}-{k}"
        k += 1
        if owners[slot_of(name)] == ordinals[len(names) % len(ordinals)]:
            names.append(name.encode())
    return names


class Cluster:
    """``nodes`` nodes of one shard each (a, b, c: ordinals 0, 1, 2), workq
    only, client ports on 127.0.0.1; a context manager that stops them all."""

    def __init__(self, root: Path, nodes: int, direct_path: bool) -> None:
        root.mkdir()
        self.size = nodes
        self.direct_path = direct_path
        self.nodes = Nodes(root, shards=(1,) * nodes, protocols=["workq"],
                           extra=["--fsync", FSYNC, "--bind", "127.0.0.1",
                                  "--direct-path" if direct_path else "--no-direct-path"])

    def __enter__(self) -> "Cluster":
        try:
            self.nodes.start()
            self._wait_linked()
        except BaseException:
            self.nodes.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.nodes.stop()

    def port(self, node: str) -> int:
        return self.nodes.procs[node].port("workq")

    def pids(self) -> Dict[str, int]:
        """``node/role`` -> pid of every process of every node: supervisor, router, shard."""
        pids: Dict[str, int] = {}
        for name, proc in self.nodes.procs.items():
            children = proc.child_pids()
            if sorted(children) != ["router", "shard-0"]:
                raise RuntimeError(f"node {name}: expected a router and one shard, found {children}")
            pids[f"{name}/supervisor"] = proc.pid
            pids.update({f"{name}/{role}": pid for role, pid in children.items()})
        return pids

    def link_frames(self) -> int:
        """Link frames sent so far by every router and shard of every node
        (their /status): what the cluster spends on messages between its
        processes, whatever the cores."""
        total = 0
        for proc in self.nodes.procs.values():
            status = json.loads(http_get(proc, "/status"))
            total += sum(entry.get("link_frames_sent", 0) for entry in status["shards"] + status["routers"])
        return total

    def _wait_linked(self) -> None:
        """A job cycle through every router on every shard: the nodes start
        one after the other, so a router may not have its links yet."""
        deadline = time.monotonic() + READY_TIMEOUT
        for node in self.nodes.names:
            for ordinal in range(self.size):
                name = names_on([ordinal], 1, self.size, f"probe-{uuid.uuid4().hex[:8]}")[0].decode()
                while True:
                    try:
                        with Client("127.0.0.1", self.port(node), timeout=5) as client:
                            job_id = str(uuid.uuid4())
                            client.add(job_id, name, b"probe", 60_000, 60_000)
                            client.complete(client.lease(name, 1000).id)
                        break
                    except Exception as err:   # not linked yet: ask again until the deadline
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"node {node}'s router did not serve a queue of shard "
                                               f"{ordinal} within {READY_TIMEOUT:g} s: {err}") from None
                        time.sleep(0.1)


# ---------------------------------------------------------------- load
def run_together(specs: Sequence[LoadSpec],
                 on_start: Callable[[int], None] = lambda start_ns: None) -> Tuple[LoadResult, List[LoadResult]]:
    """``loadgen.run`` for several targets at once (it drives one port): every
    target's workers start at the same instant and measure the same window,
    so their cycles add up to the cluster's. The sum, and each target's."""
    ctx = mp.get_context("fork")
    workers: List[Tuple[int, Any, Any]] = []      # (target, process, pipe)
    try:
        for k, spec in enumerate(specs):
            spec.check()
            procs = min(spec.procs, spec.connections)
            for p in range(procs):
                parent, child = ctx.Pipe()
                indices = list(range(p, spec.connections, procs))
                proc = ctx.Process(target=loadgen._worker_main,
                                   args=(spec, indices, spec.max_ops // procs, child), daemon=True)
                workers.append((k, proc, parent))
                proc.start()
                child.close()
        for _, _, pipe in workers:
            kind, body = loadgen._receive(pipe, 60.0)
            if kind != "ready":
                raise RuntimeError(f"load generator worker failed to connect: {body}")
        start_ns = time.monotonic_ns() + 50_000_000
        for _, _, pipe in workers:
            pipe.send(start_ns)
        on_start(start_ns)
        limit = max(s.warmup + s.duration for s in specs) + loadgen.GRACE + 30.0
        parts = [LoadResult(spec=s, seconds=s.duration) for s in specs]
        samples = [(array("q"), array("q")) for _ in specs]
        for k, _, pipe in workers:
            kind, body = loadgen._receive(pipe, limit)
            if kind != "done":
                raise RuntimeError(f"load generator worker failed: {body}")
            r = parts[k]
            r.ops += body["ops"]
            r.requests += body["requests"]
            r.errors += body["errors"]
            r.total_ops += body["total_ops"]
            r.loadgen_cpu_s += body["cpu"]
            samples[k][0].frombytes(body["latency"])
            samples[k][1].frombytes(body["cycle_latency"])
        total = LoadResult(spec=specs[0], seconds=specs[0].duration)
        every, every_cycle = array("q"), array("q")
        for r, (latency, cycle_latency) in zip(parts, samples):
            r.latency_us = loadgen.percentiles(latency)
            r.cycle_latency_us = loadgen.percentiles(cycle_latency)
            every.extend(latency)
            every_cycle.extend(cycle_latency)
            for key in ("ops", "requests", "errors", "total_ops", "loadgen_cpu_s"):
                setattr(total, key, getattr(total, key) + getattr(r, key))
        total.latency_us = loadgen.percentiles(every)
        total.cycle_latency_us = loadgen.percentiles(every_cycle)
        return total, parts
    finally:
        for _, proc, pipe in workers:
            pipe.close()
            if proc.pid is None:
                continue
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def measure(cluster: Cluster, specs: Sequence[NamedSpec], opts: argparse.Namespace) -> Dict[str, Any]:
    """Prefill each target's queues, run them together, and take the CPU
    every process of every node spent (supervisors included) per cycle."""
    started = time.monotonic()
    for spec in specs:
        accepted = loadgen.prefill(spec, opts.prefill_per_queue * len(spec.names))
        if accepted != opts.prefill_per_queue * len(spec.names):
            raise RuntimeError(f"node {spec.node} accepted {accepted} of the prefill's jobs")
    prefill_s = time.monotonic() - started
    pids = cluster.pids()
    before = {role: bench.cpu_seconds(pid) for role, pid in pids.items()}
    started = time.monotonic()
    window = FrameWindow(cluster, specs[0].warmup, specs[0].duration)
    total, parts = run_together(specs, window.start)
    run_s = time.monotonic() - started
    after = {role: bench.cpu_seconds(pid) for role, pid in pids.items()}
    frames = window.frames()
    cycles = max(1, total.total_ops)
    per = {role: (after[role] - before[role]) / cycles * 1e6 for role in pids}
    out = bench._result_dict(total)

    def part(kind: str) -> float:
        return sum(v for role, v in per.items() if role.endswith(kind))
    out.update(cpu_us_per_cycle=per, server_us_per_cycle=sum(per.values()),
               router_us_per_cycle=part("/router"), shard_us_per_cycle=part("/shard-0"),
               supervisor_us_per_cycle=part("/supervisor"),
               loadgen_cpu_us_per_cycle=total.loadgen_cpu_s / cycles * 1e6,
               per_node_ops_per_s={s.node: r.ops_per_s for s, r in zip(specs, parts)},
               remote_share=_remote_share(cluster, specs), pids=pids,
               link_frames=frames, link_frames_per_cycle=frames / max(1, total.ops),
               prefill_s=prefill_s, run_s=run_s)
    return out


class FrameWindow:
    """Link frames sent over the measured window only (connections opening
    and closing around it are not job traffic): read from every node's
    /status when the window opens and when it closes, from a thread."""

    def __init__(self, cluster: Cluster, warmup: float, duration: float) -> None:
        self.cluster, self.warmup, self.duration = cluster, warmup, duration
        self.readings: List[int] = []
        self._thread: Optional[threading.Thread] = None

    def start(self, start_ns: int) -> None:
        self._thread = threading.Thread(target=self._read, args=(start_ns,), daemon=True)
        self._thread.start()

    def _read(self, start_ns: int) -> None:
        for at in (start_ns + self.warmup * 1e9, start_ns + (self.warmup + self.duration) * 1e9):
            time.sleep(max(0.0, (at - time.monotonic_ns()) / 1e9))
            self.readings.append(self.cluster.link_frames())

    def frames(self) -> int:
        if self._thread is not None:
            self._thread.join(30)
        if len(self.readings) != 2:
            raise RuntimeError("the link frame counts could not be read around the measured window")
        return self.readings[1] - self.readings[0]


def _remote_share(cluster: Cluster, specs: Sequence[NamedSpec]) -> float:
    """The share of the connections whose queue another node's shard serves."""
    owners = initial_owners(cluster.size)
    remote = total = 0
    for spec in specs:
        mine = cluster.nodes.names.index(spec.node)
        for i in range(spec.connections):
            remote += owners[slot_of(spec.names[i % len(spec.names)].decode())] != mine
            total += 1
    return remote / total if total else 0.0


def _spec(cluster: Cluster, node: str, names: List[bytes], connections: int, procs: int,
          opts: argparse.Namespace, home: Optional[int] = None) -> NamedSpec:
    """``home``: job ids all at home on that shard (None: any id)."""
    slots = None if home is None else frozenset(
        slot for slot, owner in enumerate(initial_owners(cluster.size)) if owner == home)
    return NamedSpec(protocol="workq", port=cluster.port(node), workload=CYCLE, connections=connections,
                     procs=procs, warmup=opts.warmup, duration=opts.seconds, payload=opts.payload,
                     names=names, node=node, id_slots=slots)


def specs_for(cluster: Cluster, part: str, key: str, opts: argparse.Namespace, prefix: str) -> List[NamedSpec]:
    """The load of one row on ``cluster``, on fresh queues named ``prefix-…``.

    hop: all connections on node a's router, on the shard the case names.
    scale: each node gets ``--connections`` of its own (the load a node of
    the 1-node row gets, so that each node batches as that one does and its
    CPU per cycle projects to a host of its own), each node's on its
    own shard's queues (or, for a spread row, on every shard's in turn)."""
    if part == "hop":
        ordinal = next(o for k, _, _, o in HOP_CASES if k == key)
        names = names_on([ordinal], opts.connections, cluster.size, prefix)
        return [_spec(cluster, "a", names, opts.connections, opts.loadgen_procs, opts)]
    queues = next(q for k, _, q in SCALE_CASES if k == key)
    n = cluster.size
    specs = []
    for i, node in enumerate(cluster.nodes.names):
        connections = opts.connections
        ordinals = [(i + j) % n for j in range(n)] if queues == "all slots" else [i]
        specs.append(_spec(cluster, node, names_on(ordinals, connections, n, f"{prefix}-{node}"),
                           connections, max(1, opts.loadgen_procs // n), opts,
                           home=i if queues == "own" else None))
    return specs


# ---------------------------------------------------------------- report
class Report:
    """The figures by part and row, rendered as text and JSON."""

    def __init__(self, opts: argparse.Namespace, tmp: str) -> None:
        self.opts = opts
        self.runs: Dict[str, Dict[str, List[Any]]] = {"hop": {}, "scale": {}}   # a dict or an error per run
        fstype, device, mount = bench.filesystem_of(tmp)
        argv = [os.path.relpath(sys.executable) if sys.executable.startswith(REPO) else sys.executable,
                os.path.relpath(os.path.abspath(sys.argv[0]))] + sys.argv[1:]
        self.header = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "cores": bench.CORES, "cpu": bench.cpu_model(), "kernel": platform.release(),
            "python": platform.python_version(), "version": __version__,
            "command": " ".join(argv), "via_make": bool(os.environ.get("MAKELEVEL")),
            "data": {"fsync": FSYNC, "filesystem": fstype, "device": device, "mount": mount},
        }

    def run(self, part: str, key: str, measure_row: Callable[[], Dict[str, Any]]) -> None:
        """Measure one run of a row; a failure is kept as its message, not
        raised, so one row cannot hide the others."""
        _progress(f"{part} {key} ...")
        started = time.monotonic()
        try:
            result: Any = measure_row()
        except KeyboardInterrupt:
            raise
        except Exception as err:
            result = f"{type(err).__name__}: {err}"
        self.runs[part].setdefault(key, []).append(result)
        _progress(f"{part} {key} done in {time.monotonic() - started:.1f} s")

    def fail(self, part: str, keys: Sequence[str], err: Exception) -> None:
        for key in keys:
            self.runs[part].setdefault(key, []).append(f"{type(err).__name__}: {err}")

    def _get(self, part: str, key: str) -> Optional[Dict[str, Any]]:
        """A row's median run by server CPU per cycle (so its figures belong
        together), with every run's cycles/s and µs per cycle beside it."""
        runs = [r for r in self.runs[part].get(key, []) if isinstance(r, dict)]
        if not runs:
            return None
        ordered = sorted(runs, key=lambda r: r["server_us_per_cycle"])
        return dict(ordered[(len(ordered) - 1) // 2], runs=len(runs),
                    runs_ops_per_s=[r["ops_per_s"] for r in runs],
                    runs_server_us_per_cycle=[r["server_us_per_cycle"] for r in runs])

    def _status(self, part: str, key: str) -> str:
        return "failed" if self.runs[part].get(key) else "not run"

    def hop_costs(self) -> Dict[str, Optional[float]]:
        """µs of server CPU per cycle: remote − local (direct path), and its
        split with --no-direct-path: the router's own part and the link's."""
        def diff(a: str, b: str) -> Optional[float]:
            x, y = self._get("hop", a), self._get("hop", b)
            return x["server_us_per_cycle"] - y["server_us_per_cycle"] if x and y else None
        return {"hop_us_per_cycle": diff("remote", "local"),
                "router_us_per_cycle": diff("local_no_direct", "local"),
                "link_us_per_cycle": diff("remote_no_direct", "local_no_direct")}

    def render(self) -> str:
        h, o = self.header, self.opts
        fs = h["data"]
        lines = [
            f"queueserver cluster bench  {h['date']}  (queueserver {h['version']})",
            f"machine: {h['cores']} cores, {h['cpu']}, Linux {h['kernel']}, Python {h['python']}",
            f"command: {h['command']}" + ("   (run by `make bench-cluster`)" if h["via_make"] else ""),
            f"nodes: 1 shard + 1 router + supervisor each, on 127.0.0.1/.2/.3 (links authenticated TCP), "
            f"client ports on 127.0.0.1; data dirs on {fs['filesystem']} ({fs['mount']}) with --fsync "
            f"{FSYNC} (job history on, the default)",
            f"load: loadtests/loadgen.py workers, full cycles (add + lease + complete, {o.payload}-byte "
            f"payloads, one request in flight per connection, one queue per connection, "
            f"{o.prefill_per_queue} jobs prefilled per queue)",
            f"timing: {o.warmup:g} s warm-up + {o.seconds:g} s measured per run; server CPU = utime+stime of "
            "EVERY process of EVERY node (supervisors included, shown apart) over the run ÷ cycles",
            f"each row: the median of {o.repeat} run(s) by server µs/cycle (the rows of one cluster take turns); "
            "runs' µs = the lowest–highest of them",
            f"all on this machine's {h['cores']} cores: servers and load generator compete for them",
            "",
            f"(1) the cross-node hop: 2 nodes, load through node a's router only ({o.connections} connections, "
            f"{o.loadgen_procs} load processes)",
            bench.table(["case", "cycles/s", "req p50 µs", "req p99 µs", "a router", "a shard", "b router",
                         "b shard", "superv.", "server µs/cycle", "runs' µs", "loadgen µs/cycle", "errors"],
                        [self._hop_row(key, label) for key, label, _, _ in HOP_CASES]),
        ]
        costs = self.hop_costs()
        local, remote = self._get("hop", "local"), self._get("hop", "remote")
        if costs["hop_us_per_cycle"] is not None and local and remote:
            slower = 1 - remote["ops_per_s"] / local["ops_per_s"] if local["ops_per_s"] else 0.0
            lines.append(f"    hop cost = remote − local: {costs['hop_us_per_cycle']:+.1f} µs server CPU per cycle "
                         f"({costs['hop_us_per_cycle'] / 3:+.1f} µs per request, 3 requests per cycle); "
                         f"cycles/s {-slower:+.0%}")
            if remote["ops_per_s"] > local["ops_per_s"]:
                lines.append("    (remote has more cycles/s: with the direct path the local case runs in ONE process, "
                             "a's shard, the remote one in two, a's router and b's shard, which get both cores here)")
        if costs["router_us_per_cycle"] is not None and costs["link_us_per_cycle"] is not None:
            lines.append(f"    --no-direct-path split: through the router instead of the direct path "
                         f"{costs['router_us_per_cycle']:+.1f} µs/cycle; then over the TCP link to b instead of "
                         f"a's own shard {costs['link_us_per_cycle']:+.1f} µs/cycle")
        idle = local["cpu_us_per_cycle"].get("b/router") if local else None
        lines += [
            "    µs columns: CPU per cycle of that process; the server column sums all six processes",
        ]
        if idle is not None:
            lines.append(f"    b's router carries no client and spends {idle:.1f} µs/cycle in the local case: no "
                         "router hears of jobs it does not carry (ids are found at their home shard)")
        lines += [
            "",
            f"(2) aggregate, N nodes of 1 shard: {o.connections} connections on each node's router (the load of "
            f"the 1-node row, per node), max(1, {o.loadgen_procs} ÷ N) load processes per node",
            bench.table(["nodes", "queues", "remote", "cycles/s", "per node cycles/s", "req p99 µs",
                         "routers µs", "shards µs", "superv. µs", "server µs/cycle", "÷ 1 node", "runs' µs",
                         "link frames/cycle", "loadgen µs/cycle", "errors", "projected cycles/s", "÷ 1 node"],
                        [self._scale_row(key, n, queues) for key, n, queues in SCALE_CASES]),
        ]
        if h["cores"] <= 4:
            lines += [
                f"    THIS MACHINE HAS {h['cores']} CORES: every row is CPU-bound here (5 nodes = 15 server "
                "processes plus the load processes),",
                "    so cycles/s cannot grow with nodes on it; what carries to real hosts is the CPU per cycle."]
        lines += [
            "    'own': each node's clients on queues of its own shard, with job ids at home there too (as a "
            "cluster-aware client keeps them);",
            "    'own, any id': the same queues with random job ids, so (N-1)/N of the adds claim their id at "
            "another node's shard (one frame there",
            "    and one back per loop turn, shared by every add of that turn) and tell it when the job is gone; "
            "'all slots': queues spread so about",
            "    2 of 3 requests cross. 'remote' = share of connections whose queue another node serves.",
            "    link frames/cycle = frames sent by every router and shard of every node (their /status) ÷ "
            "cycles: messaging, whatever the cores.",
            "    With own queues and ids nothing per job crosses nodes: frames per cycle stay flat as N grows; "
            "µs per cycle that still grows",
            "    is these 2 cores shared by 3N+1 processes (context switches, caches), not messages.",
            "    projected = N hosts, each running its node (1 router + 1 shard, one core each) with the load "
            "elsewhere: N × 1e6 / max(router µs, shard µs)",
            "    per node (bench.py's 1-router/1-shard cap). Optimistic: assumes the per-cycle CPU measured "
            "here holds (batching changes with load, a real",
            "    NIC adds latency and some kernel time) and that clients spread evenly over the nodes.",
        ]
        problems = [f"{part} {key}: {value}" for part, rows in self.runs.items()
                    for key, values in rows.items() for value in values if isinstance(value, str)]
        if problems:
            lines += ["", "problems:"] + [f"  {p}" for p in problems]
        return "\n".join(lines)

    def _hop_row(self, key: str, label: str) -> List[str]:
        r = self._get("hop", key)
        if r is None:
            return [label, self._status("hop", key)] + [""] * 11
        per = r["cpu_us_per_cycle"]
        cells = [bench.fmt_num(per.get(role), 1) for role in ("a/router", "a/shard-0", "b/router", "b/shard-0")]
        return ([label, bench.fmt_num(r["ops_per_s"]), bench.fmt_num(r["latency_us"].get("p50")),
                 bench.fmt_num(r["latency_us"].get("p99"))] + cells
                + [bench.fmt_num(r["supervisor_us_per_cycle"], 1), bench.fmt_num(r["server_us_per_cycle"], 1),
                   _spread(r), bench.fmt_num(r["loadgen_cpu_us_per_cycle"], 1), str(r["errors"])])

    def _scale_row(self, key: str, nodes: int, queues: str) -> List[str]:
        r = self._get("scale", key)
        if r is None:
            return [str(nodes), queues, self._status("scale", key)] + [""] * 14
        one = self._get("scale", "1_own")
        per_node = " / ".join(bench.fmt_num(v) for v in r["per_node_ops_per_s"].values())

        def ratio(value: float, base: Optional[float]) -> str:
            return f"{value / base:.2f}×" if base else "-"
        return [str(nodes), queues, f"{r['remote_share']:.0%}", bench.fmt_num(r["ops_per_s"]), per_node,
                bench.fmt_num(r["latency_us"].get("p99")), bench.fmt_num(r["router_us_per_cycle"], 1),
                bench.fmt_num(r["shard_us_per_cycle"], 1), bench.fmt_num(r["supervisor_us_per_cycle"], 1),
                bench.fmt_num(r["server_us_per_cycle"], 1),
                ratio(r["server_us_per_cycle"], one["server_us_per_cycle"] if one else None), _spread(r),
                f"{r['link_frames_per_cycle']:.3f}",
                bench.fmt_num(r["loadgen_cpu_us_per_cycle"], 1), str(r["errors"]),
                bench.fmt_num(projected(r, nodes)),
                ratio(projected(r, nodes), projected(one, 1) if one else None)]

    def to_json(self) -> Dict[str, Any]:
        """The median run of every row (as in the tables; a failed row: its
        error), the hop costs, and every run."""
        def rows(part: str, keys: Sequence[str]) -> Dict[str, Any]:
            return {key: self._get(part, key) or self._status(part, key) for key in keys}
        scale = rows("scale", [key for key, _, _ in SCALE_CASES])
        for key, nodes, _ in SCALE_CASES:
            if isinstance(scale[key], dict):
                scale[key]["projected_ops_per_s"] = projected(scale[key], nodes)
        return {"header": self.header, "options": vars(self.opts),
                "hop": rows("hop", [key for key, _, _, _ in HOP_CASES]), "hop_costs": self.hop_costs(),
                "scale": scale, "runs": self.runs}


def _spread(r: Dict[str, Any]) -> str:
    """The lowest–highest server µs per cycle of a row's runs."""
    runs = r["runs_server_us_per_cycle"]
    return f"{min(runs):.0f}–{max(runs):.0f}" if len(runs) > 1 else "-"


def projected(r: Dict[str, Any], nodes: int) -> float:
    """Cycles/s on ``nodes`` hosts: each node's router and shard on a core of
    their own. A node's router (shard) spends the cluster-wide router (shard)
    µs per cycle on each of its own cycles when the load is even, so
    ``bench.project``'s one-router, one-shard cap applies per node."""
    one, _ = bench.project({"router": r["router_us_per_cycle"], "shard": r["shard_us_per_cycle"]},
                           "workq", False, 2)
    return nodes * one


# ---------------------------------------------------------------- running
def run_all(opts: argparse.Namespace, report: Report, tmp: Path) -> None:
    """Every row ``--repeat`` times, the rows of each cluster taking turns
    (so a noisy moment does not fall on one row only); each cluster started
    fresh and always stopped."""
    for i, (nodes, direct, rows) in enumerate(PLAN):
        try:
            with Cluster(tmp / f"cluster-{i}", nodes, direct) as cluster:
                _progress(f"{nodes} node(s), {'direct path' if direct else '--no-direct-path'}: "
                          f"pids {json.dumps(cluster.pids())}")
                for run in range(opts.repeat):
                    for part, key in rows:
                        specs = specs_for(cluster, part, key, opts, f"{part}-{key}-{run}")
                        report.run(part, key, lambda: measure(cluster, specs, opts))
        except KeyboardInterrupt:
            raise
        except Exception as err:   # a cluster that did not start: its rows say why
            report.fail("hop", [key for part, key in rows if part == "hop"], err)
            report.fail("scale", [key for part, key in rows if part == "scale"], err)
            _progress(f"{nodes} node(s): {type(err).__name__}: {err}")


def _progress(message: str) -> None:
    print(f"[cluster-bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cluster_bench.py",
                                     description="Cost of the cross-node hop and cycles/s for 1-3 nodes "
                                                 "(loopback only).")
    parser.add_argument("--seconds", type=float, help="measured seconds per run (default 5; 1 with --quick)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each (default 1; 0.3 with --quick)")
    parser.add_argument("--repeat", type=int, help="runs per row, the median reported (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run, about 20 s in all (the default "
                        "run takes about 3 min)")
    parser.add_argument("--connections", type=int, default=32,
                        help="client connections: part 1's in all, part 2's per node")
    parser.add_argument("--loadgen-procs", type=int, default=2,
                        help="load processes (part 2: this ÷ N per node, at least one each)")
    parser.add_argument("--prefill-per-queue", type=int, help="jobs queued per queue before a row "
                        "(default 200; 20 with --quick)")
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--json", metavar="FILE", help="where the JSON goes (default "
                        "loadtests/results/cluster-<UTC time>.json)")
    opts = parser.parse_args(argv)
    if opts.seconds is None:
        opts.seconds = 1.0 if opts.quick else 5.0
    if opts.warmup is None:
        opts.warmup = 0.3 if opts.quick else 1.0
    if opts.repeat is None:
        opts.repeat = 1 if opts.quick else 3
    if opts.prefill_per_queue is None:
        opts.prefill_per_queue = 20 if opts.quick else 200
    if opts.seconds <= 0 or opts.warmup < 0 or opts.connections < 3 or opts.loadgen_procs < 1 \
            or opts.prefill_per_queue < 0 or opts.repeat < 1:
        parser.error("--seconds must be > 0, --warmup ≥ 0, --connections ≥ 3, --loadgen-procs ≥ 1, "
                     "--prefill-per-queue ≥ 0, --repeat ≥ 1")
    if opts.json is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        opts.json = os.path.join(HERE, "results", f"cluster-{stamp}.json")
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, bench._raise_interrupt)
    ensure_loopback_aliases()
    tmp = tempfile.mkdtemp(prefix="qs-cluster-bench-")
    _progress(f"temporary directory {tmp}")
    report = Report(opts, tmp)
    interrupted = False
    try:
        run_all(opts, report, Path(tmp))
    except KeyboardInterrupt:
        interrupted = True
        _progress("interrupted: every node started has been stopped; partial results follow")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(report.render(), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
    with open(opts.json, "w") as f:
        json.dump(report.to_json(), f, indent=2)
        f.write("\n")
    _progress(f"figures written to {opts.json}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
