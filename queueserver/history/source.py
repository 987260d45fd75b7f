"""Reading history files: list them, take the bytes not consumed yet, parse the lines.

Files are read with Spark's ``binaryFile`` source, one row per file, so a
file that grew is read from the byte where the last run stopped (text and
JSON sources cannot start mid-file) and the incomplete last line of a file
being written is measured and left for the next run. Lines are split and
parsed by Spark against the explicit record schema (:mod:`.schema`; version-1
objects and version-2 arrays alike); each
is classified as an event, a blank line, a partial last line, a malformed
line or a record of another version. No Python UDFs: executors need no
copy of this package. A file must stay under 2 GB (one binary value);
rotated history files are far smaller.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from .checkpoint import Listed, Plan
from .errors import HistoryError
from .schema import ARRAY_FIELDS, ARRAY_VERSION, CORRUPT, EVENTS, FINAL, REQUIRED, VERSION
from .schema import RECORD as FIELDS
from .sparkframe import SparkFrame
from .tally import BLANK, EVENT, MALFORMED, OTHER_VERSION, PARTIAL, PATTERN, Tally

#: The record as Spark parses it: a field that does not fit shows up in ``_corrupt_record``.
RECORD = StructType([StructField(name, LongType() if kind == "long" else StringType())
                     for name, kind in FIELDS] + [StructField(CORRUPT, StringType())])
# A version-2 line: every element as its JSON text (strings unquoted), cast field by field.
ARRAY = ArrayType(StringType())
# Only the version, read on its own: a record of another version may not fit RECORD at all.
VERSION_ONLY = StructType([StructField("v", LongType())])


def _binary_files(spark: SparkSession) -> DataFrameReader:
    return (spark.read.format("binaryFile")
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", PATTERN))


def list_files(spark: SparkSession, inputs: Sequence[str]) -> List[Listed]:
    """Every history file under ``inputs`` (directories are searched recursively, globs expand).

    Only path, size and time are selected, so no file's content is read here."""
    try:
        frame = _binary_files(spark).load(list(inputs))
    except AnalysisException as err:
        raise HistoryError(f"cannot read the input: {_first_line(err)}") from None
    rows = frame.select("path", "length", F.unix_micros("modificationTime").alias("mtime")).collect()
    unique = {row.path: Listed(row.path, row.length, row.mtime) for row in rows}
    return sorted(unique.values(), key=lambda f: f.path)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _glob_escaped(path: str) -> str:
    """A listed path, loaded as itself even when its name holds glob characters."""
    return "".join("\\" + c if c in "\\{}[]*?" else c for c in path)


@dataclass
class Batch:
    """The lines read in one run, classified; persisted until :meth:`release`."""
    lines: DataFrame

    def events(self) -> SparkFrame:
        """The accepted records, with the record schema's columns."""
        return SparkFrame(self.lines.where(F.col("kind") == EVENT).select("record.*").drop(CORRUPT))

    def tally(self) -> Tally:
        """What was read, per file and per kind of line (one small Spark job)."""
        rows = (self.lines.groupBy("path", "kind", "version")
                .agg(F.count(F.lit(1)).alias("lines"), F.max("size").alias("size"),
                     F.max("mtime").alias("mtime"), F.max("start").alias("start"),
                     F.sum("partial_bytes").alias("partial"))
                .collect())
        return Tally.of(r.asDict() for r in rows)

    def release(self) -> None:
        self.lines.unpersist()


