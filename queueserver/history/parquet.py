"""The Python engine's Parquet: state and tables written as Spark writes them, and read back.

A table is a directory of ``part-*.parquet`` files and an empty
``_SUCCESS``; a partitioned one (``jobs``, by date and queue) has a
directory per value (``date=2026-01-01/queue=emails``), its name escaped
the way Spark escapes it (``%XX`` for ``/``, ``=``, ``%``, control
characters and a few more; a null or empty value is
``__HIVE_DEFAULT_PARTITION__``). Timestamps are INT96, as Spark writes
them. Either engine reads what the other wrote.
"""
from __future__ import annotations

import os
import shutil
import uuid
from datetime import date
from typing import Any, Dict, List, Sequence, Tuple

from .columns import Schema, arrow_schema
from .frame import Row, Sort, sort_key

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: The characters Spark escapes in a partition directory's name (ExternalCatalogUtils).
_ESCAPED = frozenset([chr(c) for c in range(1, 32)] + list("\"#%'*/:=?\\\x7f{[]^"))


def escape(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def _partition_value(value: Any) -> str:
    if value is None or value == "":
        return DEFAULT_PARTITION
    return escape(value.isoformat() if isinstance(value, date) else str(value))


def _write_file(rows: Sequence[Row], schema: Schema, path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    arrow = arrow_schema(schema)
    columns = {name: [row[name] for row in rows] for name, _ in schema}
    table = pa.table({name: pa.array(values, type=arrow.field(name).type)
                      for name, values in columns.items()}, schema=arrow)
    pq.write_table(table, path, compression="snappy", use_deprecated_int96_timestamps=True)


def write(rows: List[Row], schema: Schema, path: str, partition_by: Sequence[str] = (),
          sort_by: Sequence[str] = ()) -> None:
    """Replace the table at ``path`` with ``rows`` (each with every column of ``schema``):
    one file, or one per partition, its rows ordered by ``sort_by``."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    ordered = sorted(rows, key=sort_key([Sort(name) for name in sort_by])) if sort_by else rows
    name = f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"
    if not partition_by:
        _write_file(ordered, schema, os.path.join(path, name))
    else:
        kept = [(n, kind) for n, kind in schema if n not in partition_by]
        parts: Dict[Tuple[str, ...], List[Row]] = {}
        for row in ordered:
            parts.setdefault(tuple(_partition_value(row[p]) for p in partition_by), []).append(row)
        for values, members in parts.items():
            folder = os.path.join(path, *[f"{p}={v}" for p, v in zip(partition_by, values)])
            os.makedirs(folder)
            _write_file(members, kept, os.path.join(folder, name))
    open(os.path.join(path, "_SUCCESS"), "wb").close()


def read(path: str, schema: Schema) -> Tuple[List[Row], List[str]]:
    """The rows of a table written by either engine (no partitions: the state) and the columns
    of ``schema`` that it has; structs as dicts, as :class:`.frame.RowFrame` holds them."""
    import pyarrow.parquet as pq
    table = pq.read_table(path)
    names = [name for name, _ in schema if name in table.column_names]
    return table.select(names).to_pylist(), names
