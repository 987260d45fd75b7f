"""What ``import queueserver`` costs each process of an install: mostly its
build check, which finds the compiled modules and compares each compiled
source with the build's record of its hash (``queueserver/__init__.py``,
``queueserver/buildrecord.py``).

Why: every process (the supervisor, each router and shard, every CLI
command) pays it once at start, before anything else of the package.

Each figure is the median over fresh interpreters of ``-X importtime``: the
package's own time (the check) and the record's module (what the
interpreter's start and ``typing`` cost is not counted: every module of
the package imports ``typing`` anyway). Run it with the install's Python,
e.g. a compiled ``make venv``:

    .venv/bin/python loadtests/import_cost.py [--runs 40]
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from typing import Dict, Tuple

CODE = "import queueserver as q; print(q.BUILD)"


def one_run(python: str) -> Tuple[Dict[str, Tuple[int, int]], str]:
    """``{module: (self µs, cumulative µs)}`` of one fresh interpreter's import, and what it said it runs."""
    done = subprocess.run([python, "-X", "importtime", "-c", CODE], capture_output=True, text=True,
                          check=True, cwd="/")
    rows = {m.group(3).strip(): (int(m.group(1)), int(m.group(2)))
            for m in re.finditer(r"import time:\s+(\d+) \|\s+(\d+) \|(.*)", done.stderr)}
    return rows, done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--python", default=sys.executable, help="the install's interpreter (default: this one)")
    args = parser.parse_args()
    one_run(args.python)   # (the first may write .pyc files)
    runs = [one_run(args.python) for _ in range(args.runs)]
    print(f"{runs[0][1]}; median of {args.runs} fresh interpreters:")
    parts = {"the package itself (the check)": lambda r: r["queueserver"][0],
             "queueserver.buildrecord": lambda r: r["queueserver.buildrecord"][1]}
    for name, part in parts.items():
        print(f"  {name:32} {statistics.median(part(r) for r, _ in runs) / 1000:6.2f} ms")
    total = statistics.median(sum(part(r) for part in parts.values()) for r, _ in runs)
    print(f"  {'together':32} {total / 1000:6.2f} ms")


if __name__ == "__main__":
    main()
