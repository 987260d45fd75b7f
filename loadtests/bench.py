"""``make bench``: our server against beanstalkd and Redis, one run, one table.

Why one command: a throughput figure means little without a peer measured
the same way on the same machine at the same moment (this is a noisy 2-core
VM; ±15% run to run). So this starts, on loopback, our server with 1 shard
and with N shards (N = CPU count), beanstalkd and redis-server; drives each
with the same load generator (``loadgen.py``); stops every one of them
(always: on error, Ctrl-C or SIGTERM too); and prints throughput, latency,
server CPU per cycle with a projection to more cores, memory per queued job,
and the targets beside the measurements. Each workload gets a fresh server.

Then the same workloads once more with durable servers (section 5): ours
with ``--data-dir`` and ``--fsync always``, beanstalkd with a binlog fsynced
on every write (``-b DIR -f 0``), Redis with ``--appendonly yes
--appendfsync always``, every one's data in its own temporary directory
(``--durable-dir`` picks where; it is removed afterwards). For ours the
shards' shutdown lines (``shard N log: ... fsyncs ...``) give fsyncs per
second and records per fsync, and a recovery run queues jobs, stops the
server and times its start from the log (``shard N recovered ...``).
``--only-durable`` runs just that section, ``--no-durable`` skips it.

Server CPU is read from ``/proc/<pid>/stat`` (utime + stime) of every server
process before and after a run, memory from ``/proc/<pid>/smaps_rollup``
(proportional set size: what the processes share counted once).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import loadgen  # noqa: E402
import peers  # noqa: E402
from loadgen import CYCLE, PRODUCE, LoadResult, LoadSpec  # noqa: E402
from queueserver import __version__  # noqa: E402
from queueserver.testing.serverprocess import ServerProcess  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
PROJECT_CORES = (4, 8, 16)
VERSION_NAMES = {"workq": "queueserver"}

TARGET_VS_BEANSTALKD = 1.0     # ours (N shards) cycles/s ÷ beanstalkd's
TARGET_CPU_US = 40.0           # router + shard CPU per cycle
TARGET_BYTES_PER_JOB = 350.0   # RSS per queued job beyond the payload
TARGET_P99_US = 2000.0         # per-request p99, full cycle
TARGET_DURABLE_VS_REDIS = 1.0      # ours --fsync always cycles/s ÷ Redis appendfsync always
AIM_DURABLE_VS_BEANSTALKD = 5.0    # ours --fsync always cycles/s ÷ beanstalkd -b -f 0
TARGET_RECOVERY_S = 10.0           # restart with the recovery jobs queued until serving

DURABLE_START_TIMEOUT = 600.0      # a start that recovers a large log may take a while
DURABLE_LABELS = {"beanstalkd": "beanstalkd -b -f 0", "redis": "redis appendfsync always"}
#: Each durable shard's line at shutdown (queueserver/shard/process.py).
SHARD_LOG_LINE = re.compile(
    r"shard (\d+) log: (\d+) records appended, (\d+) fsyncs, (\d+) records fsynced "
    r"\(at most (\d+) in one\), (\d+) write errors, (\d+) compactions, "
    r"worst compaction pause ([\d.]+) ms")
#: Each durable shard's line once it has replayed its log at start.
SHARD_RECOVERED_LINE = re.compile(
    r"shard (\d+) recovered (\d+) jobs in (\d+) queues from (\d+) log records in ([\d.]+) s")


# ---------------------------------------------------------------- /proc
def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int:
    """The process's proportional set size (``Pss`` in smaps_rollup): its
    resident memory, with each page shared by several processes split among
    them, so that summing over a server's processes counts once what they
    share (our shards' table of job ids, the libraries); VmRSS where the
    kernel has no smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def filesystem_of(path: str) -> Tuple[str, str, str]:
    """(type, device, mount point) of the filesystem holding ``path``, from /proc/self/mounts."""
    path = os.path.realpath(path)
    best = ("?", "?", "")
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                mount = mount.replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[2]):
                    best = (fstype, device, mount)
    except OSError:
        pass
    return best


