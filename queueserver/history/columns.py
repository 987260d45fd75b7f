"""The column types of what ``queueserver history`` writes, for both engines.

A table's schema is a list of ``(name, type)``: a type is one of
:data:`SCALARS` or, for a struct, a schema of its own. Each engine writes a
table in its schema: Spark casts the columns to it, the Python engine
builds its Parquet schema from it, so both write the same types.
A ``timestamp`` column holds µs since the epoch (an int) in a frame, on
either engine, and is written as a timestamp (INT96, as Spark writes
them); a ``date`` is a ``datetime.date`` on the Python side.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple, Union

Type = Union[str, Sequence[Tuple[str, Any]]]
Schema = Sequence[Tuple[str, Type]]

#: Our type names -> Spark's DDL names.
SCALARS = {"string": "string", "int": "int", "long": "bigint", "double": "double",
           "timestamp": "timestamp", "date": "date"}


def names(schema: Schema) -> List[str]:
    return [name for name, _ in schema]


def spark_ddl(kind: Type) -> str:
    """A type as Spark's DDL writes it (``struct<a:int,b:string>``)."""
    if isinstance(kind, str):
        return SCALARS[kind]
    return "struct<" + ",".join(f"{name}:{spark_ddl(sub)}" for name, sub in kind) + ">"


def arrow_type(kind: Type) -> Any:   # -> pyarrow.DataType
    import pyarrow as pa
    if not isinstance(kind, str):
        return pa.struct([pa.field(name, arrow_type(sub)) for name, sub in kind])
    return {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
            "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}[kind]


def arrow_schema(schema: Schema) -> Any:   # -> pyarrow.Schema
    import pyarrow as pa
    return pa.schema([pa.field(name, arrow_type(kind)) for name, kind in schema])
