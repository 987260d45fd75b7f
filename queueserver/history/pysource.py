"""The Python engine's reading of history files: what :mod:`.source` does with Spark, in this process.

Local files only (a path, or ``file:``). The listing is Spark's: every
``*.jsonl`` under the inputs (directories searched recursively, globs
expanded, names starting with ``_`` or ``.`` skipped), each file named as
Spark names it (``file:/abs/path``) with its size and its modification
time in whole milliseconds, so the checkpoint is the same whichever engine
wrote it. A file is read from where the last run stopped; its lines are
classified and parsed by the rules of Spark's JSON reader that matter here
(:func:`classify`): a field of type long takes a JSON integer only, a
string field any value (a non-string one as its JSON text), a version-2
element is cast from that text like Spark's ``try_cast``.
tests/test_history_engines.py feeds both readers the same odd lines.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .checkpoint import Listed, Plan
from .errors import HistoryError
from .frame import RowFrame
from .schema import ARRAY_FIELDS, ARRAY_VERSION, EVENTS, FINAL, RECORD, REQUIRED, VERSION
from .tally import BLANK, EVENT, MALFORMED, OTHER_VERSION, PARTIAL, Tally

SCHEME = "file:"
LONG_MIN, LONG_MAX = -2 ** 63, 2 ** 63 - 1
_BLANK = re.compile(r"[ \t\n\x0b\f\r]*")      # Java's \s
_LONG_TEXT = re.compile(r"[+-]?[0-9]+")
_TYPES = dict(RECORD)
_GLOB = re.compile(r"[*?\[]")


def local_path(path: str) -> Optional[str]:
    """The local path of an input or output (a plain path, or ``file:``), None for any other
    scheme (``hdfs://``, ``s3a://``...), which only Spark reads."""
    if path.startswith(SCHEME):
        path = path[len(SCHEME):]
        if path.startswith("//"):            # file:///x
            path = path[2:] if path.startswith("///") else ""
            if not path:
                return None
    elif re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path):
        return None
    return os.path.abspath(path)


def _hidden(name: str) -> bool:
    """Spark's listing skips these (a ``_`` directory with ``=`` in it is a partition)."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def _listed(path: str) -> Listed:
    st = os.stat(path)
    return Listed(SCHEME + path, st.st_size, st.st_mtime_ns // 1_000_000 * 1000)


def _walk(root: str) -> Iterator[str]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for name in sorted(files):
            if not _hidden(name) and name.endswith(".jsonl"):
                yield os.path.join(folder, name)


def list_files(inputs: Sequence[str]) -> List[Listed]:
    """Every history file under ``inputs``, as :func:`.source.list_files` lists them."""
    found: Dict[str, Listed] = {}
    for given in inputs:
        path = local_path(given)
        if path is None:
            raise HistoryError(f"cannot read the input: {given} is not a local path "
                               "(only Spark reads it: --engine spark)")
        matches = sorted(glob.glob(path)) if _GLOB.search(path) else [path] if os.path.exists(path) else []
        if not matches:
            raise HistoryError(f"cannot read the input: [PATH_NOT_FOUND] Path does not exist: "
                               f"{SCHEME}{path}.")
        for match in matches:
            for file in (_walk(match) if os.path.isdir(match) else [match] if match.endswith(".jsonl") else []):
                found[SCHEME + file] = _listed(file)
    return sorted(found.values(), key=lambda f: f.path)


# ------------------------------------------------------------------ parsing
class _Bad(Exception):
    """A value that does not fit its field: the record is malformed."""


def _long(value: Any) -> Optional[int]:
    """A JSON value as a long field: an integer, or null."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and LONG_MIN <= value <= LONG_MAX:
        return value
    raise _Bad(value)


def _text(value: Any) -> Optional[str]:
    """A JSON value as a string field: a string as itself, any other value as its JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _cast_long(text: Optional[str]) -> Optional[int]:
    """Spark's ``try_cast(text as bigint)``: surrounding blanks trimmed, digits with a sign."""
    if text is None:
        return None
    text = text.strip("".join(map(chr, range(33))))   # UTF8String.trimAll: every char up to a space
    if not _LONG_TEXT.fullmatch(text):
        return None
    value = int(text)
    return value if LONG_MIN <= value <= LONG_MAX else None


