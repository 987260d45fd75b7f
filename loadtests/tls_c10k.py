"""C10K over TLS: idle TLS connections held while the cycle load runs.

Why: a TLS connection keeps its TLS state, for as long as it is open, in
the process that did its handshake: with the direct path the shard it was
handed to, else the router. What a crowd of idle ones costs is that
memory per connection and whatever it does to the clients that work; and
a crowd must be held whole (nothing refused, every one still served at
the end).

One server, workq's TLS port beside its plain one (``--client-ca``: client
certificates required), ``max_connections`` above the crowd. First the
cycle load (``bench.py``'s workload 1) over TLS and over plain with no
crowd; then ``--idle`` TLS connections are opened by ``--holders``
processes, each handshake done, and left idle; the server's memory (PSS,
all its processes) before and after, divided by their number, is each
one's cost (the router's and the shards' shares apart); the same
loads run again beside them; at the end every idle connection sends one
request and must get its answer. Loopback only; every step is bounded.

    .venv/bin/python loadtests/tls_c10k.py                          # 10,000 idle, 1 shard, 5 s loads
    .venv/bin/python loadtests/tls_c10k.py --idle 2000 --shards 2 --client-ca
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import re
import resource
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402
import loadgen  # noqa: E402
from loadgen import CYCLE, LoadSpec  # noqa: E402
from queueserver import BUILD  # noqa: E402

OPEN_TIMEOUT = 300.0      # seconds for all holders to open their share
CHECK_TIMEOUT = 120.0     # seconds for every idle connection to answer its request
#: what the server logs when it turns a client away (queueserver/router, queueserver/net/connection.py)
REFUSAL_LINES = re.compile(r"max_connections|out of file descriptors|TLS (handshake|error) with|"
                           r"not done within|refused")


# ------------------------------------------------------------ the idle crowd
def _hold(spec: LoadSpec, count: int, pipe: Any) -> None:
    """A holder process: open ``count`` TLS connections, report, wait; on
    "check" send one request on each and read its answer; on "close" go."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    context = loadgen.tls_context(spec.tls_certificate)
    socks = []
    failures, first_error = 0, ""
    for _ in range(count):
        try:
            socks.append(loadgen.connect(spec, 30, context))
        except OSError as err:
            failures += 1
            first_error = first_error or f"{type(err).__name__}: {err}"
    pipe.send((len(socks), failures, first_error))
    while True:
        command = pipe.recv()
        if command == "check":
            pipe.send(_answered(socks))
        else:
            for sock in socks:
                sock.close()
            pipe.send(None)
            return


def _answered(socks: List[Any]) -> Tuple[int, str]:
    """Send each connection one request for a queue that is not there (at 1
    shard, the shard that terminated its TLS answers it); how many answered
    it, and the first thing that went wrong."""
    sent = []
    problem = ""
    for sock in socks:
        try:
            sock.sendall(b"inspect queue idle-%s\r\n" % str(uuid.uuid4()).encode())
            sent.append(sock)
        except OSError as err:
            problem = problem or f"send: {err}"
    answered = 0
    for sock in sent:
        try:
            reply = loadgen._read_lines(sock, 1, 30.0)
        except OSError as err:
            problem = problem or f"read: {err}"
            continue
        if reply == b"-NOT-FOUND\r\n":
            answered += 1
        else:
            problem = problem or f"answer {reply[:60]!r}"
    return answered, problem


class IdleCrowd:
    """``count`` idle TLS connections, split over ``holders`` forked processes."""

    def __init__(self, spec: LoadSpec, count: int, holders: int) -> None:
        self.count = count
        self.pipes = []
        self.procs = []
        ctx = mp.get_context("fork")
        for h in range(holders):
            parent, child = ctx.Pipe()
            share = count // holders + (1 if h < count % holders else 0)
            proc = ctx.Process(target=_hold, args=(spec, share, child), daemon=True)
            self.procs.append(proc)
            self.pipes.append(parent)
            proc.start()
            child.close()

    def opened(self) -> Tuple[int, int, str]:
        """(connections open, connections that failed, the first failure)."""
        results = [self._receive(pipe, OPEN_TIMEOUT) for pipe in self.pipes]
        return (sum(r[0] for r in results), sum(r[1] for r in results),
                next((r[2] for r in results if r[2]), ""))

    def answered(self) -> Tuple[int, str]:
        """(connections that answered one request each, the first problem)."""
        for pipe in self.pipes:
            pipe.send("check")
        results = [self._receive(pipe, CHECK_TIMEOUT) for pipe in self.pipes]
        return sum(r[0] for r in results), next((r[1] for r in results if r[1]), "")

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send("close")
                self._receive(pipe, 30.0)
            except (OSError, RuntimeError):
                pass
        for proc in self.procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()

    @staticmethod
    def _receive(pipe: Any, timeout: float) -> Any:
        if not pipe.poll(timeout):
            raise RuntimeError(f"an idle-connection holder was silent for {timeout:.0f} s")
        return pipe.recv()

    def __enter__(self) -> "IdleCrowd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------ the run
