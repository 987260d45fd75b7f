"""The Spark engine's frame: :class:`.frame.Frame` over a Spark DataFrame.

Each operation is the DataFrame's own, each expression its Spark Column
(:meth:`.frame.Expr.spark`): the shared definitions run on the executors,
with no Python UDF, so executors need no copy of this package.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Union

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .columns import Schema, spark_ddl
from .frame import Column, Expr, NamedAgg, Row, Sort


def _column(column: Column) -> Union[str, SparkColumn]:
    return column if isinstance(column, str) else column.expr.spark().alias(column.name)


def _plain(value: Any) -> Any:
    """A collected value as the Python engine has it: structs as dicts, arrays as lists."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class SparkFrame:
    def __init__(self, df: DataFrame) -> None:
        self.df = df

    @property
    def columns(self) -> List[str]:
        return list(self.df.columns)

    def select(self, *columns: Column) -> "SparkFrame":
        return SparkFrame(self.df.select(*[_column(c) for c in columns]))

    def with_column(self, name: str, expr: Expr) -> "SparkFrame":
        return SparkFrame(self.df.withColumn(name, expr.spark()))

    def drop(self, *names: str) -> "SparkFrame":
        return SparkFrame(self.df.drop(*names))

    def where(self, cond: Expr) -> "SparkFrame":
        return SparkFrame(self.df.where(cond.spark()))

    def group_by(self, *keys: Column) -> "SparkGroups":
        return SparkGroups(self.df, [_column(k) for k in keys])

    def join(self, other: Any, on: Sequence[str], how: str) -> "SparkFrame":
        assert isinstance(other, SparkFrame)
        return SparkFrame(self.df.join(other.df, list(on), how))

    def union(self, other: Any) -> "SparkFrame":
        assert isinstance(other, SparkFrame)
        return SparkFrame(self.df.unionByName(other.df))

    def fill_zero(self, names: Sequence[str]) -> "SparkFrame":
        return SparkFrame(self.df.na.fill(0, [n for n in names if n in self.df.columns]))

    def order_by(self, *keys: Union[str, Sort]) -> "SparkFrame":
        sorts = [k if isinstance(k, Sort) else Sort(k) for k in keys]
        return SparkFrame(self.df.orderBy(*[F.col(s.name).desc() if s.descending else F.col(s.name)
                                            for s in sorts]))

    def limit(self, n: int) -> "SparkFrame":
        return SparkFrame(self.df.limit(n))

    def conform(self, schema: Schema) -> "SparkFrame":
        """Timestamps are µs in a frame (:mod:`.columns`): made timestamps from µs, not seconds."""
        return SparkFrame(self.df.select(*[
            (F.timestamp_micros(name) if kind == "timestamp" else F.col(name).cast(spark_ddl(kind)))
            .alias(name) for name, kind in schema]))

    def collect(self) -> List[Row]:
        return [{k: _plain(v) for k, v in row.asDict().items()} for row in self.df.collect()]


class SparkGroups:
    def __init__(self, df: DataFrame, keys: List[Union[str, SparkColumn]]) -> None:
        self.df, self.keys = df, keys

    def agg(self, *aggs: NamedAgg) -> SparkFrame:
        return SparkFrame(self.df.groupBy(*self.keys).agg(*[a.agg.spark().alias(a.name) for a in aggs]))

