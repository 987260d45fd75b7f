"""How fast the log acknowledges: ``python -m queueserver.store.bench``.

``--clients`` greenlets each append a job-sized record and wait for its
commit, as a shard's connections would; prints appends/s, fsyncs/s and
records per fsync for each policy, then the replay rate of what was written.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Dict, Union

import gevent

from .segments import recover
from .writer import POLICIES, AppendLog


def run(directory: str, policy: str, clients: int, records: int,
        payload: int) -> Dict[str, Union[str, int, float]]:
    rec = recover(directory, 0, 1)
    for _ in rec:
        pass
    wal = AppendLog(rec, policy=policy).start()
    body = b"x" * payload
    each = records // clients

    def client(c: int) -> None:
        for i in range(each):
            wal.append(("add", f"{c}-{i}", i, "bench", body, 0, 60, 0, 0, 0,
                        time.time_ns() // 1000, None, False))
            wal.sync()

    started = time.perf_counter()
    gevent.joinall([gevent.spawn(client, c) for c in range(clients)], raise_error=True)
    seconds = time.perf_counter() - started
    stats = wal.stats()
    wal.close()
    replay = recover(directory, 0, 1)
    count = sum(1 for _ in replay)
    return {"policy": policy, "clients": clients, "appends/s": stats["appended_records"] / seconds,
            "fsyncs/s": stats["fsyncs"] / seconds,
            "records/fsync": stats["fsynced_records"] / max(stats["fsyncs"], 1),
            "replayed/s": count / max(replay.seconds, 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to write (default: a temporary directory, removed)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--policy", choices=POLICIES, nargs="+", default=list(POLICIES))
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="qs-store-bench-")
    try:
        for policy in args.policy:
            for clients in args.clients:
                directory = os.path.join(base, f"{policy}-{clients}")
                shutil.rmtree(directory, ignore_errors=True)
                row = run(directory, policy, clients, args.records, args.payload)
                print("  ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in row.items()), flush=True)
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
