"""``make bench``: our server against beanstalkd and Redis, one run, one table.

Why one command: a throughput figure means little without a peer measured
the same way on the same machine at the same moment (this is a noisy 2-core
VM; ±15% run to run). So this starts, on loopback, our server with 1 shard
and with N shards (N = CPU count), beanstalkd and redis-server; drives each
with the same load generator (``loadgen.py``); stops every one of them
(always: on error, Ctrl-C or SIGTERM too); and prints throughput, latency,
server CPU per cycle with a projection to more cores, memory per queued job,
and the targets beside the measurements. Each workload gets a fresh server.

Server CPU is read from ``/proc/<pid>/stat`` (utime + stime) of every server
process before and after a run, memory from ``/proc/<pid>/status`` VmRSS.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import loadgen  # noqa: E402
import peers  # noqa: E402
from loadgen import CYCLE, PRODUCE, LoadResult, LoadSpec  # noqa: E402
from queueserver import __version__  # noqa: E402
from queueserver.serverprocess import ServerProcess  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
PROJECT_CORES = (4, 8, 16)
VERSION_NAMES = {"workq": "queueserver"}

TARGET_VS_BEANSTALKD = 1.0     # ours (N shards) cycles/s ÷ beanstalkd's
TARGET_CPU_US = 40.0           # router + shard CPU per cycle
TARGET_BYTES_PER_JOB = 350.0   # RSS per queued job beyond the payload
TARGET_P99_US = 2000.0         # per-request p99, full cycle


# ---------------------------------------------------------------- /proc
def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# ---------------------------------------------------------------- our server
class OurServer(peers.ServerUnderTest):
    """``queueserver serve`` with only the workq listener, on a port the kernel picks."""

    protocol = "workq"

    def __init__(self, shards: int) -> None:
        super().__init__()
        self.shards = shards
        self.label = _our_label(shards)
        self.server = ServerProcess(shards=shards, protocols=["workq"])
        self._pids: Dict[str, int] = {}

    def start(self) -> "OurServer":
        self.version = __version__
        self.server.start()
        self.port = self.server.port("workq")
        self._pids = self.server.child_pids()
        if len(self._pids) != self.shards + 1:
            raise RuntimeError(f"expected a router and {self.shards} shards, found {self._pids}")
        return self

    def pids(self) -> Dict[str, int]:
        return dict(self._pids)

    def stop(self) -> None:
        self.server.stop(peers.STOP_TIMEOUT)
        super().stop()


# ---------------------------------------------------------------- measuring
def server_cpu(server: peers.ServerUnderTest) -> Dict[str, float]:
    return {role: cpu_seconds(pid) for role, pid in server.pids().items()}


def measure_cycle(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """Workload (1), plus the CPU each server process spent on it (workload 3)."""
    spec = _spec(server, opts, CYCLE)
    loadgen.prefill(spec, opts.prefill)
    before = server_cpu(server)
    result = loadgen.run(spec)
    after = server_cpu(server)
    cpu = {role: after[role] - before[role] for role in before}
    cycles = max(1, result.total_ops)
    out = _result_dict(result)
    out["cpu_s"] = cpu
    out["cpu_us_per_cycle"] = {role: s / cycles * 1e6 for role, s in cpu.items()}
    out["loadgen_cpu_us_per_cycle"] = result.loadgen_cpu_s / cycles * 1e6
    return out


def measure_produce(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """Workload (2): enqueue only, ``batch`` requests per write."""
    return _result_dict(loadgen.run(_spec(server, opts, PRODUCE)))


def measure_memory(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """RSS of all the server's processes after queueing ``--memory-jobs`` jobs, minus before.

    Every server process counts (ours: the router with its job directory, and
    each shard). The "after" figure is taken once the processes' RSS has stopped
    moving (replies drained, a router that learns of jobs from the shards caught
    up), not at a fixed moment.
    """
    pids = server.pids()
    before = {role: rss_bytes(pid) for role, pid in pids.items()}
    spec = _spec(server, opts, PRODUCE)
    spec.warmup, spec.duration, spec.max_ops = 0.0, 600.0, opts.memory_jobs
    spec.ttl_ms = 3_600_000
    result = loadgen.run(spec)
    after = _steady_rss(pids)
    jobs = result.ops
    total_before, total_after = sum(before.values()), sum(after.values())
    per_job = (total_after - total_before) / jobs if jobs else 0.0
    per_process = {role: (after[role] - before[role]) / jobs if jobs else 0.0 for role in pids}
    return {"jobs": jobs, "errors": result.errors, "rss_before": total_before, "rss_after": total_after,
            "bytes_per_job": per_job, "bytes_beyond_payload": per_job - opts.payload,
            "bytes_per_job_by_process": per_process}


def _steady_rss(pids: Dict[str, int], timeout: float = 15.0) -> Dict[str, int]:
    """Each process's RSS once no process's has changed by 64 KiB for a second."""
    deadline = time.monotonic() + timeout
    last = {role: rss_bytes(pid) for role, pid in pids.items()}
    steady_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = {role: rss_bytes(pid) for role, pid in pids.items()}
        if any(abs(now[role] - last[role]) > 65536 for role in pids):
            steady_since = time.monotonic()
        last = now
        if time.monotonic() - steady_since >= 1.0:
            break
    return last


def _spec(server: peers.ServerUnderTest, opts: argparse.Namespace, workload: str) -> LoadSpec:
    return LoadSpec(protocol=server.protocol, port=server.port, workload=workload,
                    connections=opts.connections, procs=opts.loadgen_procs, warmup=opts.warmup,
                    duration=opts.duration, batch=opts.batch, queues=opts.queues,
                    payload=opts.payload)


def _result_dict(result: LoadResult) -> Dict[str, Any]:
    return {"ops_per_s": result.ops_per_s, "ops": result.ops, "requests": result.requests,
            "errors": result.errors, "total_ops": result.total_ops, "seconds": result.seconds,
            "latency_us": result.latency_us, "cycle_latency_us": result.cycle_latency_us,
            "loadgen_cpu_s": result.loadgen_cpu_s}


# ---------------------------------------------------------------- projection
def project(cpu_us: Dict[str, float], kind: str, scales: bool, cores: int) -> Tuple[float, str]:
    """Cycles/s at ``cores`` cores if the server had them all (load generated elsewhere).

    Ours: shards partition the queues and routers (``--routers R``) share the
    client connections, so with enough of both (``scales``) all processes
    together use the cores: cycles/s = cores / (CPU per cycle). A 1-shard,
    1-router server cannot spread: each of its two processes caps at
    1 / (its CPU per cycle). Peers: one event-loop thread, capped at
    1 / (CPU per cycle) at any core count. Returns the projection and the
    limit that sets it.
    """
    total = sum(cpu_us.values())
    if total <= 0:
        return 0.0, "-"
    if kind != "workq":
        return 1e6 / total, "one thread"
    caps = [(cores * 1e6 / total, "cores")]
    if not scales:
        router = sum(v for k, v in cpu_us.items() if k.startswith("router"))
        shards = total - router
        if router > 0:
            caps.append((1e6 / router, "one router"))
        if shards > 0:
            caps.append((1e6 / shards, "one shard"))
    return min(caps)


# ---------------------------------------------------------------- report
def fmt_num(x: Optional[float], digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def table(headers: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    def line(cells: List[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


class Report:
    """Collects results per server label and renders the text and JSON reports."""

    def __init__(self, opts: argparse.Namespace, servers: List[Tuple[str, str]]) -> None:
        self.opts = opts
        self.servers = servers                      # (label, kind) in table order
        self.results: Dict[str, Dict[str, Any]] = {label: {} for label, _ in servers}
        self.versions: Dict[str, str] = {}
        self.header = self._header()

    def _header(self) -> Dict[str, Any]:
        argv = [os.path.relpath(sys.executable) if sys.executable.startswith(REPO) else sys.executable,
                os.path.relpath(os.path.abspath(sys.argv[0]))] + sys.argv[1:]
        mem_kb = 0
        try:
            with open("/proc/meminfo") as f:
                mem_kb = int(f.readline().split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "cores": CORES, "cpu": cpu_model(), "memory_gib": round(mem_kb / 1048576, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "command": shlex.join(argv), "via_make": bool(os.environ.get("MAKELEVEL")),
        }

    def record(self, label: str, key: str, value: Any) -> None:
        self.results[label][key] = value

    def _get(self, label: str, key: str) -> Optional[Dict[str, Any]]:
        value = self.results.get(label, {}).get(key)
        return value if isinstance(value, dict) else None

    def _ours_labels(self) -> List[str]:
        return [label for label, kind in self.servers if kind == "workq"]

    def _ratio_cols(self, key: str, label: str) -> List[str]:
        cells = []
        mine = self._get(label, key)
        for ours in self._ours_labels():
            theirs = self._get(ours, key)
            if mine and theirs and mine["ops_per_s"] > 0:
                cells.append(f"{theirs['ops_per_s'] / mine['ops_per_s']:.2f}x")
            else:
                cells.append("-")
        return cells

    def render(self) -> str:
        sections = (self._render_header, self._render_cycle, self._render_produce, self._render_cpu,
                    self._render_memory, self._render_targets)
        return "\n".join(line for section in sections for line in section())

    def _n_label(self) -> Optional[str]:
        """Our N-shard server's label: the one the targets are about."""
        ours = self._ours_labels()
        return ours[-1] if ours else None

    def _section_table(self, key: str, headers: List[str],
                       row: Callable[[str, str, Dict[str, Any]], List[str]],
                       ratios: bool = False, not_run_rows: bool = True) -> str:
        """A table of one result ``key``, a row per server: ``row(label, kind,
        result)`` where there is a result, else "failed" or "not run" (the
        latter left out unless ``not_run_rows``). With ``ratios``, a column per
        server of ours: its throughput ÷ this row's."""
        ratio_heads = [f"{label} ÷ this" for label in self._ours_labels()] if ratios else []
        rows = []
        for label, kind in self.servers:
            result = self._get(label, key)
            if result is not None:
                rows.append(row(label, kind, result) + (self._ratio_cols(key, label) if ratios else []))
            elif not_run_rows or key in self.results.get(label, {}):
                rows.append([label, self._error(label, key)] + [""] * (len(headers) - 2)
                            + ["-"] * len(ratio_heads))
        return table(headers + ratio_heads, rows)

    def _render_header(self) -> List[str]:
        h, o = self.header, self.opts
        return [
            f"queueserver bench  {h['date']}",
            f"machine: {h['cores']} cores, {h['cpu']}, {h['memory_gib']} GiB, Linux {h['kernel']}, "
            f"Python {h['python']}",
            f"command: {h['command']}" + ("   (run by `make bench`)" if h["via_make"] else ""),
            "versions: " + ", ".join(f"{k} {v}" for k, v in self.versions.items()),
            f"load generator: loadtests/loadgen.py, {o.loadgen_procs} processes, one epoll loop each, "
            f"{o.connections} connections in all; the same for every server; loopback only",
            f"timing: {o.warmup:g} s warm-up + {o.duration:g} s measured per workload per server; "
            "a fresh server for every workload",
            "",
        ]

    def _render_cycle(self) -> List[str]:
        o = self.opts
        return [
            f"(1) full job cycle, {o.payload}-byte payloads, {o.connections} connections, no pipelining "
            "(one request in flight per connection; a cycle = 3 round trips)",
            "    ours: add + lease + complete, one queue per connection (their names spread over the "
            "shards); beanstalkd: put + reserve-with-timeout + delete, one tube per connection;",
            f"    redis: LPUSH + BLMOVE src src:busy LEFT RIGHT + LREM src:busy 1 <value>, {o.queues} keys; "
            f"queues pre-filled with {o.prefill:,} jobs so a take never waits",
            "    latency: 'req' = one request's round trip, 'cycle' = all three; jobs/s = cycles/s",
            self._section_table("cycle", ["server", "cycles/s", "req p50 µs", "req p99 µs", "cycle p50 µs",
                                          "cycle p99 µs", "errors", "loadgen µs/cycle"],
                                self._cycle_row, ratios=True),
            f"    targets: {self._n_label() or 'ours'} ≥ {TARGET_VS_BEANSTALKD:.1f}x beanstalkd; "
            f"req p99 ≤ {TARGET_P99_US / 1000:g} ms",
            "",
        ]

    @staticmethod
    def _cycle_row(label: str, kind: str, r: Dict[str, Any]) -> List[str]:
        lat, cyc = r["latency_us"], r["cycle_latency_us"]
        return [label, fmt_num(r["ops_per_s"]), fmt_num(lat.get("p50")), fmt_num(lat.get("p99")),
                fmt_num(cyc.get("p50")), fmt_num(cyc.get("p99")), str(r["errors"]),
                fmt_num(r["loadgen_cpu_us_per_cycle"], 1)]

    def _render_produce(self) -> List[str]:
        o = self.opts
        return [
            f"(2) producer only, pipelined: {o.batch} enqueues per write, {o.connections} connections, "
            f"{o.payload}-byte payloads; latency = one batch's round trip",
            self._section_table("produce", ["server", "jobs/s", "batch p50 µs", "batch p99 µs", "errors"],
                                self._produce_row, ratios=True),
            "",
        ]

    @staticmethod
    def _produce_row(label: str, kind: str, r: Dict[str, Any]) -> List[str]:
        lat = r["latency_us"]
        return [label, fmt_num(r["ops_per_s"]), fmt_num(lat.get("p50")), fmt_num(lat.get("p99")),
                str(r["errors"])]

    def _render_cpu(self) -> List[str]:
        return [
            "(3) server CPU during workload (1), /proc/<pid>/stat utime+stime over the whole run "
            "(warm-up included) ÷ cycles completed",
            self._section_table("cycle", ["server", "router µs/cycle", "shards µs/cycle", "server µs/cycle",
                                          "CPU s/1k cycles"] + [f"@{c} cores cycles/s" for c in PROJECT_CORES]
                                + [f"limit @{PROJECT_CORES[-1]}"], self._cpu_row),
            f"    target: router + shard CPU ≤ {TARGET_CPU_US:g} µs per cycle",
            "    projection model: the server alone gets C cores (load generated elsewhere). Ours with N shards",
            "    run as C shards and about C/3 routers (--routers; they share the client ports): shard work",
            "    partitions by queue name and router work by connection, so cycles/s = C / total µs, with the",
            "    N-shard, 1-router run's per-cycle costs. Ours with 1 shard (and 1 router) caps at 1 / the",
            "    larger process's µs. Peers run one event-loop thread: 1 / µs per cycle at any C. Optimistic:",
            "    it assumes per-cycle costs stay flat (no contention, no loss of batching, even hashing), and",
            "    they were measured with the load generator sharing these cores.",
            "",
        ]

    def _cpu_row(self, label: str, kind: str, r: Dict[str, Any]) -> List[str]:
        per = r["cpu_us_per_cycle"]
        ours = kind == "workq"
        router = per.get("router") if ours else None
        shards = sum(v for k, v in per.items() if k.startswith("shard")) if ours else None
        total = sum(per.values())
        scales = ours and label == self._n_label() and len(per) > 2
        projections = [project(per, kind, scales, c) for c in PROJECT_CORES]
        return ([label, fmt_num(router, 1), fmt_num(shards, 1), fmt_num(total, 1), f"{total / 1000:.4f}"]
                + [fmt_num(value) for value, _ in projections] + [projections[-1][1]])

    def _render_memory(self) -> List[str]:
        o = self.opts
        return [
            f"(4) memory: RSS of every server process (ours: router + shards) after queueing "
            f"{o.memory_jobs:,} jobs of {o.payload} bytes, minus before, ÷ jobs",
            self._section_table("memory", ["server", "jobs", "RSS before MiB", "RSS after MiB", "B/job",
                                           "B/job beyond payload", "of which router / shards"],
                                self._memory_row, not_run_rows=False),
            f"    target: ≤ {TARGET_BYTES_PER_JOB:g} B per queued job beyond the payload",
            "",
        ]

    def _memory_row(self, label: str, kind: str, r: Dict[str, Any]) -> List[str]:
        split = r.get("bytes_per_job_by_process", {})
        router = sum(v for k, v in split.items() if k.startswith("router"))
        shards = sum(v for k, v in split.items() if k.startswith("shard"))
        return [label, fmt_num(r["jobs"]), fmt_num(r["rss_before"] / 1048576, 1),
                fmt_num(r["rss_after"] / 1048576, 1), fmt_num(r["bytes_per_job"]),
                fmt_num(r["bytes_beyond_payload"]),
                f"{router:,.0f} / {shards - self.opts.payload:,.0f}" if len(split) > 1 else "-"]

    def _render_targets(self) -> List[str]:
        out = [f"targets ({self._n_label() or 'ours'})",
               table(["what", "measured", "target", ""], [list(row) for row in self.targets()])]
        problems = self.problems()
        if problems:
            out += ["", "problems:"] + [f"  {p}" for p in problems]
        return out

    def _error(self, label: str, key: str) -> str:
        value = self.results.get(label, {}).get(key)
        return "failed (see problems)" if isinstance(value, str) else "not run"

    def problems(self) -> List[str]:
        return [f"{label} / {key}: {value}" for label, results in self.results.items()
                for key, value in results.items() if isinstance(value, str)]

    def targets(self) -> List[Tuple[str, str, str, str]]:
        ours = self._n_label()
        rows: List[Tuple[str, str, str, str]] = []

        def verdict(ok: Optional[bool]) -> str:
            return "-" if ok is None else ("met" if ok else "MISSED")

        cycle = self._get(ours, "cycle") if ours else None
        bean = self._get("beanstalkd", "cycle")
        ratio = cycle["ops_per_s"] / bean["ops_per_s"] if cycle and bean and bean["ops_per_s"] else None
        rows.append(("full cycle vs beanstalkd", f"{ratio:.2f}x" if ratio is not None else "-",
                     f"≥ {TARGET_VS_BEANSTALKD:.1f}x",
                     verdict(None if ratio is None else ratio >= TARGET_VS_BEANSTALKD)))
        cpu = sum(cycle["cpu_us_per_cycle"].values()) if cycle else None
        rows.append(("router + shard CPU per cycle", f"{cpu:.1f} µs" if cpu is not None else "-",
                     f"≤ {TARGET_CPU_US:g} µs", verdict(None if cpu is None else cpu <= TARGET_CPU_US)))
        mem = self._get(ours, "memory") if ours else None
        beyond = mem["bytes_beyond_payload"] if mem else None
        rows.append(("bytes per queued job beyond payload", f"{beyond:.0f} B" if beyond is not None else "-",
                     f"≤ {TARGET_BYTES_PER_JOB:g} B",
                     verdict(None if beyond is None else beyond <= TARGET_BYTES_PER_JOB)))
        p99 = cycle["latency_us"].get("p99") if cycle else None
        rows.append(("p99 per request, full cycle", f"{p99 / 1000:.2f} ms" if p99 is not None else "-",
                     f"≤ {TARGET_P99_US / 1000:g} ms", verdict(None if p99 is None else p99 <= TARGET_P99_US)))
        return rows

    def to_json(self) -> Dict[str, Any]:
        return {"header": self.header, "options": vars(self.opts), "versions": self.versions,
                "results": self.results,
                "targets": [dict(zip(("what", "measured", "target", "verdict"), t)) for t in self.targets()]}