def _load(server: bench.OurServer, spec: LoadSpec, crowd: str, port: str) -> List[str]:
    """One cycle load's row; a load that could not run is a row that says why."""
    try:
        return _row(crowd, port, bench.cycle_run(server, spec))
    except RuntimeError as err:
        return [crowd, port] + ["-"] * 5 + [f"failed: {err}"]


def _row(crowd: str, port: str, r: Dict[str, Any]) -> List[str]:
    per = r["cpu_us_per_cycle"]
    router = sum(v for k, v in per.items() if not k.startswith("shard"))
    shards = sum(v for k, v in per.items() if k.startswith("shard"))
    lat = r["latency_us"]
    return [crowd, port, bench.fmt_num(r["ops_per_s"]), bench.fmt_num(lat.get("p50"), 0),
            bench.fmt_num(lat.get("p99"), 0), f"{router:.1f}", f"{shards:.1f}", str(r["errors"])]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tls_c10k.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=10_000, help="idle TLS connections held (default 10,000)")
    parser.add_argument("--holders", type=int, default=2, help="processes holding them")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds of each load")
    parser.add_argument("--client-ca", action="store_true", help="clients must present a certificate")
    args = parser.parse_args(argv)
    opts = bench.parse_args(["--duration", str(args.duration)])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    share = -(-args.idle // max(1, args.holders))
    if not 0 < args.idle or not 0 < args.holders or share + 64 > hard:
        parser.error(f"each holder would need {share} descriptors; the hard limit is {hard}: "
                     f"give more --holders")
    if not 0 < args.duration <= 600:
        parser.error("--duration must be in (0, 600] s")
    limit = args.idle + opts.connections + 64   # the crowd, the load, the prefill and a margin
    print(f"# {bench.cpu_model()}, {os.cpu_count()} CPUs, {BUILD}, load average {os.getloadavg()[0]:.2f}",
          flush=True)
    with bench.OurServer(args.shards, tls=True, beside_plain=True, client_ca=args.client_ca,
                         extra=["--max-connections", str(limit)]) as server:
        tls_spec = bench.load_spec(server, opts, CYCLE)
        plain_spec = dataclasses.replace(tls_spec, port=server.server.port("workq"), tls=False,
                                         tls_certificate=None)
        loadgen.prefill(plain_spec, opts.prefill)
        loads = [("TLS", tls_spec), ("plain", plain_spec)]
        rows = [_load(server, spec, "none", port) for port, spec in loads]
        pids = server.pids()
        before = bench._steady_rss(pids)
        started = time.monotonic()
        with IdleCrowd(tls_spec, args.idle, args.holders) as crowd:
            opened, failed, first_failure = crowd.opened()
            open_s = time.monotonic() - started
            after = bench._steady_rss(pids)
            rows += [_load(server, spec, f"{opened:,} idle TLS", port) for port, spec in loads]
            answered, problem = crowd.answered()
        refusals = [line for line in server.server.log().splitlines() if REFUSAL_LINES.search(line)]
    per_router = (after["router"] - before["router"]) / max(1, opened)
    per_shards = sum(after[role] - before[role] for role in after if role.startswith("shard")) / max(1, opened)
    per_server = (sum(after.values()) - sum(before.values())) / max(1, opened)
    print(bench.table(["idle crowd", "load port", "cycles/s", "p50 µs", "p99 µs", "router µs/cycle",
                       "shards µs/cycle", "errors"], rows))
    print(f"\n{opened:,} of {args.idle:,} idle TLS connections opened in {open_s:.1f} s "
          f"({opened / max(open_s, 1e-9):,.0f} handshakes/s, {args.holders} holder processes"
          f"{', client certificates' if args.client_ca else ''}); {failed} failed{': ' + first_failure if failed else ''}")
    print(f"server PSS {sum(before.values()) / 2**20:.1f} MiB -> {sum(after.values()) / 2**20:.1f} MiB: "
          f"{per_server / 1024:.1f} KiB per idle TLS connection (router {per_router / 1024:.1f} KiB, "
          f"shards {per_shards / 1024:.1f} KiB)")
    print(f"{answered:,} of {opened:,} idle connections answered one request at the end"
          f"{'; first problem: ' + problem if problem else ''}")
    print(f"server log: {len(refusals)} refusal lines" + "".join(f"\n  {line}" for line in refusals[:5]))
    errors = any(row[-1] != "0" for row in rows)
    held = opened == args.idle and failed == 0 and answered == opened and not errors and not refusals
    print(f"nothing refused: {'yes' if held else 'NO'}")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