def _json(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return _Unparsed


class _Unparsed:
    """A line that is not JSON at all."""


def _object_record(value: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    try:
        return {name: (_long if kind == "long" else _text)(value.get(name)) for name, kind in RECORD}
    except _Bad:
        return None


def _array_record(elements: List[Optional[str]]) -> Optional[Dict[str, Any]]:
    if len(elements) != len(ARRAY_FIELDS):
        return None
    record: Dict[str, Any] = {}
    for name, text in zip(ARRAY_FIELDS, elements):
        if _TYPES[name] == "long":
            value = _cast_long(text)
            if text is not None and value is None:
                return None
            record[name] = value
        else:
            record[name] = text
    record["outcome"] = record["event"] if record["event"] in FINAL else None
    return {name: record[name] for name, _ in RECORD}


def classify(line: str, tail: bool) -> Tuple[str, Optional[int], Optional[Dict[str, Any]]]:
    """A line's kind, version and record (the record of an event only), as Spark's reader
    (:func:`.source._classified`) makes them; ``tail``: the piece after a file's last newline."""
    if _BLANK.fullmatch(line):
        return BLANK, None, None
    value = _json(line)
    record: Optional[Dict[str, Any]] = None
    if line.startswith("["):
        elements = [_text(v) for v in value] if isinstance(value, list) else None
        version = _cast_long(elements[0]) if elements else None
        known = version == ARRAY_VERSION
        if known and elements is not None:
            record = _array_record(elements)
    else:
        obj = value if isinstance(value, dict) else None
        try:
            version = _long(obj.get("v")) if obj is not None else None
        except _Bad:
            version = None
        known = version == VERSION
        if known and obj is not None:
            record = _object_record(obj)
    if version is None:
        return (PARTIAL if tail else MALFORMED), None, None
    if not known:
        return OTHER_VERSION, version, None
    if (record is None or record["event"] not in EVENTS
            or any(record[name] is None for name in REQUIRED)):
        return MALFORMED, version, None
    return EVENT, version, record


class Batch:
    """The lines read in one run: the events, and the tally."""

    def __init__(self, records: List[Dict[str, Any]], rows: List[Dict[str, object]]) -> None:
        self.records, self.rows = records, rows

    def events(self) -> RowFrame:
        return RowFrame(self.records, [name for name, _ in RECORD])

    def tally(self) -> Tally:
        return Tally.of(self.rows)

    def release(self) -> None:
        self.records = []


def read(plan: Plan) -> Batch:
    """The not yet consumed lines of the planned files (a file gone since the listing is skipped)."""
    records: List[Dict[str, Any]] = []
    rows: List[Dict[str, object]] = []
    for path in plan.paths:
        local = path[len(SCHEME):]
        start = plan.grown.get(path, 0)
        try:
            with open(local, "rb") as f:
                mtime = os.fstat(f.fileno()).st_mtime_ns // 1_000_000 * 1000
                data = f.read()
        except FileNotFoundError:
            continue
        pieces = data[start:].split(b"\n")
        counts: Dict[Tuple[str, Optional[int]], int] = {}
        partial = 0
        for pos, piece in enumerate(pieces):
            kind, version, record = classify(piece.decode("utf-8", "replace"), pos == len(pieces) - 1)
            key = (kind, version if kind == OTHER_VERSION else None)
            counts[key] = counts.get(key, 0) + 1
            if kind == PARTIAL:
                partial += len(piece)
            elif record is not None:
                records.append(record)
        first = True
        for (kind, version), lines in counts.items():
            rows.append({"path": path, "kind": kind, "version": version, "lines": lines,
                         "size": len(data), "mtime": mtime, "start": start,
                         "partial": partial if first else 0})
            first = False
    return Batch(records, rows)
