"""``queueserver history`` as a real process: what a user gets wrong is one line and status 2.

``--out`` naming a regular file, a damaged ``_checkpoint.json`` (on Spark
its Hadoop checksum sidecar no longer matches, so Hadoop's
``ChecksumException`` comes first; in Python it is not JSON) and a Java that
is not there (for ``--engine spark``) must each end in one ``queueserver
history: error: ...`` line, never a traceback. Where Spark had started,
its own start-up chatter comes before that line; a missing Java is found
before Spark starts, so there the line is all of stderr. A small history
needs no Java at all: ``--engine auto`` computes it in Python.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from queueserver.history.app import run

from serverproc import one_line_error, run_cli

PREFIX = "queueserver history: error: "
HISTORY_LINE = ('{"v":1,"time":1767225600000000,"shard":0,"event":"added","protocol":"workq",'
                '"queue":"q","id":"a","number":1,"attempt":0,"priority":0,"size":1,'
                '"outcome":null,"conn":null}\n')


def data_dir(root: Path) -> Path:
    path = root / "data" / "history" / "shard-0" / "history-1-000001.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(HISTORY_LINE)
    return root / "data"


def history(*args: str, env=None) -> subprocess.CompletedProcess:
    return run_cli("history", *args, timeout=300, env=env)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one error line of a run that got as far as starting Spark: the last line of stderr,
    after nothing but Spark's start-up chatter (no traceback, no Java exception)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and "py4j" not in result.stderr, result.stderr[-3000:]
    assert not any(line.startswith(("\tat ", "Caused by")) for line in lines), result.stderr[-3000:]
    assert [line for line in lines if line.startswith(PREFIX)] == lines[-1:], result.stderr[-3000:]
    return lines[-1]


def test_out_naming_a_regular_file(tmp_path):
    out = tmp_path / "report.txt"
    out.write_text("not a directory")
    line = error_line(history("--data-dir", str(data_dir(tmp_path)), "--out", str(out)))
    assert line == f"{PREFIX}--out {out} is a file, not a directory"
    assert out.read_text() == "not a directory"


@pytest.mark.parametrize("engine", ["spark", "python"])
def test_a_damaged_checkpoint_asks_for_a_rebuild(spark, tmp_path, engine):
    data, out = data_dir(tmp_path), tmp_path / "out"
    run([str(data / "history")], str(out), spark=spark)
    checkpoint = out / "_checkpoint.json"
    assert (out / "._checkpoint.json.crc").exists()         # Hadoop's checksum sidecar
    checkpoint.write_text('{"format": 1, "state": ')         # an editor, a full disk, a bad copy
    line = error_line(history("--data-dir", str(data), "--out", str(out), "--engine", engine))
    why = "ChecksumException: " if engine == "spark" else "Expecting value: "
    assert line.startswith(f"{PREFIX}cannot use the checkpoint {checkpoint} ({why}"), line
    assert line.endswith("); run again with --rebuild to read every file anew"), line
    rebuilt = run([str(data / "history")], str(out), spark=spark, rebuild=True)
    assert (rebuilt.jobs, rebuilt.new_files) == (1, 1)


@pytest.mark.parametrize("java", ["JAVA_HOME pointing nowhere", "no java on PATH"])
def test_java_missing(tmp_path, java):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    if java == "JAVA_HOME pointing nowhere":
        env["JAVA_HOME"] = str(tmp_path / "nowhere")
    else:
        env.pop("JAVA_HOME", None)
        env["PATH"] = str(tmp_path)                          # no java anywhere on it
    err = one_line_error(history("--data-dir", str(data_dir(tmp_path)), "--out",
                                 str(tmp_path / "out"), "--engine", "spark", env=env))
    assert err.startswith(PREFIX) and "Java 17" in err and "openjdk-17-jre-headless" in err, err
    assert not (tmp_path / "out").exists()


def test_a_small_history_needs_no_java(tmp_path):
    """Without any java, ``--engine auto`` (the default) computes a small history in Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", "JAVA_"))}
    env["PATH"] = str(tmp_path)                              # no java anywhere on it
    result = history("--data-dir", str(data_dir(tmp_path)), "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "queueserver history: 1 job in 1 queue" in result.stdout
    assert "in Python, without Spark" in result.stdout and "Traceback" not in result.stderr
    assert (tmp_path / "out" / "jobs").is_dir() and (tmp_path / "out" / "report.html").is_file()