# ---------------------------------------------------------------- running
def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def plan(opts: argparse.Namespace) -> List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]]:
    """(label, wire protocol, factory) for every server this run measures, in table order."""
    servers: List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]] = []
    if opts.only in (None, "ours"):
        for shards in sorted({1, opts.shards}):
            servers.append((_our_label(shards), "workq", lambda s=shards: OurServer(s)))
    if opts.only in (None, "beanstalkd"):
        servers.append(("beanstalkd", "beanstalkd", peers.Beanstalkd))
    if opts.only in (None, "redis"):
        servers.append(("redis", "redis", peers.Redis))
    return servers


def _our_label(shards: int) -> str:
    return f"ours, {shards} shard" + ("s" if shards > 1 else "")


def run_all(opts: argparse.Namespace, report: Report,
            servers: List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]]) -> None:
    """Every workload against every server, each on a fresh server that is always stopped."""
    memory_for = {label for label, kind, _ in servers if kind != "workq"}
    ours = [label for label, kind, _ in servers if kind == "workq"]
    if ours:
        memory_for.add(ours[-1])    # N shards: the configuration the target is about
    steps: List[Tuple[str, Callable[..., Dict[str, Any]]]] = [
        ("cycle", measure_cycle), ("produce", measure_produce), ("memory", measure_memory)]
    for key, measure in steps:
        for label, _, factory in servers:
            if key == "memory" and label not in memory_for:
                continue
            _progress(f"{label}: {key} ...")
            started = time.monotonic()
            try:
                with factory() as server:
                    _progress(f"{label}: {server.protocol} on {peers.HOST}:{server.port}, "
                              f"pids {json.dumps(server.pids())}")
                    report.versions[VERSION_NAMES.get(server.protocol, server.protocol)] = server.version
                    report.record(label, key, measure(server, opts))
            except KeyboardInterrupt:
                raise
            except Exception as err:  # one server failing must not hide the others' numbers
                report.record(label, key, f"{type(err).__name__}: {err}")
            _progress(f"{label}: {key} done in {time.monotonic() - started:.1f} s")


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench.py", description="Benchmark our server against beanstalkd and Redis (loopback only).")
    parser.add_argument("--duration", type=float, help="measured seconds per workload per server "
                        "(default 10; 1 with --quick)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each measurement "
                        "(default 1; 0.3 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 s per workload, 0.3 s warm-up, 20,000 jobs for memory")
    parser.add_argument("--only", choices=("ours", "beanstalkd", "redis"), help="measure one server kind")
    parser.add_argument("--json", metavar="FILE", help="also write all results as JSON")
    parser.add_argument("--memory-jobs", type=int, default=None, help="jobs queued for the memory figure "
                        "(default 1,000,000; 20,000 with --quick)")
    parser.add_argument("--shards", type=int, default=CORES, help="N for 'ours, N shards' (default: CPU count)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--loadgen-procs", type=int, default=2, help="load generator processes")
    parser.add_argument("--batch", type=int, default=64, help="requests per write in the producer workload")
    parser.add_argument("--queues", type=int, default=256, help="queue names ours and Redis spread over")
    parser.add_argument("--prefill", type=int, default=25_600, help="jobs queued before a full-cycle run")
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    opts = parser.parse_args(argv)
    if opts.duration is None:
        opts.duration = 1.0 if opts.quick else 10.0
    if opts.warmup is None:
        opts.warmup = 0.3 if opts.quick else 1.0
    if opts.memory_jobs is None:
        opts.memory_jobs = 20_000 if opts.quick else 1_000_000
    if opts.duration <= 0 or opts.warmup < 0 or opts.memory_jobs < 1:
        parser.error("--duration must be > 0, --warmup ≥ 0, --memory-jobs ≥ 1")
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    servers = plan(opts)
    report = Report(opts, [(label, kind) for label, kind, _ in servers])
    if any(kind != "workq" for _, kind, _ in servers):
        peers.ensure_installed()
    interrupted = False
    try:
        run_all(opts, report, servers)
    except KeyboardInterrupt:
        interrupted = True
        _progress("interrupted: every server started has been stopped; partial results follow")
    text = report.render()
    print(text, flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
