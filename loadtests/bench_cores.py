"""``make bench-cores``: does a job cost a shard the same whatever the number
of shards? (issue 27), with beanstalkd and Redis measured the same way.

Why its own command: ``make bench`` compares 1 and N shards with the peers
on many workloads; this asks one question, on the workload where the
answer shows: full job cycles (add + lease + complete, 100-byte payloads,
one request in flight per connection) with random uuid4-shaped job ids
(``loadgen.Ids``: a random prefix per process and a counter, so each id's
home is any shard) over 64 queues, 128 connections, at 1, 2, 4 and 8
shards. Each count gets a fresh server (``bench.OurServer``: the router and
the shards; the direct path, in memory), queues prefilled so that a lease
never waits, and the same lean load generator as ``make bench``; then
beanstalkd and Redis (one tube or key per queue name) in the same run.

Per row: cycles/s; server CPU per cycle (``/proc/<pid>/stat`` of the
router and every shard, over the whole load run, warm-up included, ÷ the
cycles done in it) and its ratio to 1 shard's; cores busy (that CPU ÷ the
loaded seconds); *shard frames per cycle*, the frames exchanged between
shards (each shard's ``shard_link_frames`` in ``/status``: frames sent and
received on the links it opened to the other shards, so every frame once)
÷ cycles; *router frames per cycle*, the same for the routers' links to the
shards; *requests per turn*, the requests the shards executed ÷ the
event-loop turns that executed any (``requests`` ÷ ``request_turns``: a
turn is one iteration of a shard's libev loop); and per-request and
per-cycle p99. The counters are read from ``/status`` just before and just
after the load run (outside the CPU window), so the scrape does not count.

``--repeat R`` runs every server R times, interleaved, and prints medians.
``--profile DIR`` then runs 1 shard and the largest count once more each
with shard 0 profiled (not in the table: a profiler takes CPU): ``perf
record -g`` when the server runs compiled (py-spy cannot see inside mypyc's
modules) and perf is there, py-spy otherwise; a summary of each is printed
and the profiles are left in DIR.

    .venv/bin/python loadtests/bench_cores.py [--quick] [--shards 1 2 4 8] [--repeat 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402
from queueserver.store.writer import SLOW_SYNC_MS  # noqa: E402
import loadgen  # noqa: E402
import peers  # noqa: E402
from loadgen import CYCLE  # noqa: E402

CORES = bench.CORES
DEFAULT_SHARDS = [1, 2, 4, 8]
TARGET_CPU_RATIO = 1.25        # server CPU per cycle at 4 and 8 shards ÷ 1 shard's (issue 27)
TARGET_VS_BEANSTALKD = 2.0     # 1 shard's server CPU per cycle ÷ beanstalkd's (issue 27)
# Issue 27's many-core targets, all in one run: 8 shards' cycles/s ÷ 1 shard's, ÷ beanstalkd's, ÷ Redis's;
# durable 8 shards ÷ Redis appendfsync always; 8 shards' request p99 ÷ beanstalkd's (at most)
MANY_CORE_SHARDS = 8
TARGET_MANY_VS_ONE = 6.0
TARGET_MANY_VS_BEANSTALKD = 2.0
TARGET_MANY_VS_REDIS = 1.6
TARGET_DURABLE_VS_REDIS = 1.5
TARGET_P99_VS_BEANSTALKD = 2.0
PROFILE_TOP = 15               # lines of each profile's summary printed

#: What ``/status`` gives per shard and router, summed over the node: (entry list, field) per figure.
COUNTED = {"shard_frames": ("shards", "shard_link_frames"), "router_frames": ("routers", "link_frames"),
           "requests": ("shards", "requests"), "turns": ("shards", "request_turns")}


# ---------------------------------------------------------------- measuring
def node_status(server: bench.OurServer) -> Dict[str, Any]:
    port = server.server.ports["metrics"]
    with urllib.request.urlopen(f"http://{peers.HOST}:{port}/status", timeout=15) as answer:
        status: Dict[str, Any] = json.loads(answer.read())
    return status


def node_counts(server: bench.OurServer) -> Dict[str, int]:
    """The counters of :data:`COUNTED`, summed over every shard and router
    (all must answer), and ``fsyncs``, the logs' fsyncs (0 in memory)."""
    status = node_status(server)
    down = [entry for entry in status["shards"] + status["routers"] if not entry["up"]]
    if down:
        raise RuntimeError(f"processes down while measuring: {down}")
    counts = {name: sum(entry[field] for entry in status[part]) for name, (part, field) in COUNTED.items()}
    counts["fsyncs"] = sum(status["histograms"]["fsync_seconds"]["counts"])
    counts["compiled"] = int(bool(status["compiled"]))
    return counts


