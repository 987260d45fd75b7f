"""Where a small ``queueserver history`` run's time goes, on Spark and in Python.

    python loadtests/history_small_bench.py [--events 7500] [--engines spark,python]
                                            [--dir DIR] [--json FILE]

Writes ``--events`` events of synthetic history (the generator of
``history_bench.py``: version-1 lines, one directory per shard) and runs
``queueserver history`` on them once per engine, each as a real process
(``--engine spark``, ``--engine python``), the way a user runs it. Each
run's wall time is split into what its log and summary say: for Spark,
starting Spark (the JVM and the SparkSession), the work (each stage), and
stopping Spark; for both, the process's own start (Python, imports) as the
rest. The summaries of the two runs must agree (the exit status is 1 when
they do not). A table goes to stdout; ``--json`` writes the figures too.
The history is removed at the end.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "loadtests"))

from history_bench import generate, machine  # noqa: E402

STAGE = re.compile(r" history INFO (.+): done in ([\d.]+) s$")
TOOK = re.compile(r"^  took ([\d.]+) s")


@dataclass
class Run:
    engine: str
    wall: float                                  # the process, start to exit
    took: float                                  # what the run itself measured
    stages: List[Tuple[str, float]] = field(default_factory=list)
    summary: str = ""

    def stage(self, name: str) -> float:
        return sum(s for what, s in self.stages if what == name)

    @property
    def process(self) -> float:
        """The process's own start and end: Python, its imports, the argument parsing."""
        return max(0.0, self.wall - self.took)


def run(engine: str, history: Path, out: Path) -> Run:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "queueserver", "history", "--input", str(history),
                           "--out", str(out), "--engine", engine],
                          capture_output=True, text=True, cwd=REPO, timeout=1800)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"the {engine} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    stages = [(m.group(1), float(m.group(2))) for line in proc.stderr.splitlines()
              if (m := STAGE.search(line))]
    took = next(float(m.group(1)) for line in proc.stdout.splitlines() if (m := TOOK.match(line)))
    summary = "\n".join(line for line in proc.stdout.splitlines()
                        if not TOOK.match(line)).replace(str(out), "OUT")
    return Run(engine, wall, took, stages, summary)


def _short(stage: str) -> str:
    """A stage's name without its paths and generation (``listing``, ``merging into state``)."""
    return re.sub(r" (state )?gen-\S+| /\S+", "", stage)


def render(events: int, records_bytes: int, runs: List[Run]) -> str:
    lines = [f"queueserver history on {events:,} events ({records_bytes:,} bytes), one process per engine",
             "", f"{'engine':8} {'wall s':>8} {'process s':>10} {'Spark start s':>14} {'work s':>8} "
             f"{'Spark stop s':>13}"]
    for r in runs:
        start, stop = r.stage("starting Spark"), r.stage("stopping Spark")
        lines.append(f"{r.engine:8} {r.wall:8.1f} {r.process:10.1f} "
                     f"{start if r.engine == 'spark' else 0:14.1f} {r.took - start - stop:8.1f} "
                     f"{stop:13.1f}")
    for r in runs:
        lines += ["", f"{r.engine} stages (s): " + ", ".join(f"{_short(what)} {s:.1f}"
                                                         for what, s in r.stages)]
    lines += ["", f"machine: {machine()}",
              f"command: python loadtests/history_small_bench.py {' '.join(sys.argv[1:])}".rstrip()]
    return "\n".join(lines)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=7500, help="events of history (default 7,500)")
    p.add_argument("--engines", default="spark,python", help="which, in order (default spark,python)")
    p.add_argument("--dir", default=None, help="where the temporary history goes (default: $TMPDIR)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON too")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="qs-history-small-", dir=opts.dir))
    try:
        history = generate(root, opts.events)
        runs = [run(engine, history.history(), root / f"out-{engine}")
                for engine in opts.engines.split(",")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(render(opts.events, history.bytes_first, runs), flush=True)
    problems = [f"the {r.engine} summary differs from the {runs[0].engine} one:\n{r.summary}\n---\n"
                f"{runs[0].summary}" for r in runs[1:] if r.summary != runs[0].summary]
    for problem in problems:
        print(f"problem: {problem}", flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            report: Dict[str, object] = {"events": opts.events, "bytes": history.bytes_first,
                                         "runs": [asdict(r) for r in runs], "problems": problems}
            json.dump(report, f, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
