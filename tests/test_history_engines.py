"""The two engines of ``queueserver history`` give the same output on the same history.

The Python engine (queueserver/history/python_engine.py) computes a small
local history in this process, from the same definitions Spark runs
(queueserver/history/frame.py). On the synthetic history of
test_history_spark (every outcome, both schema versions, a malformed line,
a partial last line) and a file of odd lines, both engines must write the
same tables (rows and column types), the same state, the same summary and
the same report (but for its timing); each must continue incrementally
from the other's checkpoint and state; and both readers must classify
every odd line alike. Spark runs three times here, on the suite's session.
"""
from __future__ import annotations

import glob
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pyarrow.dataset as ds
import pytest

from queueserver.history import app, pysource, source
from queueserver.history.app import choose_engine, run
from queueserver.history.checkpoint import Plan
from queueserver.history.errors import HistoryError

from test_history_spark import STALE_AFTER, write_history

TABLES = {"jobs": ("id",), "queue_minutes": ("queue", "minute"), "stuck": ("id",), "failed": ("id",),
          "_state/*/jobs": ("id",), "_state/*/minutes": ("queue", "minute")}
ODD_LINES = [
    b'{"v":1,"time":1709247600000000,"shard":0,"event":"added","protocol":"workq","queue":"q",'
    b'"id":"a","number":1,"attempt":0,"priority":0,"size":1,"outcome":null,"conn":null}',
    b'   ',                                                                 # blank
    b'',
    b'{"v":1,"time":"1709247600000000","event":"added","queue":"q","id":"b"}',   # a long as a string
    b'{"v":1,"time":1.5,"event":"added","queue":"q","id":"c"}',                  # a long as a float
    b'{"v":1,"time":1709247600000000,"event":"added","queue":5,"id":"d"}',       # a string as a number
    b'{"v":1,"time":1709247600000000,"event":"added","queue":{"x":[1,2]},"id":"e"}',   # ... an object
    b'{"v":1,"time":1709247600000000,"event":"added","queue":true,"id":"f"}',
    b'{"v":1,"time":1709247600000000,"event":"added","id":"g"}',                 # no queue
    b'{"v":1,"time":1709247600000000,"event":"exploded","queue":"q","id":"h"}',  # no such event
    b'{"v":1,"time":99999999999999999999,"event":"added","queue":"q","id":"i"}',  # over 64 bits
    b'{"v":1,"time":1709247600000000,"event":"added","queue":"q","id":"j","extra":[1]}',
    b'{"v":"1","time":1709247600000000,"event":"added","queue":"q","id":"k"}',
    b'{"v":2,"time":1709247600000000,"event":"added","queue":"q","id":"l"}',     # another version
    b'{"v":1,"time":1709247600000000,"event":"added","queue":"q","id":"m"}\r',   # CRLF
    b'{"v":1,"time":1709247600000000,"event":"added","queue":"q\\u00e9","id":"n"}',
    b'[2,1709247600000000,0,"added","workq","q","o",1,0,0,1,null]',
    b'[2,"1709247600000000",0,"added","workq","q","p"," 7 ",0,0,1,null]',       # numbers as strings
    b'[2,1709247600000000,0,"added","workq","q","r",1.5,0,0,1,null]',          # a float number
    b'[2,1709247600000000,0,"added",7,"q","s",1,0,0,1,{"a":1}]',               # strings as JSON
    b'[2,1709247600000000,0,"added","workq","q","t",1,0,0,1]',                  # too few
    b'["2",1709247600000000,0,"taken","queued","q","u",1,0,0,1,null]',
    b'[3,1709247600000000,0,"added","workq","q","v",1,0,0,1,null]',            # version 3
    b'[]',
    b'[2,1709247600000000,0,"added",null,"q",null,1,0,0,1,null]',              # no id
    b' [2,1709247600000000,0,"added",null,"q","w",1,0,0,1,null]',             # not at the start
    b'5',
    b'"text"',
    b'{not json',
    b'{"v":1,"time":1709247600000000,"event":"completed","queue":"q","id":"x","outcome":"failed"}',
    b'[2,1709247600000000,0,"added","workq","q","y",1,0,0,1,null',              # a partial last line
]


def table(path: str, keys: Tuple[str, ...]) -> Tuple[List[Dict[str, Any]], List[Tuple[str, str]]]:
    """A table's rows (sorted) and its columns and types, read with pyarrow, whoever wrote it."""
    data = ds.dataset(glob.glob(path)[0], format="parquet", partitioning="hive").to_table()
    types = [(f.name, str(f.type)) for f in data.schema]
    return sorted(data.to_pylist(), key=lambda r: tuple(str(r[k]) for k in keys)), types


def assert_same_output(spark_out: Path, python_out: Path) -> None:
    for name, keys in TABLES.items():
        a, b = table(str(spark_out / name), keys), table(str(python_out / name), keys)
        assert a[1] == b[1], (name, a[1], b[1])
        assert a[0] == b[0], name
        assert a[0] or name in ("stuck", "failed"), f"{name} is empty: the check would check nothing"


