"""``queueserver history`` submitted to a real Spark standalone cluster.

A master and one worker (1 core, 1 GiB) are started from the installed
pyspark on loopback, each in its own process group with private work, log,
local and conf directories; ``spark-submit queueserver/history/app.py`` runs
the synthetic history of ``test_history_spark`` on that cluster, and the
tables it writes must equal those of a local run over the same files.

The application uses no Python UDFs (``source.py`` parses with Spark's own
JSON functions), so the executors never run Python and need no copy of the
package: it is submitted without ``--py-files``, and the executor's log is
checked for the Python tasks that would show otherwise.

Master, worker (and the executor it launched) and spark-submit are stopped
in every case: SIGTERM to the process group, SIGKILL after a grace period,
and the teardown fails if any process of a group is still there.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from queueserver.history.app import run
from serverproc import poll, wait_for
from test_history_spark import JOBS, STALE_AFTER, write_history

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "queueserver" / "history" / "app.py"
HOST = "127.0.0.1"
APP_NAME = "queueserver history"
REGISTER_TIMEOUT = 90.0          # JVM start and the worker's registration, on a busy machine
SUBMIT_TIMEOUT = 240.0
STOP_GRACE = 20.0
# Short-lived JVMs on two shared cores: the C1 compiler only and the serial
# collector cut the run by about a third; they change no result.
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
TABLES = {"jobs": ("id",), "queue_minutes": ("queue", "minute"), "stuck": ("id",), "failed": ("id",)}
# What an executor logs for every task that runs Python (a UDF, mapInPandas, an RDD lambda).
PYTHON_TASK_MARKS = ("Starting Python task execution", "Times: total")


# --------------------------------------------------------------------------- processes
def _die_with_parent() -> None:
    """Linux: SIGTERM the child if the test process dies without its teardown."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def group_members(pgid: int) -> List[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue                      # gone meanwhile
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def start(argv: List[str], env: Dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    """``argv`` as the leader of a new session (and process group), output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE) -> None:
    """SIGTERM the process group, SIGKILL it if anything is left after ``grace`` s; fail if a
    member survives even that."""
    pgid = proc.pid                       # a session leader's group has its pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass                              # all gone already
    if not poll(lambda: proc.poll() is not None and not group_members(pgid), grace):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    assert poll(lambda: not group_members(pgid), 10), \
        f"processes of group {pgid} outlived SIGKILL: {group_members(pgid)}"


def free_ports(n: int) -> List[int]:
    """``n`` distinct ports free on loopback now (all held at once, so never the same twice)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} missing)"


# --------------------------------------------------------------------------- the cluster
@dataclass
class Cluster:
    url: str                    # spark://127.0.0.1:<port>
    webui: int
    env: Dict[str, str]
    root: Path
    work_dir: Path
    master: subprocess.Popen
    worker: subprocess.Popen

    def state(self) -> Optional[dict]:
        """The master's state (its web UI's JSON), or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.webui}/json/", timeout=5) as reply:
                return json.load(reply)
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
        return min(state.get("aliveworkers", 0), len(alive))

    def logs(self) -> str:
        return "\n".join(f"--- {name}:\n{tail(self.root / name)}"
                         for name in ("master.log", "worker.log"))


def spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home
    return Path(_find_spark_home())


def cluster_env(root: Path) -> Dict[str, str]:
    """The environment of every Spark process here: private directories, loopback, our Python."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_GATEWAY", "SPARK_"))}   # nothing of the test's own JVM
    for name in ("conf", "work", "local", "logs"):
        (root / name).mkdir()
    env.update(SPARK_HOME=str(spark_home()), SPARK_CONF_DIR=str(root / "conf"),
               SPARK_WORKER_DIR=str(root / "work"), SPARK_LOCAL_DIRS=str(root / "local"),
               SPARK_LOG_DIR=str(root / "logs"), SPARK_LOCAL_IP=HOST,
               SPARK_DAEMON_MEMORY="512m", SPARK_DAEMON_JAVA_OPTS=JAVA_OPTS,
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """A master and one registered worker; both stopped (worker first) whatever happens.

    The JVMs start here and register while the caller does other work:
    :func:`ready` waits for the worker."""
    root = tmp_path_factory.mktemp("standalone")
    env = cluster_env(root)
    port, webui, worker_webui = free_ports(3)
    spark_class = str(spark_home() / "bin" / "spark-class")
    with ExitStack() as stack:
        master = start([spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                        "--port", str(port), "--webui-port", str(webui)], env, root / "master.log", root)
        stack.callback(stop, master)
        url = f"spark://{HOST}:{port}"
        worker = start([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", HOST,
                        "--cores", "1", "--memory", "1g", "--webui-port", str(worker_webui),
                        "--work-dir", str(root / "work")], env, root / "worker.log", root)
        stack.callback(stop, worker)      # runs first: the worker before the master
        yield Cluster(url, webui, env, root, root / "work", master, worker)


def ready(cluster: Cluster) -> Cluster:
    """The cluster, once its worker has registered with the master."""
    def registered() -> bool:
        for proc, name in ((cluster.master, "master"), (cluster.worker, "worker")):
            if proc.poll() is not None:
                raise AssertionError(f"the {name} exited with status {proc.returncode}:\n"
                                     + cluster.logs())
        return cluster.alive_workers() >= 1

    wait_for(registered, REGISTER_TIMEOUT,
             lambda: f"the worker to register with the master:\n{cluster.logs()}")
    return cluster


# --------------------------------------------------------------------------- the runs
@dataclass
class Runs:
    spark: Any                  # the shared SparkSession
    history: Path
    local_out: Path
    local_summary: str
    cluster_out: Path
    output: str                 # spark-submit's stdout (the app's log lines and summary)
    cluster: Cluster


class Submitted:
    """``spark-submit app.py`` to the cluster, running in its own process group."""

    def __init__(self, cluster: Cluster, history: Path, out: Path) -> None:
        self.cluster = cluster
        self.log = cluster.root / "submit.log"
        argv = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.url,
                "--conf", "spark.ui.enabled=false", "--conf", f"spark.driver.host={HOST}",
                "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.executor.memory=512m",
                "--driver-java-options", JAVA_OPTS,
                "--conf", f"spark.executor.extraJavaOptions={JAVA_OPTS}",
                str(APP), "--input", str(history), "--out", str(out),
                "--stale-after", str(STALE_AFTER)]
        self.out = cluster.root / "submit.out"
        with open(self.log, "wb") as err, open(self.out, "wb") as out:
            self.proc = subprocess.Popen(argv, env=cluster.env, cwd=cluster.root,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         start_new_session=True, preexec_fn=_die_with_parent)

    def output(self) -> str:
        """Its stdout (the app's log lines, then the summary), once it has succeeded."""
        try:
            self.proc.wait(SUBMIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"spark-submit ran for more than {SUBMIT_TIMEOUT:g} s:\n"
                                 f"{tail(self.log)}\n{self.cluster.logs()}") from None
        finally:
            self.stop()
        text = self.out.read_text(errors="replace")
        assert self.proc.returncode == 0, (f"spark-submit failed ({self.proc.returncode}):\n"
                                           f"{text[-3000:]}\n{tail(self.log)}")
        return text

    def stop(self) -> None:
        """Stop it (its Python driver too) if anything of it still runs."""
        stop(self.proc)


