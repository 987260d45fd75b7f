"""The documented DataFrame writer example runs as written, as a user runs it.

The one ``python`` code block of docs/history-and-spark.md (its "DataFrame
→ queue" section) is saved as a script and run in a fresh venv the way a user would
run it: by the venv's python, from another directory, with the venv NOT on
``PATH`` (so a bare ``python3`` there is another Python, without
queueserver) and none of the suite's ``PYSPARK_*``/``SPARK_*`` settings.
Its rows must then be jobs on a real server. The only change made to the
code is the server's port: the page's server listens on workq's default,
this one on a free port.

The fresh venv gets no download: a ``.pth`` file shows it the checkout and
this venv's packages, what ``pip install -e '.[spark]'`` would give it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List

from queueserver.client import Client, TimedOut
from queueserver.protocols import DEFAULT_PORTS
from queueserver.spark import job_id

from serverproc import ServerProcess

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "history-and-spark.md"
SECTION = "## DataFrame → queue"


def documented_example() -> str:
    """The code of the page's only ``python`` block, which is in its DataFrame section."""
    text = PAGE.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
    assert len(blocks) == 1, f"expected one python block in {PAGE.name}, found {len(blocks)}"
    section = text[text.index(SECTION):]
    end = section.find("\n## ", len(SECTION))
    assert blocks[0] in (section if end < 0 else section[:end]), f"the example is not under {SECTION!r}"
    return blocks[0]


def fresh_venv(root: Path) -> Path:
    """A new venv with queueserver and its Spark extra (see the module's docstring): its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "queueserver-checkout.pth").write_text(f"{REPO}\n{sysconfig.get_paths()['purelib']}\n")
    return python


def user_env() -> Dict[str, str]:
    """This process's environment as a user's shell would have it: no venv on PATH."""
    venvs = {os.path.realpath(os.path.dirname(sys.executable))}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_")) and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and os.path.realpath(p) not in venvs)
    return env


def drain(port: int, queue: str) -> List[tuple]:
    jobs = []
    with Client(port=port) as client:
        while True:
            try:
                job = client.lease([queue], 0)
            except TimedOut:
                return jobs
            jobs.append((job.id, job.payload))
            client.complete(job.id)


def test_the_documented_writer_example_runs_as_written(tmp_path):
    code = documented_example()
    default = str(DEFAULT_PORTS["workq"])
    assert code.count(default) == 1, f"the example names the workq port {default} once"
    queue = re.search(r'option\("queue", "([^"]+)"\)', code).group(1)
    rows = re.findall(r'\((\d+), "([^"]+)"\)', code)
    assert rows, "the example's rows are (key, payload) pairs"
    python = fresh_venv(tmp_path / "venv")
    with ServerProcess(protocols=["workq"]) as proc:
        port = proc.port("workq")
        script = tmp_path / "emails.py"
        script.write_text(code.replace(default, str(port)))
        result = subprocess.run([str(python), str(script)], cwd=tmp_path, env=user_env(),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        assert sorted(drain(port, queue)) == sorted((job_id(int(key)), payload.encode())
                                                    for key, payload in rows)