def measure(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """One full-cycle run on ``server``: ``bench.cycle_run``'s figures, and
    for ours what the shards counted meanwhile."""
    spec = bench.load_spec(server, opts, CYCLE)
    loadgen.prefill(spec, opts.prefill)
    ours = isinstance(server, bench.OurServer)
    before = node_counts(server) if ours else None
    out = bench.cycle_run(server, spec)
    cycles = max(1, out["total_ops"])
    cpu_s = sum(out["cpu_s"].values())
    out["server_cpu_us_per_cycle"] = cpu_s / cycles * 1e6
    out["cores_busy"] = cpu_s / (opts.warmup + opts.duration)
    if ours and before is not None:
        after = node_counts(server)
        delta = {name: after[name] - before[name] for name in COUNTED}
        out["counted"] = delta
        out["fsyncs"] = after["fsyncs"] - before["fsyncs"]
        out["compiled"] = bool(after["compiled"])
        out["shard_frames_per_cycle"] = delta["shard_frames"] / cycles
        out["router_frames_per_cycle"] = delta["router_frames"] / cycles
        out["requests_per_turn"] = delta["requests"] / delta["turns"] if delta["turns"] else None
    return out


#: the figures a row shows, as medians over its runs
MEDIANS: Dict[str, Callable[[Dict[str, Any]], Optional[float]]] = {
    "cycles_per_s": lambda r: r["ops_per_s"],
    "server_cpu_us_per_cycle": lambda r: r["server_cpu_us_per_cycle"],
    "cores_busy": lambda r: r["cores_busy"],
    "loadgen_cores": lambda r: r["loadgen_cpu_us_per_cycle"] * r["ops_per_s"] / 1e6,
    "shard_frames_per_cycle": lambda r: r.get("shard_frames_per_cycle"),
    "router_frames_per_cycle": lambda r: r.get("router_frames_per_cycle"),
    "requests_per_turn": lambda r: r.get("requests_per_turn"),
    "request_p99_us": lambda r: r["latency_us"].get("p99"),
    "cycle_p99_us": lambda r: r["cycle_latency_us"].get("p99"),
}


def summarize(runs: List[Any]) -> Dict[str, Any]:
    """A row's figures: the median of each over the runs that succeeded; the errors summed."""
    good = [r for r in runs if isinstance(r, dict)]
    row: Dict[str, Any] = {"runs": len(good), "failures": [r for r in runs if not isinstance(r, dict)],
                           "errors": sum(r["errors"] for r in good)}
    for name, pick in MEDIANS.items():
        values = [v for v in (pick(r) for r in good) if v is not None]
        row[name] = statistics.median(values) if values else None
    return row


# ---------------------------------------------------------------- profiling
def profiler_for(compiled: bool) -> Tuple[str, str]:
    """(tool, note): perf for a compiled server when there is perf, else py-spy."""
    if compiled and shutil.which("perf"):
        return "perf", "perf record -g (the server runs compiled: C symbols of mypyc's modules)"
    note = "py-spy (Python frames)"
    if compiled:
        note += ("; the server runs compiled and perf is not installed: py-spy cannot see inside the "
                 "compiled modules, whose time shows as their Python callers'")
    return "py-spy", note


def start_profiler(tool: str, pid: int, path: str) -> subprocess.Popen:
    if tool == "perf":
        argv = ["perf", "record", "-g", "-F", "1999", "-o", path, "-p", str(pid)]
    else:
        py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        argv = [py_spy, "record", "--nonblocking", "--rate", "250", "--format", "raw", "-o", path,
                "--pid", str(pid)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def summarize_profile(tool: str, path: str) -> List[str]:
    """The functions that took most of the samples themselves (self time),
    as lines, after one with the number of samples."""
    if tool == "perf":
        def report(sort: str, top: int) -> Tuple[str, List[str]]:
            text = subprocess.run(["perf", "report", "-i", path, "--stdio", "--no-children", "-g", "none",
                                   "--sort", sort, "--percent-limit", "0.5"],
                                  capture_output=True, text=True, timeout=300).stdout
            samples = next((line.split(":", 1)[1].split()[0] for line in text.splitlines()
                            if line.startswith("# Samples:")), "?")
            lines = [re.sub(r"(\s+-)+\s*$", "", line) for line in text.splitlines()
                     if line.strip() and not line.startswith("#")]
            with open(f"{path}.{sort.replace(',', '-')}.txt", "w") as f:
                f.write(text)
            return samples, lines[:top]

        samples, by_dso = report("dso", 6)
        _, by_symbol = report("dso,symbol", PROFILE_TOP)
        return ([f"{samples} samples (perf report --no-children); self time by library:"] + by_dso
                + ["and by function:"] + by_symbol)
    by_function: Counter = Counter()
    total = 0
    with open(path) as f:
        for line in f:   # py-spy's raw format: "frame;frame;...;leaf count", a frame "name (file:line)"
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            by_function[re.sub(r":\d+\)$", ")", stack.rsplit(";", 1)[-1])] += int(count)
            total += int(count)
    return [f"{total} samples (py-spy, self time by function)"] + [
        f"{100 * n / total:6.2f}%  {frame}" for frame, n in by_function.most_common(PROFILE_TOP)]


def profile(opts: argparse.Namespace, shards: int, directory: str) -> Dict[str, Any]:
    """One more run at ``shards`` with shard 0 profiled; the profile's summary."""
    with bench.OurServer(shards) as server:
        bench.announce(server, "profiled")
        tool, note = profiler_for(bool(node_status(server)["compiled"]))
        path = os.path.join(directory, f"{shards}-shards-shard-0." + ("perf.data" if tool == "perf" else "txt"))
        spec = bench.load_spec(server, opts, CYCLE)
        loadgen.prefill(spec, opts.prefill)
        spy = start_profiler(tool, server.pids()["shard-0"], path)
        try:
            time.sleep(0.5)   # attached before the load starts
            result = loadgen.run(spec)
        finally:
            stop_profiler(spy)
    return {"shards": shards, "tool": tool, "note": note, "path": path, "cycles_per_s": result.ops_per_s,
            "top": summarize_profile(tool, path)}


# ---------------------------------------------------------------- report
def fmt(x: Optional[float], digits: int = 0, suffix: str = "") -> str:
    return "-" if x is None else f"{x:,.{digits}f}{suffix}"


def render(opts: argparse.Namespace, header: Dict[str, Any], rows: Dict[str, Dict[str, Any]],
           labels: List[Tuple[str, str]], profiles: List[Dict[str, Any]]) -> str:
    h = header
    out = [
        f"queueserver bench-cores  {h['date']}",
        f"machine: {h['cores']} cores, {h['cpu']}, {h['memory_gib']} GiB, Linux {h['kernel']}, Python {h['python']}; "
        f"load average {h['load_before']} before, {h['load_after']} after",
        f"command: {h['command']}" + ("   (run by `make bench-cores`)" if h["via_make"] else ""),
        f"server: {h.get('build', '?')}",
        *([h["durable"]] if "durable" in h else []),
        f"workload: full cycles (add + lease + complete), {opts.payload}-byte payloads, random uuid4-shaped ids, "
        f"{opts.connections} connections over {opts.queues} queues, one request in flight each; "
        f"{opts.prefill:,} jobs prefilled",
        f"load generator: {opts.loadgen_procs} process(es); {opts.warmup:g} s warm-up + {opts.duration:g} s "
        f"measured per run, {opts.repeat} run(s) per server, interleaved (medians); a fresh server per run",
        "",
    ]
    one = rows.get(labels[0][0]) if labels and labels[0][1] == "workq" else None   # the ratios' base
    base_cycles = one.get("cycles_per_s") if one else None
    base_cpu = one.get("server_cpu_us_per_cycle") if one else None
    table_rows: List[List[str]] = []
    for label, kind in labels:
        r = rows.get(label)
        if r is None or not r["runs"]:
            failure = (r["failures"][0] if r and r["failures"] else "not run")
            table_rows.append([label, str(failure)[:60]] + [""] * 11)
            continue
        ours, compared = kind.startswith("workq"), kind == "workq"   # durable and plain rows: no ratios
        cycles, cpu = r["cycles_per_s"], r["server_cpu_us_per_cycle"]
        table_rows.append([
            label, fmt(cycles),
            fmt(cycles / base_cycles, 2, "x") if compared and base_cycles else "",
            fmt(cpu, 1),
            fmt(cpu / base_cpu, 2, "x") if compared and base_cpu else "",
            fmt(r["cores_busy"], 2),
            fmt(r["loadgen_cores"], 2),
            fmt(r["shard_frames_per_cycle"], 3) if ours else "",
            fmt(r["router_frames_per_cycle"], 3) if ours else "",
            fmt(r["requests_per_turn"], 2) if ours else "",
            fmt(r["request_p99_us"] / 1000 if r["request_p99_us"] is not None else None, 2),
            fmt(r["cycle_p99_us"] / 1000 if r["cycle_p99_us"] is not None else None, 2),
            str(r["errors"]),
        ])
    base = f"{opts.shards[0]} shard" + ("s" if opts.shards[0] > 1 else "")
    out.append(bench.table(["server", "cycles/s", f"÷ {base}", "server µs/cycle", f"CPU ÷ {base}", "cores busy",
                            "loadgen cores",
                            "shard frames/cycle", "router frames/cycle", "requests/turn", "req p99 ms",
                            "cycle p99 ms", "errors"], table_rows))
    out += [
        "    server µs/cycle: CPU of the router and every shard (or the peer's process) over the run, warm-up "
        "included, ÷ cycles done in it;",
        "    cores busy: that CPU ÷ the loaded seconds (loadgen cores: the load generator's own); "
        "shard frames/cycle: frames between shards (sent and "
        "received on the links each shard opened) ÷ cycles;",
        "    router frames/cycle: the same on the routers' links to the shards; requests/turn: requests the "
        "shards executed ÷ event-loop turns that executed any",
        "",
        "targets (issue 27, this machine, same run)",
        bench.table(["what", "measured", "target"], targets(rows, labels)),
    ]
    for p in profiles:
        out += ["", f"profile of shard 0 at {p['shards']} shard(s), {fmt(p['cycles_per_s'])} cycles/s while "
                f"profiled: {p['note']}; {p['path']}"]
        out += [f"    {line}" for line in p["top"]] or ["    (no samples)"]
    failures = [f"  {label}: {failure}" for label, r in rows.items() for failure in r["failures"]]
    if failures:
        out += ["", "problems:"] + failures
    return "\n".join(out)


def targets(rows: Dict[str, Dict[str, Any]], labels: List[Tuple[str, str]]) -> List[List[str]]:
    """Issue 27's targets: CPU per cycle at more shards ÷ at the first count
    (1), and 1 shard's ÷ beanstalkd's; then, where the rows were run, the
    many-core ones (8 shards' throughput ÷ 1 shard's and the peers', durable
    8 shards ÷ Redis ``appendfsync always``, p99 ÷ beanstalkd's); each as measured."""
    def ran(label: str) -> Optional[Dict[str, Any]]:
        row = rows.get(label)
        return row if row is not None and row["runs"] else None

    ours = [label for label, kind in labels if kind == "workq" and ran(label)]
    if not ours:
        return []
    base = rows[ours[0]]
    out: List[List[str]] = []
    for label in ours[1:]:
        ratio = rows[label]["server_cpu_us_per_cycle"] / base["server_cpu_us_per_cycle"]
        out.append([f"server CPU per cycle, {label} ÷ {ours[0]}", f"{ratio:.2f}x", f"≤ {TARGET_CPU_RATIO:g}x"])
    bean, redis = ran("beanstalkd"), ran("redis")
    if bean is not None:
        ratio = base["server_cpu_us_per_cycle"] / bean["server_cpu_us_per_cycle"]
        out.append([f"server CPU per cycle, {ours[0]} ÷ beanstalkd", f"{ratio:.2f}x", f"≤ {TARGET_VS_BEANSTALKD:g}x"])
    many_label = our_label(MANY_CORE_SHARDS)
    many = ran(many_label)
    if many is None:
        return out
    many_core = "(a many-core host)"

    def versus(what: str, other: Optional[Dict[str, Any]], target: float) -> None:
        if other is not None and other["cycles_per_s"]:
            out.append([f"cycles/s, {many_label} ÷ {what}", f"{many['cycles_per_s'] / other['cycles_per_s']:.2f}x",
                        f"≥ {target:g}x {many_core}"])

    if ours[0] == our_label(1):
        versus(ours[0], base, TARGET_MANY_VS_ONE)
    versus("beanstalkd", bean, TARGET_MANY_VS_BEANSTALKD)
    versus("redis", redis, TARGET_MANY_VS_REDIS)
    durable, always = ran(durable_label(MANY_CORE_SHARDS)), ran(bench.DURABLE_LABELS["redis"])
    if durable is not None and always is not None and always["cycles_per_s"]:
        out.append([f"cycles/s, {durable_label(MANY_CORE_SHARDS)} ÷ {bench.DURABLE_LABELS['redis']}",
                    f"{durable['cycles_per_s'] / always['cycles_per_s']:.2f}x",
                    f"≥ {TARGET_DURABLE_VS_REDIS:g}x {many_core}"])
    if bean is not None and bean["request_p99_us"] and many["request_p99_us"] is not None:
        out.append([f"request p99, {many_label} ÷ beanstalkd", f"{many['request_p99_us'] / bean['request_p99_us']:.2f}x",
                    f"≤ {TARGET_P99_VS_BEANSTALKD:g}x {many_core}"])
    return out


# ---------------------------------------------------------------- running
def plan(opts: argparse.Namespace) -> List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]]:
    """(label, wire protocol, factory) of every server measured, in table order."""
    servers: List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]] = [
        (our_label(n), "workq", lambda n=n: bench.OurServer(n)) for n in opts.shards]
    most = MANY_CORE_SHARDS if MANY_CORE_SHARDS in opts.shards else max(opts.shards)   # the plain and durable rows'
    if opts.plain:
        servers.append((our_label(most) + ", plain Python", "workq plain", lambda: bench.OurServer(most, plain=True)))
    if not opts.no_peers:
        servers += [("beanstalkd", "beanstalkd", peers.Beanstalkd), ("redis", "redis", peers.Redis)]
    if opts.durable:
        where = opts.durable_dir
        for ms in opts.fsync_in_loop:
            label = durable_label(most) + ("" if ms == SLOW_SYNC_MS else f", fsync_in_loop {ms:g} ms")
            servers.append((label, "workq durable",
                            lambda ms=ms: bench.OurServer(most, durable=True, parent=where,
                                                          extra=["--fsync-in-loop", repr(ms)])))
        if not opts.no_peers:
            servers += [(bench.DURABLE_LABELS["redis"], "redis", lambda: peers.Redis(durable=True, parent=where)),
                        (bench.DURABLE_LABELS["beanstalkd"], "beanstalkd",
                         lambda: peers.Beanstalkd(durable=True, parent=where))]
    return servers


