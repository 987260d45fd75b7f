"""The Python engine: a small history turned into the same tables in this process, without Spark.

Starting Spark (a JVM, a SparkSession) takes seconds before any work, and
each of a run's stages is a Spark job with its own overhead: on a few
thousand records that is nearly all of the run. :class:`PythonEngine` does
what :class:`.spark_engine.SparkEngine` does, for local files and a local
``--out``: :mod:`.pysource` reads, the shared definitions run on rows
(:class:`.frame.RowFrame`), :mod:`.parquet` writes what Spark would, and
:class:`.localstorage.LocalStorage` keeps the checkpoint and report. The
output (tables, state, checkpoint) is interchangeable with Spark's: either
engine continues where the other stopped.
"""
from __future__ import annotations

import os
from typing import Any, List, Sequence

from . import parquet, pysource
from .checkpoint import Listed, Plan
from .columns import Schema
from .errors import HistoryError
from .frame import RowFrame
from .localstorage import LocalStorage


class PythonEngine:
    name = "python"

    def __init__(self, out: str) -> None:
        local = pysource.local_path(out)
        if local is None:
            raise HistoryError(f"--out {out} is not a local path (only Spark writes there: --engine spark)")
        self.storage = LocalStorage(local)

    def list_files(self, inputs: Sequence[str]) -> List[Listed]:
        return pysource.list_files(inputs)

    def read(self, plan: Plan) -> pysource.Batch:
        return pysource.read(plan)

    def read_table(self, path: str, schema: Schema) -> RowFrame:
        if not os.path.isdir(path):
            raise HistoryError(f"the state {path} named by the checkpoint is missing; "
                               "run again with --rebuild to read every file anew")
        rows, names = parquet.read(path, schema)
        return RowFrame(rows, names)

    def write(self, frame: Any, path: str, schema: Schema, partition_by: Sequence[str] = (),
              sort_by: Sequence[str] = (), one_file: bool = False) -> None:
        parquet.write(frame.conform(schema).rows, schema, path, partition_by, sort_by)

    def keep(self, frame: Any) -> RowFrame:
        assert isinstance(frame, RowFrame)
        return frame

    def release(self, frame: Any) -> None:
        pass
