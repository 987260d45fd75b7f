"""``make loadtest``: start a server on loopback, run locust headless for a
bounded time, print its summary, stop the server.

    python loadtests/loadtest.py [--users 32] [--spawn-rate 16] [--time 20s]
                                 [--shards N] [--csv PREFIX] [-- extra locust args]

For a distributed run against a server you started yourself, run locust
directly: ``locust -f loadtests/locustfile.py --master --headless -u 200 -r 50
-t 2m --host tcp://SERVER:9922 --expect-workers 4`` on one machine and
``locust -f loadtests/locustfile.py --worker --master-host MASTER`` on each
worker machine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from queueserver.testing.serverprocess import ServerProcess, ServerStartError

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", "-u", type=int, default=32)
    parser.add_argument("--spawn-rate", "-r", type=float, default=16)
    parser.add_argument("--time", "-t", default="20s", help="run time, e.g. 20s, 2m")
    parser.add_argument("--shards", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--csv", default=os.path.join(HERE, "results", "locust"),
                        help="CSV prefix for locust's stats files")
    parser.add_argument("locust_args", nargs="*", help="extra arguments for locust (after --)")
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(args.csv), exist_ok=True)
    try:
        server = ServerProcess(shards=args.shards, protocols=["workq"]).start()
    except ServerStartError as err:
        raise SystemExit(f"the server did not start: {err}")
    try:
        command = [sys.executable, "-m", "locust", "-f", os.path.join(HERE, "locustfile.py"),
                   "--headless", "-u", str(args.users), "-r", str(args.spawn_rate),
                   "-t", args.time, "--stop-timeout", "5", "--csv", args.csv,
                   "--host", f"tcp://127.0.0.1:{server.port('workq')}", "--only-summary",
                   *args.locust_args]
        print("running:", " ".join(command), flush=True)
        result = subprocess.run(command, timeout=_seconds(args.time) + 120)
        # locust exits 1 when any request failed; the summary above says which.
        return result.returncode
    finally:
        server.stop()


def _seconds(spec: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    total, number = 0, ""
    for ch in spec:
        if ch.isdigit():
            number += ch
        else:
            total += int(number or 0) * units[ch]
            number = ""
    return total + int(number or 0)


if __name__ == "__main__":
    sys.exit(main())