def our_label(shards: int) -> str:
    return f"ours, {shards} shard" + ("s" if shards > 1 else "")


def durable_label(shards: int) -> str:
    return f"ours durable (fsync always), {shards} shard" + ("s" if shards > 1 else "")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_cores.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=DEFAULT_SHARDS,
                        help="shard counts, each a row (default 1 2 4 8); the first is the ratios' base")
    parser.add_argument("--duration", type=float, help="measured seconds per run (default 6; 1 with --quick)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before (default 1; 0.3 with --quick)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per server, interleaved; medians (default 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 s runs, 6,400 jobs prefilled")
    parser.add_argument("--no-peers", action="store_true", help="ours only: no beanstalkd and Redis rows")
    parser.add_argument("--plain", action="store_true",
                        help=f"also {MANY_CORE_SHARDS} shards (if measured; else the largest count) as plain Python "
                        "(QS_PURE_PYTHON=1), for its p99")
    parser.add_argument("--durable", action="store_true",
                        help=f"also {MANY_CORE_SHARDS} shards (if measured; else the largest count) durable (--data-dir, "
                        "--fsync always), with Redis "
                        "appendfsync always and beanstalkd -b -f 0")
    parser.add_argument("--fsync-in-loop", type=float, nargs="+", default=[SLOW_SYNC_MS], metavar="MS",
                        help=f"with --durable: a durable row of ours for each (default {SLOW_SYNC_MS:g}, the "
                        "server's default; 0: every fsync in a thread while the shard's loop serves on)")
    parser.add_argument("--durable-dir", metavar="DIR",
                        help="where the durable servers' data goes (default: the system's temp dir)")
    parser.add_argument("--connections", type=int, default=128)
    parser.add_argument("--queues", type=int, default=64)
    parser.add_argument("--loadgen-procs", type=int, default=max(1, CORES // 3),
                        help=f"load generator processes (default: a third of the cores, here {max(1, CORES // 3)})")
    parser.add_argument("--prefill", type=int, help="jobs queued before each run (default 25,600; 6,400 with --quick)")
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--profile", metavar="DIR", help="then profile shard 0 at the first and the largest "
                        "shard count, into DIR")
    opts = parser.parse_args(argv)
    if opts.duration is None:
        opts.duration = 1.0 if opts.quick else 6.0
    if opts.warmup is None:
        opts.warmup = 0.3 if opts.quick else 1.0
    if opts.prefill is None:
        opts.prefill = 6_400 if opts.quick else 25_600
    opts.batch = 1   # what bench.load_spec asks for (the producer workload's; unused here)
    if opts.duration <= 0 or opts.warmup < 0 or opts.repeat < 1 or min(opts.shards) < 1:
        parser.error("--duration must be > 0, --warmup ≥ 0, --repeat and every --shards ≥ 1")
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, bench._raise_interrupt)
    servers = plan(opts)
    if not opts.no_peers:
        peers.ensure_installed()
    header = bench.run_header()
    header["load_before"] = load_average()
    if opts.durable:
        fstype, device, mount = bench.filesystem_of(opts.durable_dir or tempfile.gettempdir())
        probe = bench.fsync_probe(opts.durable_dir)
        header["durable"] = (f"durable rows' data on {fstype} ({device} at {mount}); one 128-byte append + "
                             f"fdatasync there: p50 {probe.get('p50', 0):.0f} µs, p99 {probe.get('p99', 0):.0f} µs")
    runs: Dict[str, List[Any]] = {label: [] for label, _, _ in servers}
    profiles: List[Dict[str, Any]] = []
    interrupted = False
    try:
        for round in range(opts.repeat):
            for label, kind, factory in servers:
                bench.progress(f"{label}: run {round + 1} of {opts.repeat} ...")
                try:
                    with factory() as server:
                        bench.announce(server)
                        if isinstance(server, bench.OurServer) and "build" not in header:
                            status = node_status(server)
                            header["build"] = ("compiled (mypyc)" if status["compiled"]
                                               else f"plain Python ({status['why_pure']})")
                        runs[label].append(measure(server, opts))
                except KeyboardInterrupt:
                    raise
                except Exception as err:  # one server failing must not hide the others' numbers
                    runs[label].append(f"{type(err).__name__}: {err}")
        if opts.profile:
            os.makedirs(opts.profile, exist_ok=True)
            for shards in sorted({opts.shards[0], max(opts.shards)}):
                bench.progress(f"profiling shard 0 of {shards} shard(s) ...")
                profiles.append(profile(opts, shards, opts.profile))
    except KeyboardInterrupt:
        interrupted = True
        bench.progress("interrupted: every server started has been stopped; partial results follow")
    header["load_after"] = load_average()
    rows = {label: summarize(r) for label, r in runs.items()}
    labels = [(label, kind) for label, kind, _ in servers]
    print(render(opts, header, rows, labels, profiles), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"header": header, "options": vars(opts), "rows": rows, "runs": runs,
                       "targets": [dict(zip(("what", "measured", "target"), t)) for t in targets(rows, labels)],
                       "profiles": profiles}, f, indent=2)
            f.write("\n")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