def report_body(out: Path) -> str:
    """The report without what differs between two runs: when it was made, how long it took."""
    page = (out / "report.html").read_text()
    page = re.sub(r"Generated [^<]*", "", page)
    page = page[:page.index('<h2 id="timing">')] + page[page.index("</details>"):]
    return page.replace(str(out), "OUT")


def same_summary(a, b) -> None:   # type: ignore[no-untyped-def]
    for name in ("queues", "stale_after", "first_event", "last_event", "files_listed", "new_files",
                 "grown_files", "bytes_read", "records_read", "records", "malformed",
                 "unknown_versions", "partial_lines"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("engines")
    write_history(root, 1)
    write_history(root, 2)
    odd = root / "history" / "shard-7" / "history-1709247600000000-000001.jsonl"
    odd.parent.mkdir(parents=True)
    odd.write_bytes(b"\n".join(ODD_LINES))
    return root / "history"


@pytest.fixture(scope="module")
def both(spark, history) -> Dict[str, Any]:
    root = history.parent
    return {"spark": run([str(history)], str(root / "spark"), spark=spark, stale_after=STALE_AFTER),
            "python": run([str(history)], str(root / "python"), stale_after=STALE_AFTER, engine="python")}


def test_both_engines_write_the_same_tables_state_summary_and_report(history, both):
    root = history.parent
    assert both["python"].timing.engine == "python" and both["spark"].timing.engine == "spark"
    same_summary(both["spark"], both["python"])
    assert both["python"].malformed > 10 and both["python"].unknown_versions == {2: 3, 3: 1}
    assert_same_output(root / "spark", root / "python")
    assert report_body(root / "spark") == report_body(root / "python")
    spark_files = json.loads((root / "spark" / "_checkpoint.json").read_text())["files"]
    python_files = json.loads((root / "python" / "_checkpoint.json").read_text())["files"]
    assert spark_files == python_files                   # same names, sizes, times and offsets


def test_both_readers_classify_every_odd_line_alike(spark, history):
    odd = f"file:{history}/shard-7/history-1709247600000000-000001.jsonl"
    plan = Plan([odd], {})
    lines = (source.read(spark, plan).lines.select("kind", "version", "record").collect())
    by_spark = sorted((r.kind, r.version if r.kind == "version" else None,
                       json.dumps(r.record.asDict() if r.record else None, sort_keys=True))
                      for r in lines)
    pieces = b"\n".join(ODD_LINES).split(b"\n")
    by_python = sorted((kind, version if kind == "version" else None,
                        json.dumps(record, sort_keys=True))
                       for kind, version, record in (pysource.classify(p.decode(), i == len(pieces) - 1)
                                                     for i, p in enumerate(pieces)))
    clean = [(k, v, json.dumps({f: r[f] for f in sorted(r) if f != "_corrupt_record"} if r else None,
                               sort_keys=True))
             for k, v, r in ((k, v, json.loads(r)) for k, v, r in by_spark)]
    assert sorted(clean) == by_python
    kinds = [k for k, _, _ in by_python]
    assert kinds.count("event") == 12 and kinds.count("partial") == 1 and kinds.count("blank") == 2


@pytest.mark.parametrize("first", ["spark", "python"])
def test_each_engine_continues_where_the_other_stopped(spark, tmp_path, both, history, first):
    """Batch 1 by one engine, batch 2 (the files grown and new) by the other: what one run
    over everything gives."""
    write_history(tmp_path, 1)
    out = tmp_path / "out"
    engines = {"spark": {"spark": spark}, "python": {"engine": "python"}}
    second = "python" if first == "spark" else "spark"
    run([str(tmp_path / "history")], str(out), stale_after=STALE_AFTER, **engines[first])
    write_history(tmp_path, 2)
    summary = run([str(tmp_path / "history")], str(out), stale_after=STALE_AFTER, **engines[second])
    assert summary.grown_files and summary.new_files
    whole = tmp_path / "whole"
    run([str(tmp_path / "history")], str(whole), stale_after=STALE_AFTER, engine="python")
    assert_same_output(whole, out)


def test_auto_takes_python_for_a_small_local_history_and_spark_otherwise(history, monkeypatch,
                                                                         tmp_path):
    out = str(tmp_path / "out")
    engine, why = choose_engine("auto", [str(history)], out, None, False)
    size = sum(f.stat().st_size for f in history.rglob("*.jsonl"))
    assert (engine, why) == ("python", f"{size:,} bytes of history, at most 64 MiB")
    monkeypatch.setattr(app, "PYTHON_MAX_BYTES", size - 1)
    assert choose_engine("auto", [str(history)], out, None, False)[0] == "spark"
    assert choose_engine("auto", [str(history)], out, "spark://m:7077", False) == (
        "spark", "--master spark://m:7077")
    assert choose_engine("auto", ["hdfs:///qs/history"], out, None, False)[0] == "spark"
    assert choose_engine("spark", [str(history)], out, None, False)[0] == "spark"
    with pytest.raises(HistoryError, match="local paths only"):
        choose_engine("python", ["s3a://bucket/history"], out, None, False)
