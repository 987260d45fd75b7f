"""The Spark engine: history of any size, read and written where it lies (local, HDFS, S3).

:class:`SparkEngine` is what :mod:`.app` asks of an engine, done with a
SparkSession: :mod:`.source` lists and reads the files, the shared
definitions run as DataFrames (:class:`.sparkframe.SparkFrame`), Parquet is
written by Spark and the checkpoint and report through Hadoop's FileSystem
(:class:`.storage.Storage`).
"""
from __future__ import annotations

from typing import Any, List, Sequence

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from . import source
from .checkpoint import Listed, Plan
from .columns import Schema
from .errors import HistoryError
from .sparkframe import SparkFrame
from .storage import Storage


class SparkEngine:
    name = "spark"

    def __init__(self, spark: SparkSession, out: str) -> None:
        self.spark = spark
        self.storage = Storage(spark, out)

    def list_files(self, inputs: Sequence[str]) -> List[Listed]:
        return source.list_files(self.spark, inputs)

    def read(self, plan: Plan) -> source.Batch:
        return source.read(self.spark, plan)

    def read_table(self, path: str, schema: Schema) -> SparkFrame:
        """A table written by either engine (raises :class:`HistoryError` when it is not there)."""
        try:
            df = self.spark.read.parquet(path)
        except AnalysisException:
            raise HistoryError(f"the state {path} named by the checkpoint is missing; "
                               "run again with --rebuild to read every file anew") from None
        return SparkFrame(df.select(*[name for name, _ in schema if name in df.columns]))

    def write(self, frame: Any, path: str, schema: Schema, partition_by: Sequence[str] = (),
              sort_by: Sequence[str] = (), one_file: bool = False) -> None:
        """``frame`` as the table at ``path`` (replaced), in the column types of ``schema``."""
        df = frame.conform(schema).df
        if partition_by:
            df = df.repartition(*partition_by)
        elif one_file:
            df = df.repartition(1)
        if sort_by:
            df = df.sortWithinPartitions(*sort_by)
        writer = df.write.mode("overwrite").option("partitionOverwriteMode", "static")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.parquet(path)

    def keep(self, frame: Any) -> SparkFrame:
        """``frame`` cached: it is read by several stages of the run."""
        return SparkFrame(frame.df.persist(StorageLevel.MEMORY_AND_DISK))

    def release(self, frame: Any) -> None:
        frame.df.unpersist()