def read(spark: SparkSession, plan: Plan) -> Batch:
    """The not yet consumed lines of the planned files."""
    if plan.paths:
        raw = (spark.read.format("binaryFile").option("ignoreMissingFiles", "true")
               .load([_glob_escaped(p) for p in plan.paths]))
    else:
        raw = spark.range(0).select(F.lit(None).cast("string").alias("path"),
                                    F.lit(None).cast("timestamp").alias("modificationTime"),
                                    F.lit(None).cast("binary").alias("content"))
    start = _offsets(plan.grown)
    files = raw.select(
        "path", F.unix_micros("modificationTime").alias("mtime"),
        F.octet_length("content").alias("size"), start.alias("start"), "content")
    files = files.select("path", "mtime", "size", "start", F.split(
        F.substring("content", F.col("start") + 1, F.col("size") - F.col("start")).cast("string"),
        "\n", -1).alias("lines"))
    # The line count is its own column before the explode: taken in the same
    # select, Spark computes it after, and every exploded row then carries
    # its file's whole array of lines (memory grows with lines squared).
    files = files.select("path", "mtime", "size", "start", "lines", F.size("lines").alias("n"))
    lines = files.select("path", "mtime", "size", "start", "n",
                         F.posexplode("lines").alias("pos", "line"))
    return Batch(_classified(lines).persist(StorageLevel.MEMORY_AND_DISK))


def _offsets(grown: Dict[str, int]) -> Column:
    """Where each file's unread bytes start: its consumed offset if it was read before, else 0."""
    if not grown:
        return F.lit(0).cast("long")
    table = F.create_map(*[F.lit(x) for path, offset in sorted(grown.items()) for x in (path, offset)])
    return F.coalesce(F.element_at(table, F.col("path")), F.lit(0)).cast("long")


def _classified(lines: DataFrame) -> DataFrame:
    """Each line with its kind, version and parsed record.

    A line starting with ``[`` is a version-2 array, any other a version-1
    object (:mod:`.schema`); both become the same record. Only the last piece
    of a file (after its last newline) can be partial: a line still being
    written. It is left unconsumed when it does not parse; any other line
    that does not parse is malformed and is skipped."""
    line, version, record = F.col("line"), F.col("version"), F.col("record")
    array, is_array = F.col("array"), F.col("line").startswith("[")
    is_tail = F.col("pos") == F.col("n") - 1
    broken = record.getField(CORRUPT).isNotNull() | ~record.getField("event").isin(*EVENTS)
    for name in REQUIRED:
        broken = broken | record.getField(name).isNull()
    known = F.when(is_array, version == ARRAY_VERSION).otherwise(version == VERSION)
    kind = (F.when(line.rlike(r"^\s*$"), BLANK)
            .when(is_tail & version.isNull(), PARTIAL)
            .when(version.isNull(), MALFORMED)
            .when(~known, OTHER_VERSION)
            .when(F.coalesce(broken, F.lit(True)), MALFORMED)
            .otherwise(EVENT))
    return (lines.withColumn("array", F.when(is_array, F.from_json(line, ARRAY)))
            .withColumn("version", F.when(is_array, F.get(array, 0).try_cast("long"))
                        .otherwise(F.from_json(line, VERSION_ONLY).getField("v")))
            .withColumn("record", F.when(is_array & (version == ARRAY_VERSION), _from_array(array, line))
                        .otherwise(F.from_json(line, RECORD)))
            .withColumn("kind", kind)
            .select("path", "mtime", "size", "start", "kind", "version",
                    F.when(F.col("kind") == PARTIAL, F.octet_length(line)).otherwise(0)
                    .cast("long").alias("partial_bytes"),
                    F.when(F.col("kind") == EVENT, record).alias("record")))


def _from_array(array: Column, line: Column) -> Column:
    """A version-2 line's elements as a :data:`RECORD` struct: each field cast
    from its position, ``outcome`` from a final event, and the line as
    ``_corrupt_record`` when the count is wrong or a value does not cast."""
    raw = {name: F.get(array, i) for i, name in enumerate(ARRAY_FIELDS)}
    bad = F.size(array) != len(ARRAY_FIELDS)
    fields = []
    for field in RECORD.fields:
        if field.name == CORRUPT:
            continue
        if field.name == "outcome":
            value = F.when(raw["event"].isin(*FINAL), raw["event"])
        else:
            value = raw[field.name].try_cast(field.dataType)
            bad = bad | (raw[field.name].isNotNull() & value.isNull())
        fields.append(value.alias(field.name))
    return F.struct(*fields, F.when(bad, line).alias(CORRUPT))
