"""How soon after exec a client may connect, and how soon it is answered.

Why: a client started with its server (the original workq suite's
TestCmdLog connects 100 ms after exec, with no retry) is refused if the
ports are not yet bound. This starts ``queueserver serve`` on a fresh (or,
with ``--jobs``, a filled) data directory again and again, connecting every
millisecond from the moment of exec, and reports the medians and worst of:
exec -> the workq port accepts (target: within 100 ms), and exec -> the
first answer (the routers serve, the logs replayed).

    .venv/bin/python loadtests/startup_bench.py --shards 1 2 3 --repeat 5
    .venv/bin/python loadtests/startup_bench.py --shards 2 --jobs 100000
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import List, Optional, Tuple

ONLY_WORKQ = ["--no-takeanumber", "--no-goqueue", "--no-queued", "--no-taskflux"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(data: str, shards: int, port: int) -> subprocess.Popen:
    return subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "queueserver"), "serve",
                             "--shards", str(shards), "--workq-port", str(port), "--metrics-port", "0",
                             *ONLY_WORKQ, "--data-dir", data], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def one_start(data: str, shards: int) -> Tuple[float, float]:
    """(ms from exec to an accepted connection, ms from exec to its first answer)."""
    port = free_port()
    started = time.monotonic()
    proc = serve(data, shards, port)
    try:
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                break
            except ConnectionRefusedError:
                time.sleep(0.001)
        bound = time.monotonic()
        sock.sendall(b"inspect server\r\n")
        assert sock.recv(4096).startswith(b"+OK"), "not answered"
        answered = time.monotonic()
        sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    return (bound - started) * 1000, (answered - started) * 1000


def fill(data: str, shards: int, jobs: int) -> None:
    port = free_port()
    proc = serve(data, shards, port)
    try:
        for _ in range(3000):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                break
            except ConnectionRefusedError:
                time.sleep(0.01)
        for start in range(0, jobs, 1000):
            batch = b"".join(b"add %s q%d 60000 86400000 4\r\nping\r\n" % (str(uuid.uuid4()).encode(), i % 64)
                             for i in range(start, min(jobs, start + 1000)))
            sock.sendall(batch)
            got = b""
            while got.count(b"\r\n") < min(1000, jobs - start):
                got += sock.recv(65536)
        sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="startup_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=0, help="jobs in the data directory (replayed at each start)")
    args = parser.parse_args(argv)
    print(f"{'shards':>6} {'jobs':>8} {'bound ms (median / max)':>24} {'answered ms (median / max)':>27}")
    for shards in args.shards:
        top = tempfile.mkdtemp(prefix="qs-startup-")
        try:
            data = os.path.join(top, "data")
            if args.jobs:
                fill(data, shards, args.jobs)
            runs = []
            for _ in range(args.repeat):
                if not args.jobs:
                    shutil.rmtree(data, ignore_errors=True)   # a clean start each time
                runs.append(one_start(data, shards))
            bound = [b for b, _ in runs]
            answered = [a for _, a in runs]
            print(f"{shards:>6} {args.jobs:>8} {statistics.median(bound):>14.0f} / {max(bound):>6.0f} "
                  f"{statistics.median(answered):>17.0f} / {max(answered):>6.0f}")
        finally:
            shutil.rmtree(top, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
