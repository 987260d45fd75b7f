"""History files written before a job's drop stopped being an outcome are read right.

Servers before this fix wrote a second final event when a finished job they
kept was dropped: ``expired`` when its TTL ran out, ``deleted`` when it was
deleted (a ``run`` job once its caller had the result). A job's outcome is
its FIRST final event (a take given back by ``returned`` aside), so those
files give the outcome, finish time, run time, per-minute counts and failed
list the clients saw, in one run and across incremental runs alike. A state
an older ``queueserver history`` left cannot be merged into: that is one
line asking for ``--rebuild``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from pyspark.sql import functions as F

from queueserver.history.app import run
from queueserver.history.errors import HistoryError

S = 1_000_000
T0 = 1_767_225_600 * S            # 2026-01-01 00:00:00 UTC
MINUTE = 60 * S
# id -> its events as (seconds after T0, event); what it ended as, for the client.
SCRIPTS: Dict[str, Tuple[List[Tuple[float, str]], str]] = {
    "completed-then-expired": ([(0, "added"), (1, "leased"), (2, "completed"), (300, "expired")],
                               "completed"),
    "failed-then-expired": ([(0, "added"), (1, "leased"), (3, "failed"), (300, "expired")], "failed"),
    "run-completed-then-deleted": ([(0, "added"), (1, "leased"), (4, "completed"), (4, "deleted")],
                                   "completed"),
    "taken-returned-completed": ([(0, "added"), (5, "taken"), (5, "returned"), (6, "leased"),
                                  (8, "completed")], "completed"),
    "expired": ([(0, "added"), (300, "expired")], "expired"),
}
FINAL = {"completed", "failed", "dead", "expired", "deleted", "taken"}


def line(id: str, seconds: float, event: str) -> str:
    """One line as a version-1 shard wrote it."""
    return json.dumps({
        "v": 1, "time": T0 + round(seconds * S), "shard": 0, "event": event,
        "protocol": "workq" if event in ("added", "leased") else None, "queue": "old", "id": id,
        "number": 1 + sorted(SCRIPTS).index(id), "attempt": 1 if event != "added" else 0,
        "priority": 0, "size": 1, "outcome": event if event in FINAL else None, "conn": None}) + "\n"


def write(path: Path, before: float, after: float = float("inf")) -> None:
    """The events in [before, after) s, in time order, appended to ``path``."""
    events = sorted((t, id, e) for id, (script, _) in SCRIPTS.items() for t, e in script
                    if before <= t < after)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(line(id, t, e) for t, id, e in events)


def check(spark, out: Path) -> None:
    jobs = {r.id: r for r in spark.read.parquet(str(out / "jobs")).select(
        "id", "outcome", "run_seconds", F.unix_micros("finished").alias("finished")).collect()}
    assert {id: r.outcome for id, r in jobs.items()} == {id: o for id, (_, o) in SCRIPTS.items()}
    assert jobs["completed-then-expired"].run_seconds == 1.0
    assert jobs["failed-then-expired"].run_seconds == 2.0
    assert jobs["completed-then-expired"].finished == T0 + 2 * S
    minutes = {r.minute: r for r in spark.read.parquet(str(out / "queue_minutes"))
               .select(F.unix_micros("minute").alias("minute"), "completed", "failed", "expired",
                       "deleted", "taken").collect()}
    first, drop = minutes[T0], minutes[T0 + 5 * MINUTE]
    assert (first.completed, first.failed, first.expired, first.deleted, first.taken) == (3, 1, 0, 0, 0)
    assert (drop.completed, drop.failed, drop.expired, drop.deleted) == (0, 0, 1, 0)
    failed = [(r.outcome, r.id) for r in spark.read.parquet(str(out / "failed")).collect()]
    assert failed == [("failed", "failed-then-expired")]
    assert spark.read.parquet(str(out / "stuck")).count() == 0


def test_old_files_give_each_jobs_first_outcome(spark, tmp_path):
    write(tmp_path / "history" / "shard-0" / "history-1-000001.jsonl", 0)
    summary = run([str(tmp_path / "history")], str(tmp_path / "out"), spark=spark)
    assert (summary.outcomes["completed"], summary.outcomes["failed"], summary.outcomes["expired"],
            summary.outcomes["deleted"]) == (3, 1, 1, 0)
    check(spark, tmp_path / "out")


def test_a_drop_read_in_a_later_run_changes_no_outcome(spark, tmp_path):
    path = tmp_path / "history" / "shard-0" / "history-1-000001.jsonl"
    write(path, 0, 60)
    run([str(tmp_path / "history")], str(tmp_path / "out"), spark=spark)
    write(path, 60)                           # the drops, read by the next run
    second = run([str(tmp_path / "history")], str(tmp_path / "out"), spark=spark)
    assert second.grown_files == 1
    check(spark, tmp_path / "out")


def test_the_state_of_an_older_version_asks_for_a_rebuild(spark, tmp_path):
    """An older version kept each job's latest final event: its state cannot be continued."""
    history, out = tmp_path / "history", tmp_path / "out"
    write(history / "shard-0" / "history-1-000001.jsonl", 0, 60)
    run([str(history)], str(out), spark=spark)
    checkpoint = out / "_checkpoint.json"
    older = json.loads(checkpoint.read_text())
    older["format"] = 1                       # what that version wrote, its checksum with it
    checkpoint.write_text(json.dumps(older))
    (out / "._checkpoint.json.crc").unlink()
    write(history / "shard-0" / "history-1-000001.jsonl", 60)
    with pytest.raises(HistoryError, match=r"format 1, expected 2: an older queueserver history "
                                           r"wrote it\); run again with --rebuild"):
        run([str(history)], str(out), spark=spark)
    run([str(history)], str(out), spark=spark, rebuild=True)
    check(spark, out)