@pytest.fixture(scope="module")
def runs(cluster, request, tmp_path_factory) -> Runs:
    """The whole history run on the cluster and, meanwhile, locally.

    The shared session (conftest's ``spark``) is asked for only once the
    cluster's JVMs are starting, so that both start together."""
    spark = request.getfixturevalue("spark")
    root = tmp_path_factory.mktemp("history")
    write_history(root, 1)
    write_history(root, 2)             # the complete history, a partial last line included
    history = root / "history"
    local_out, cluster_out = root / "local", root / "cluster"
    submitted = Submitted(ready(cluster), history, cluster_out)
    try:
        local = run([str(history)], str(local_out), spark=spark, stale_after=STALE_AFTER)
        output = submitted.output()
    finally:
        submitted.stop()
    return Runs(spark, history, local_out, local.format(), cluster_out, output, cluster)


def table_rows(spark, path: Path, order) -> list:
    frame = spark.read.parquet(str(path))
    return [r.asDict() for r in frame.orderBy(*order).collect()]


# --------------------------------------------------------------------------- tests
def test_cluster_tables_equal_the_local_ones(runs):
    spark = runs.spark
    for table, order in TABLES.items():
        local = spark.read.parquet(str(runs.local_out / table))
        remote = spark.read.parquet(str(runs.cluster_out / table))
        assert remote.schema == local.schema, table
        expected = table_rows(spark, runs.local_out / table, order)
        assert expected, f"the local {table} table is empty"
        assert table_rows(spark, runs.cluster_out / table, order) == expected, table
    assert spark.read.parquet(str(runs.cluster_out / "jobs")).count() == len(JOBS)

    def layout(out: Path) -> List[str]:
        return sorted(str(p.relative_to(out)) for p in (out / "jobs").glob("date=*/queue=*"))

    assert layout(runs.cluster_out) == layout(runs.local_out) != []
    assert (runs.cluster_out / "report.html").stat().st_size > 0
    checkpoint = json.loads((runs.cluster_out / "_checkpoint.json").read_text())
    assert os.listdir(runs.cluster_out / "_state") == [checkpoint["state"]]


def test_the_submitted_app_prints_the_local_summary(runs):
    """The same summary, but for the last line: how long each run took (on Spark, since
    spark-submit ran it)."""
    printed = runs.output[runs.output.index("queueserver history: "):].strip().splitlines()
    local = runs.local_summary.replace(str(runs.local_out), str(runs.cluster_out)).splitlines()
    assert printed[:-1] == local[:-1]
    assert re.fullmatch(r"  took [\d.]+ s on Spark: starting Spark [\d.]+ s, work [\d.]+ s, "
                        r"stopping Spark [\d.]+ s \(run by spark-submit\)", printed[-1]), printed[-1]


def test_the_work_ran_on_the_worker_without_python(runs):
    """The master saw the application finish; its executor on the worker ran the tasks, none of
    them Python (so the package need not be shipped with --py-files)."""
    state = runs.cluster.state()
    assert state is not None, runs.cluster.logs()
    apps = state["completedapps"]
    assert [(a["name"], a["state"]) for a in apps] == [(APP_NAME, "FINISHED")], apps
    logs = sorted(runs.cluster.work_dir.glob(f"{apps[0]['id']}/*/stderr"))
    assert logs, f"no executor log under {runs.cluster.work_dir}"
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    assert "CoarseGrainedExecutorBackend" in text and "Finished task" in text, text[-3000:]
    for mark in PYTHON_TASK_MARKS:
        assert mark not in text, f"an executor ran Python ({mark!r}): ship the package with --py-files"