def dir_bytes(path: str) -> int:
    """Bytes in the files under ``path``."""
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def fsync_probe(parent: Optional[str], count: int = 200, size: int = 128) -> Dict[str, float]:
    """Latency percentiles (µs) of ``count`` appends of ``size`` bytes, each
    followed by fdatasync (as our log does), in a scratch file on the durable
    servers' filesystem: the floor under every durable acknowledgement there."""
    scratch = tempfile.mkdtemp(prefix="qs-bench-fsync-", dir=parent)
    samples: List[int] = []
    try:
        fd = os.open(os.path.join(scratch, "probe"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            data = b"x" * size
            for _ in range(count):
                started = time.perf_counter_ns()
                os.write(fd, data)
                os.fdatasync(fd)
                samples.append(time.perf_counter_ns() - started)
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return loadgen.percentiles(samples)


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
    """``queueserver serve`` with only the workq listener, on a port the kernel picks.

    ``durable``: with ``--data-dir`` (in this server's temporary directory)
    and ``--fsync always``. A durable server can be stopped and started again
    on the same data (:meth:`end_run` returns the run's server log, then
    :meth:`start`); the data directory goes with :meth:`stop`.
    """

    protocol = "workq"

    def __init__(self, shards: int, durable: bool = False, parent: Optional[str] = None,
                 history: bool = True, tls: bool = False, beside_plain: bool = False,
                 client_ca: bool = False, extra: Sequence[str] = (), plain: bool = False) -> None:
        """``plain``: the server runs as plain Python (``QS_PURE_PYTHON=1``) even where it is compiled."""
        super().__init__(parent)
        self.shards = shards
        self.durable = durable
        self.tls = tls
        self.label = (_our_label(shards, durable, history) + (" over TLS" if tls else "")
                      + (", plain Python" if plain else ""))
        self.data_dir = os.path.join(self.tmp, "data") if durable else None
        # workq's port over TLS (beside its plain one), a self-signed certificate (which clients present too)
        self.certificate: Optional[Tuple[str, str]] = None
        flags = list(extra)
        if tls:
            self.certificate, tls_flags = _tls_flags(self.tmp, beside_plain, client_ca)
            flags += tls_flags
        if durable:
            durable_flags = ["--data-dir", str(self.data_dir), "--fsync", "always"]
            if not history:   # the job history is on wherever there is a data directory
                config = os.path.join(self.tmp, "no-history.toml")
                with open(config, "w") as f:
                    f.write("[history]\nenabled = false\n")
                durable_flags = ["--config", config] + durable_flags
            self.server = ServerProcess(shards=shards, protocols=["workq"], extra=durable_flags + flags,
                                        startup_timeout=DURABLE_START_TIMEOUT, preexec=_pure if plain else None)
        else:
            self.server = ServerProcess(shards=shards, protocols=["workq"], extra=flags,
                                        preexec=_pure if plain else None)
        self._pids: Dict[str, int] = {}
        self.ready_s = 0.0     # the latest start: from spawning it until ports.json appeared

    def start(self) -> "OurServer":
        self.version = __version__
        started = time.monotonic()
        self.server.start()
        self.ready_s = time.monotonic() - started
        self.port = self.server.port("workq_tls" if self.tls else "workq")
        self._pids = self.server.child_pids()
        shards = [role for role in self._pids if role.startswith("shard-")]
        if len(shards) != self.shards or len(self._pids) == len(shards):
            raise RuntimeError(f"expected routers and {self.shards} shards, found {self._pids}")
        return self

    def pids(self) -> Dict[str, int]:
        return dict(self._pids)

    def end_run(self) -> str:
        """Stop the server (SIGTERM: its shards close their logs and write
        their shutdown lines) and return everything it logged in this run.
        The data directory stays, for the next :meth:`start`."""
        self.server.stop(peers.STOP_TIMEOUT)
        if self.server.returncode != 0:
            raise RuntimeError(f"the server exited with status {self.server.returncode} at stop:\n"
                               f"{self.server.log_tail()}")
        return self.server.log()

    def stop(self) -> None:
        self.server.stop(peers.STOP_TIMEOUT)
        super().stop()


def _pure() -> None:
    """In the server's process before it starts: run as plain Python (``queueserver/__init__.py``)."""
    os.environ["QS_PURE_PYTHON"] = "1"


# ---------------------------------------------------------------- measuring
def server_cpu(server: peers.ServerUnderTest) -> Dict[str, float]:
    return {role: cpu_seconds(pid) for role, pid in server.pids().items()}


def measure_cycle(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """Workload (1), plus the CPU each server process spent on it (workload 3)."""
    spec = load_spec(server, opts, CYCLE)
    loadgen.prefill(spec, opts.prefill)
    return cycle_run(server, spec)


def cycle_run(server: peers.ServerUnderTest, spec: LoadSpec) -> Dict[str, Any]:
    """One full-cycle run of ``spec`` with the CPU each server process spent on it."""
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
    return _result_dict(loadgen.run(load_spec(server, opts, PRODUCE)))


def measure_memory(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """RSS of all the server's processes after queueing ``--memory-jobs`` jobs, minus before.

    Every server process counts (ours: the router with its job directory, and
    each shard). The "after" figure is taken once the processes' RSS has stopped
    moving (replies drained, a router that learns of jobs from the shards caught
    up), not at a fixed moment.
    """
    pids = server.pids()
    before = {role: rss_bytes(pid) for role, pid in pids.items()}
    spec = load_spec(server, opts, PRODUCE)
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


def measure_durable_cycle(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """Workload (1) on a durable server, with what its log did (ours).

    Ours is stopped and started again between the prefill and the run: a
    shard's log counters cover its process's whole life and are only told at
    shutdown, so this way they count the run (warm-up included) and not the
    pipelined prefill. The run then serves the prefilled jobs as recovered
    from the log."""
    spec = load_spec(server, opts, CYCLE)
    loadgen.prefill(spec, opts.prefill)
    if isinstance(server, OurServer):
        server.end_run()
        server.start()
        announce(server, "started again after the prefill")
        spec = load_spec(server, opts, CYCLE)     # a new port
    out = cycle_run(server, spec)
    return _durable_figures(server, out, spec)


def measure_durable_produce(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """Workload (2) on a durable server, with what its log did (ours)."""
    spec = load_spec(server, opts, PRODUCE)
    before = server_cpu(server)
    result = loadgen.run(spec)
    after = server_cpu(server)
    out = _result_dict(result)
    out["cpu_us_per_job"] = {role: (after[role] - before[role]) / max(1, result.total_ops) * 1e6
                             for role in before}
    return _durable_figures(server, out, spec)


def _durable_figures(server: peers.ServerUnderTest, out: Dict[str, Any], spec: LoadSpec) -> Dict[str, Any]:
    """Add the server's own word on its persistence, and for ours stop it and
    add its shards' log counters over the run: fsyncs ÷ the loaded seconds
    (warm-up + measured: the counters cannot tell them apart), records ÷ fsyncs."""
    out["durability"] = server.durability()
    if isinstance(server, OurServer):
        loaded_s = spec.warmup + spec.duration
        stats = shard_log_stats(server.end_run(), server.shards)
        if out["total_ops"] > 0 and stats["fsyncs"] == 0:
            raise RuntimeError(f"the shards logged no fsync for {out['total_ops']} operations: not durable")
        out["log"] = dict(stats, loaded_s=loaded_s,
                          fsyncs_per_s=stats["fsyncs"] / loaded_s,
                          records_per_fsync=stats["fsynced_records"] / stats["fsyncs"] if stats["fsyncs"] else 0.0,
                          records_per_op=stats["appended_records"] / out["total_ops"] if out["total_ops"] else 0.0)
    return out


def measure_recovery(server: peers.ServerUnderTest, opts: argparse.Namespace) -> Dict[str, Any]:
    """Queue ``--recovery-jobs`` jobs (pipelined producer) into a durable
    server of ours, stop it, start it again on the same data and take from
    its log how long each shard took to replay its log, and the wall time from
    spawning the server until it served (its ports.json appeared)."""
    assert isinstance(server, OurServer) and server.data_dir is not None
    spec = load_spec(server, opts, PRODUCE)
    spec.warmup, spec.duration, spec.max_ops = 0.0, 600.0, opts.recovery_jobs
    spec.ttl_ms = 3_600_000
    started = time.monotonic()
    result = loadgen.run(spec)
    queue_s = time.monotonic() - started
    written = shard_log_stats(server.end_run(), server.shards)
    log_bytes = dir_bytes(server.data_dir)
    server.start()
    announce(server, f"started again on {result.ops:,} queued jobs")
    ready_s = server.ready_s
    recovered = shard_recovery_lines(server.end_run(), server.shards)
    return {"jobs": result.ops, "errors": result.errors, "queue_s": queue_s, "log_bytes": log_bytes,
            "records_written": written["appended_records"], "fsyncs_while_queueing": written["fsyncs"],
            "recovered_jobs": sum(r["jobs"] for r in recovered.values()),
            "recovered_queues": sum(r["queues"] for r in recovered.values()),
            "recovered_records": sum(r["records"] for r in recovered.values()),
            "recovery_s_max": max(r["seconds"] for r in recovered.values()),
            "recovery_s_by_shard": {str(i): r["seconds"] for i, r in recovered.items()},
            "ready_s": ready_s}


def shard_log_stats(text: str, shards: int) -> Dict[str, Any]:
    """The shards' shutdown lines in one run's server log, summed over shards
    (maxima for the per-fsync and pause figures). Every shard must have one."""
    lines = {int(m[0]): m for m in SHARD_LOG_LINE.findall(text)}
    if sorted(lines) != list(range(shards)):
        raise RuntimeError(f"expected a 'shard N log:' line at shutdown from each of {shards} shards, "
                           f"found {sorted(lines) or 'none'}")
    def total(i: int) -> int:
        return sum(int(m[i]) for m in lines.values())
    return {"appended_records": total(1), "fsyncs": total(2), "fsynced_records": total(3),
            "max_records_per_fsync": max(int(m[4]) for m in lines.values()), "write_errors": total(5),
            "compactions": total(6), "worst_compaction_pause_ms": max(float(m[7]) for m in lines.values())}


def shard_recovery_lines(text: str, shards: int) -> Dict[int, Dict[str, Any]]:
    """Shard index -> what its 'recovered' line says, for every shard."""
    lines = {int(m[0]): {"jobs": int(m[1]), "queues": int(m[2]), "records": int(m[3]), "seconds": float(m[4])}
             for m in SHARD_RECOVERED_LINE.findall(text)}
    if sorted(lines) != list(range(shards)):
        raise RuntimeError(f"expected a 'shard N recovered' line from each of {shards} shards, "
                           f"found {sorted(lines) or 'none'}")
    return lines


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


def load_spec(server: peers.ServerUnderTest, opts: argparse.Namespace, workload: str) -> LoadSpec:
    return LoadSpec(protocol=server.protocol, port=server.port, workload=workload,
                    connections=opts.connections, procs=opts.loadgen_procs, warmup=opts.warmup,
                    duration=opts.duration, batch=opts.batch, queues=opts.queues,
                    payload=opts.payload, tls=getattr(server, "tls", False),
                    tls_certificate=getattr(server, "certificate", None))


def _tls_flags(directory: str, beside_plain: bool = False,
               client_ca: bool = False) -> Tuple[Tuple[str, str], List[str]]:
    """A self-signed certificate and key made in ``directory`` (``openssl``),
    and the ``serve`` flags for workq over TLS with them: only TLS, or a TLS
    port beside the plain one; with ``client_ca``, clients must present a
    certificate, and the same self-signed one is the CA that vouches for it
    (what a client certificate costs, without a PKI)."""
    cert, key = os.path.join(directory, "server.pem"), os.path.join(directory, "server.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    os.chmod(key, 0o600)
    flags = ["--tls-certificate", cert, "--tls-key", key]
    flags += ["--workq-tls", "both", "--workq-tls-port", "0"] if beside_plain else ["--workq-tls", "true"]
    return (cert, key), flags + (["--tls-client-ca", cert] if client_ca else [])


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
def run_header() -> Dict[str, Any]:
    """When, on what machine, by which command: the head of every report."""
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

    def __init__(self, opts: argparse.Namespace, servers: List[Tuple[str, str]],
                 durable: Optional[List[Tuple[str, str]]] = None) -> None:
        self.opts = opts
        self.servers = servers                      # (label, kind) in table order
        self.durable = list(durable or [])          # the same for section (5)
        self.results: Dict[str, Dict[str, Any]] = {label: {} for label, _ in servers + self.durable}
        self.versions: Dict[str, str] = {}
        self.header = self._header()
        self.durable_fs = filesystem_of(opts.durable_dir or tempfile.gettempdir()) if self.durable else None
        self.disk: Dict[str, float] = {}            # fsync_probe() on that filesystem

    def _header(self) -> Dict[str, Any]:
        return run_header()

    def record(self, label: str, key: str, value: Any) -> None:
        self.results[label][key] = value

    def _get(self, label: str, key: str) -> Optional[Dict[str, Any]]:
        value = self.results.get(label, {}).get(key)
        return value if isinstance(value, dict) else None

    def _ours_labels(self) -> List[str]:
        return [label for label, kind in self.servers if kind == "workq"]

    def _ratio_cols(self, key: str, label: str, ours_labels: List[str]) -> List[str]:
        cells = []
        mine = self._get(label, key)
        for ours in ours_labels:
            theirs = self._get(ours, key)
            if mine and theirs and mine["ops_per_s"] > 0:
                cells.append(f"{theirs['ops_per_s'] / mine['ops_per_s']:.2f}x")
            else:
                cells.append("-")
        return cells

    def render(self) -> str:
        sections: List[Callable[[], List[str]]] = [self._render_header]
        if self.servers:
            sections += [self._render_cycle, self._render_produce, self._render_cpu, self._render_memory]
        if self.durable:
            sections.append(self._render_durable)
        if self.servers:
            sections.append(self._render_targets)
        sections.append(self._render_problems)
        return "\n".join(line for section in sections for line in section())

    def _n_label(self) -> Optional[str]:
        """Our N-shard server's label: the one the targets are about."""
        ours = self._ours_labels()
        return ours[-1] if ours else None

    def _section_table(self, key: str, headers: List[str],
                       row: Callable[[str, str, Dict[str, Any]], List[str]],
                       ratios: bool = False, not_run_rows: bool = True,
                       servers: Optional[List[Tuple[str, str]]] = None, ratio_head: str = "{} ÷ this") -> str:
        """A table of one result ``key``, a row per server (of ``servers``,
        default the in-memory ones): ``row(label, kind, result)`` where there
        is a result, else "failed" or "not run" (the latter left out unless
        ``not_run_rows``). With ``ratios``, a column per server of ours: its
        throughput ÷ this row's (headed ``ratio_head`` with its label)."""
        servers = self.servers if servers is None else servers
        ours = [label for label, kind in servers if kind == "workq"]
        ratio_heads = [ratio_head.format(label) for label in ours] if ratios else []
        rows = []
        for label, kind in servers:
            result = self._get(label, key)
            if result is not None:
                rows.append(row(label, kind, result) + (self._ratio_cols(key, label, ours) if ratios else []))
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

    def _render_durable(self) -> List[str]:
        o = self.opts
        fstype, device, mount = self.durable_fs or ("?", "?", "?")
        ours = self._durable_ours()
        return [
            "(5) durable: workloads (1) and (2) again, every change on disk before it is acknowledged",
            f"    ours ({o.shards} shards): --data-dir in the server's temp dir, --fsync always "
            "(an answer goes out after the fsync that covers it; group commit);",
            "    beanstalkd: -b DIR -f 0 (binlog, fsync on every write); redis: --appendonly yes "
            "--appendfsync always (AOF fsynced before the replies), no RDB;",
            f"    data on {fstype} ({device} at {mount}); each server's data directory is removed with it",
            "    that disk: a 128-byte append + fdatasync took " + (
                f"p50 {fmt_num(self.disk.get('p50'))} µs, p99 {fmt_num(self.disk.get('p99'))} µs "
                f"(200 in a row, one writer: ≈ {fmt_num(1e6 / self.disk['p50'])} fsyncs/s)"
                if self.disk.get("p50") else "not measured"),
            "    ours is restarted after the prefill so its shards' log counters (their 'shard N log:' lines at "
            "shutdown,",
            "    summed over shards) cover the run alone: fsyncs/s = fsyncs ÷ warm-up + measured s, "
            "records/fsync = records fsynced ÷ fsyncs",
            "  full job cycle (as (1))",
            self._section_table("cycle", ["server", "cycles/s", "req p50 µs", "req p99 µs", "cycle p50 µs",
                                          "cycle p99 µs", "errors", "server µs/cycle", "fsyncs/s",
                                          "records/fsync"],
                                self._durable_cycle_row, ratios=True, servers=self.durable,
                                ratio_head="ours ÷ this"),
            f"  producer only, pipelined (as (2), {o.batch} enqueues per write)",
            self._section_table("produce", ["server", "jobs/s", "batch p50 µs", "batch p99 µs", "errors",
                                            "server µs/job", "fsyncs/s", "records/fsync"],
                                self._durable_produce_row, ratios=True, servers=self.durable,
                                ratio_head="ours ÷ this"),
            f"  recovery: {o.recovery_jobs:,} jobs of {o.payload} bytes queued by the pipelined producer, the "
            "server stopped (SIGTERM) and started again on its data",
            "    'shards' = the slowest shard's own figure ('shard N recovered ... in S s'); 'until serving' = "
            "from spawning the server until its ports.json appeared",
            self._section_table("recovery", ["server", "jobs queued", "queued in s", "log MiB",
                                             "jobs recovered", "log records read", "shards s", "until serving s"],
                                self._recovery_row, not_run_rows=False, servers=self.durable)
            if ours else "    (ours not run)",
            f"  durable targets ({ours or 'ours'})",
            table(["what", "measured", "target", ""], [list(row) for row in self.durable_targets()]),
            "",
        ]

    def _durable_ours(self) -> Optional[str]:
        return next((label for label, kind in self.durable if kind == "workq"), None)

    @staticmethod
    def _log_cells(r: Dict[str, Any]) -> List[str]:
        log = r.get("log")
        if not log:
            return ["-", "-"]
        return [fmt_num(log["fsyncs_per_s"]), fmt_num(log["records_per_fsync"], 1)]

    def _durable_cycle_row(self, label: str, kind: str, r: Dict[str, Any]) -> List[str]:
        return (self._cycle_row(label, kind, r)[:-1] + [fmt_num(sum(r["cpu_us_per_cycle"].values()), 1)]
                + self._log_cells(r))

    def _durable_produce_row(self, label: str, kind: str, r: Dict[str, Any]) -> List[str]:
        return (self._produce_row(label, kind, r) + [fmt_num(sum(r["cpu_us_per_job"].values()), 1)]
                + self._log_cells(r))

    @staticmethod
    def _recovery_row(label: str, kind: str, r: Dict[str, Any]) -> List[str]:
        return [label, fmt_num(r["jobs"]), fmt_num(r["queue_s"], 1), fmt_num(r["log_bytes"] / 1048576, 1),
                fmt_num(r["recovered_jobs"]), fmt_num(r["recovered_records"]), fmt_num(r["recovery_s_max"], 2),
                fmt_num(r["ready_s"], 2)]

    def durable_targets(self) -> List[Tuple[str, str, str, str]]:
        ours = self._durable_ours()
        rows: List[Tuple[str, str, str, str]] = []

        def verdict(ok: Optional[bool]) -> str:
            return "-" if ok is None else ("met" if ok else "MISSED")

        cycle = self._get(ours, "cycle") if ours else None
        for kind, goal, word in (("redis", TARGET_DURABLE_VS_REDIS, "≥"),
                                 ("beanstalkd", AIM_DURABLE_VS_BEANSTALKD, "aim ≥")):
            peer = DURABLE_LABELS[kind]
            theirs = self._get(peer, "cycle")
            ratio = (cycle["ops_per_s"] / theirs["ops_per_s"]
                     if cycle and theirs and theirs["ops_per_s"] else None)
            rows.append((f"durable full cycle vs {peer}", f"{ratio:.2f}x" if ratio is not None else "-",
                         f"{word} {goal:.1f}x", verdict(None if ratio is None else ratio >= goal)))
        rec = self._get(ours, "recovery") if ours else None
        jobs = f"{rec['jobs']:,}" if rec else f"{self.opts.recovery_jobs:,}"
        for what, key in ((f"recovery of {jobs} jobs, slowest shard", "recovery_s_max"),
                          (f"restart on {jobs} jobs until serving", "ready_s")):
            value = rec[key] if rec else None
            rows.append((what, f"{value:.2f} s" if value is not None else "-", f"< {TARGET_RECOVERY_S:g} s",
                         verdict(None if value is None else value < TARGET_RECOVERY_S)))
        quiet = self._get(_our_label(self.opts.shards, True, history=False), "cycle")
        if cycle and quiet and quiet["ops_per_s"]:
            cost = 1 - cycle["ops_per_s"] / quiet["ops_per_s"]
            rows.append(("full cycle, history on vs off", f"{cost:+.1%} slower" if cost > 0 else
                         f"{-cost:.1%} faster", "≤ 10% slower", verdict(cost <= 0.10)))
        rows.append(("every queued job recovered",
                     f"{rec['recovered_jobs']:,} of {rec['jobs']:,}" if rec else "-", "all",
                     verdict(None if rec is None else rec["recovered_jobs"] == rec["jobs"] and not rec["errors"])))
        return rows

    def _render_targets(self) -> List[str]:
        return [f"targets ({self._n_label() or 'ours'})",
                table(["what", "measured", "target", ""], [list(row) for row in self.targets()])]

    def _render_problems(self) -> List[str]:
        problems = self.problems()
        return ["", "problems:"] + [f"  {p}" for p in problems] if problems else []

    def _error(self, label: str, key: str) -> str:
        value = self.results.get(label, {}).get(key)
        return "failed (see problems)" if isinstance(value, str) else "not run"

    def problems(self) -> List[str]:
        found = [f"{label} / {key}: {value}" for label, results in self.results.items()
                 for key, value in results.items() if isinstance(value, str)]
        if self.durable_fs and self.durable_fs[0] in ("tmpfs", "ramfs"):
            found.append(f"durable data on {self.durable_fs[0]} ({self.durable_fs[2]}): an fsync costs "
                         "nothing there, so section (5) measures no disk; give --durable-dir on a disk")
        return found

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
        def rows(targets: List[Tuple[str, str, str, str]]) -> List[Dict[str, str]]:
            return [dict(zip(("what", "measured", "target", "verdict"), t)) for t in targets]
        out = {"header": self.header, "options": vars(self.opts), "versions": self.versions,
               "results": self.results, "targets": rows(self.targets()) if self.servers else []}
        if self.durable:
            out["durable_targets"] = rows(self.durable_targets())
            out["durable_filesystem"] = dict(zip(("type", "device", "mount"), self.durable_fs or ()))
            out["durable_fsync_probe_us"] = self.disk
        return out


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


def plan_durable(opts: argparse.Namespace) -> List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]]:
    """The same for section (5): ours with N shards and the peers, all durable."""
    if opts.no_durable:
        return []
    parent = opts.durable_dir
    servers: List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]] = []
    if opts.only in (None, "ours"):
        servers.append((_our_label(opts.shards, True), "workq",
                        lambda: OurServer(opts.shards, durable=True, parent=parent)))
        servers.append((_our_label(opts.shards, True, history=False), "workq",
                        lambda: OurServer(opts.shards, durable=True, parent=parent, history=False)))
    if opts.only in (None, "beanstalkd"):
        servers.append((DURABLE_LABELS["beanstalkd"], "beanstalkd",
                        lambda: peers.Beanstalkd(durable=True, parent=parent)))
    if opts.only in (None, "redis"):
        servers.append((DURABLE_LABELS["redis"], "redis", lambda: peers.Redis(durable=True, parent=parent)))
    return servers


def _our_label(shards: int, durable: bool = False, history: bool = True) -> str:
    return (f"ours, {shards} shard" + ("s" if shards > 1 else "") + (", fsync always" if durable else "")
            + ("" if history else ", no history"))


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
            _run_one(opts, report, label, key, factory, measure)


def run_durable(opts: argparse.Namespace, report: Report,
                servers: List[Tuple[str, str, Callable[[], peers.ServerUnderTest]]]) -> None:
    """Section (5): the full cycle and the producer on every durable server,
    then the recovery run on ours; each on a fresh server that is always
    stopped, its data directory removed with it."""
    if not servers:
        return
    report.disk = fsync_probe(opts.durable_dir)
    steps: List[Tuple[str, Callable[..., Dict[str, Any]]]] = [
        ("cycle", measure_durable_cycle), ("produce", measure_durable_produce), ("recovery", measure_recovery)]
    for key, measure in steps:
        for label, kind, factory in servers:
            if key == "recovery" and (kind != "workq" or label != servers[0][0]):
                continue   # recovery: ours with its defaults only
            _run_one(opts, report, label, key, factory, measure)


def _run_one(opts: argparse.Namespace, report: Report, label: str, key: str,
             factory: Callable[[], peers.ServerUnderTest], measure: Callable[..., Dict[str, Any]]) -> None:
    progress(f"{label}: {key} ...")
    started = time.monotonic()
    try:
        with factory() as server:
            announce(server)
            if isinstance(server, OurServer) and server.data_dir:
                progress(f"{label}: data in {server.data_dir}")
            report.versions[VERSION_NAMES.get(server.protocol, server.protocol)] = server.version
            report.record(label, key, measure(server, opts))
    except KeyboardInterrupt:
        raise
    except Exception as err:  # one server failing must not hide the others' numbers
        report.record(label, key, f"{type(err).__name__}: {err}")
    progress(f"{label}: {key} done in {time.monotonic() - started:.1f} s")


def announce(server: peers.ServerUnderTest, what: str = "") -> None:
    """The server's port and pids on stderr (the smoke test checks these pids are gone at the end)."""
    progress(f"{server.label}: {what + ', ' if what else ''}{server.protocol} on {peers.HOST}:{server.port}, "
              f"pids {json.dumps(server.pids())}")


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench.py", description="Benchmark our server against beanstalkd and Redis (loopback only).")
    parser.add_argument("--duration", type=float, help="measured seconds per workload per server "
                        "(default 10; 1 with --quick)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each measurement "
                        "(default 1; 0.3 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 s per workload, 0.3 s warm-up, 20,000 jobs for memory and recovery")
    parser.add_argument("--only", choices=("ours", "beanstalkd", "redis"), help="measure one server kind")
    durable = parser.add_mutually_exclusive_group()
    durable.add_argument("--only-durable", action="store_true",
                         help="run only section (5), the durable servers")
    durable.add_argument("--no-durable", action="store_true", help="skip section (5), the durable servers")
    parser.add_argument("--durable-dir", metavar="DIR", help="where the durable servers' temporary data "
                        "directories go (default: the system's temp dir; it should be on a disk, not tmpfs)")
    parser.add_argument("--recovery-jobs", type=int, default=None, help="jobs queued before the recovery "
                        "restart (default 1,000,000; 20,000 with --quick)")
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
    if opts.recovery_jobs is None:
        opts.recovery_jobs = 20_000 if opts.quick else 1_000_000
    if opts.duration <= 0 or opts.warmup < 0 or opts.memory_jobs < 1 or opts.recovery_jobs < 1:
        parser.error("--duration must be > 0, --warmup ≥ 0, --memory-jobs and --recovery-jobs ≥ 1")
    if opts.durable_dir is not None:
        if not os.path.isdir(opts.durable_dir):
            parser.error(f"--durable-dir {opts.durable_dir}: not a directory")
        opts.durable_dir = os.path.abspath(opts.durable_dir)
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    servers = [] if opts.only_durable else plan(opts)
    durable = plan_durable(opts)
    report = Report(opts, [(label, kind) for label, kind, _ in servers],
                    [(label, kind) for label, kind, _ in durable])
    if any(kind != "workq" for _, kind, _ in servers + durable):
        peers.ensure_installed()
    interrupted = False
    try:
        run_all(opts, report, servers)
        run_durable(opts, report, durable)
    except KeyboardInterrupt:
        interrupted = True
        progress("interrupted: every server started has been stopped; partial results follow")
    text = report.render()
    print(text, flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
