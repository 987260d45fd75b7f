"""The history record as the shards write it, and the names of its events.

Version 1 lines are JSON objects; Spark parses them against :data:`RECORD`
(never infers a schema), so a line that does not fit shows up in
``_corrupt_record`` instead of silently changing a column's type. Version 2
lines (what shards write now, half the bytes) are JSON arrays holding the
same fields by position (:data:`ARRAY_FIELDS`, as
``queueserver.shard.history.FIELDS``), without ``outcome``, which is the
event's name on a final event; they are parsed as :data:`ARRAY` and turned
into the same record.
"""
from __future__ import annotations

from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

VERSION = 1         # a JSON object per line
ARRAY_VERSION = 2   # a JSON array per line, fields by position

# Events that leave a job ready, in line or with a worker; the job goes on.
ADDED, LEASED, REQUEUED, RELEASED, RETURNED, RETRIED = (
    "added", "leased", "requeued", "released", "returned", "retried")
# Events after which the job is gone; each has the outcome of the same name.
FINAL = ("completed", "failed", "dead", "expired", "deleted", "taken")
EVENTS = (ADDED, LEASED, REQUEUED, RELEASED, RETURNED, RETRIED) + FINAL

CORRUPT = "_corrupt_record"

RECORD = StructType([
    StructField("v", LongType()),
    StructField("time", LongType()),          # microseconds since the epoch, UTC
    StructField("shard", LongType()),
    StructField("event", StringType()),
    StructField("protocol", StringType()),    # the adding client's protocol, on "added"
    StructField("queue", StringType()),
    StructField("id", StringType()),
    StructField("number", LongType()),
    StructField("attempt", LongType()),
    StructField("priority", LongType()),
    StructField("size", LongType()),
    StructField("outcome", StringType()),
    StructField("conn", StringType()),
    StructField(CORRUPT, StringType()),       # the line, when some field did not parse
])

# A version-2 line: every element as its JSON text (strings unquoted), cast field by field.
ARRAY = ArrayType(StringType())
ARRAY_FIELDS = ("v", "time", "shard", "event", "protocol", "queue", "id", "number", "attempt",
                "priority", "size", "conn")

# Only the version, read on its own: a record of another version may not fit RECORD at all.
VERSION_ONLY = StructType([StructField("v", LongType())])

# Fields without which a version-1 line is malformed.
REQUIRED = ("time", "event", "id", "queue")
