"""History files of both schema versions, read by ``queueserver history`` on a real local Spark.

Shards now write version 2 (one JSON array per line, fields by position);
files of version 1 (one JSON object per line) stay readable. The synthetic
history of ``test_history_spark`` is written once as version 1 and once
with two of its three shards' files turned into arrays (old and new files
side by side, as after an upgrade): the tables and counts must be the same.
Broken arrays are malformed lines, an array of another version is counted
as that version, and a partial array at a file's end is left for later.
"""
from __future__ import annotations

import json
from pathlib import Path

from queueserver.history.app import run
from queueserver.history.schema import ARRAY_FIELDS
from queueserver.shard.history import FIELDS

from test_history_spark import FILES, STALE_AFTER

BROKEN = (b'[2,"too few"]\n'                                                    # malformed
          b'[2,1709247600000000,0,"added",null,"q","id-x","many",0,0,1,null]\n'  # malformed
          b'[3,1709247600000000,0,"added",null,"q","id-y",1,0,0,1,null]\n'       # version 3
          b'[2,1709247600000000,0,"added",null,"q","id-z",1,0,0')               # partial


def as_arrays(data: bytes) -> bytes:
    """Every complete version-1 line of ``data`` as the version-2 array a shard writes now."""
    lines = data.split(b"\n")
    for i, line in enumerate(lines[:-1]):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("v") == 1:
            lines[i] = json.dumps([2, *(record[f] for f in FIELDS[1:])], separators=(",", ":")).encode()
    return b"\n".join(lines)


def write(root: Path, arrays: bool) -> Path:
    history = root / "history"
    for f in FILES:
        path = history / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(as_arrays(f.data) if arrays and not f.path.startswith("shard-1/") else f.data)
    if arrays:
        (history / "shard-9").mkdir()
        (history / "shard-9" / "history-1-000001.jsonl").write_bytes(BROKEN)
    return history


def table(spark, path: Path, *order: str) -> list:
    return [r.asDict() for r in spark.read.parquet(str(path)).orderBy(*order).collect()]


def test_the_reader_and_writer_agree_on_the_fields():
    assert ARRAY_FIELDS == FIELDS


def test_arrays_and_objects_give_the_same_tables(spark, tmp_path):
    old = run([str(write(tmp_path / "v1", arrays=False))], str(tmp_path / "out1"), spark=spark,
              stale_after=STALE_AFTER)
    new = run([str(write(tmp_path / "v2", arrays=True))], str(tmp_path / "out2"), spark=spark,
              stale_after=STALE_AFTER)
    assert new.records == old.records > 0
    assert new.outcomes == old.outcomes
    assert new.malformed == old.malformed + 2
    assert new.unknown_versions == {**old.unknown_versions, 3: 1}
    assert new.partial_lines == old.partial_lines + 1
    for name, order in (("jobs", ("queue", "id")), ("queue_minutes", ("queue", "minute")),
                        ("stuck", ("id",)), ("failed", ("id",))):
        assert table(spark, tmp_path / "out2" / name, *order) == \
            table(spark, tmp_path / "out1" / name, *order), name
