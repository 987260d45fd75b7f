"""The history record as the shards write it, and the names of its events.

Version 1 lines are JSON objects; both engines parse them against
:data:`RECORD` (never infer a schema), so a line that does not fit is
malformed instead of silently changing a column's type. Version 2 lines
(what shards write now, half the bytes) are JSON arrays holding the same
fields by position (:data:`ARRAY_FIELDS`, as
``queueserver.shard.history.FIELDS``), without ``outcome``, which is the
event's name on a final event; they are turned into the same record.
Nothing here imports pyspark: the Spark reader builds its types from
these (:mod:`.source`).
"""
from __future__ import annotations

from .columns import Schema

VERSION = 1         # a JSON object per line
ARRAY_VERSION = 2   # a JSON array per line, fields by position

# Events that leave a job ready, in line or with a worker; the job goes on.
ADDED, LEASED, REQUEUED, RELEASED, RETURNED, RETRIED = (
    "added", "leased", "requeued", "released", "returned", "retried")
# Events after which the job is gone; each has the outcome of the same name.
FINAL = ("completed", "failed", "dead", "expired", "deleted", "taken")
EVENTS = (ADDED, LEASED, REQUEUED, RELEASED, RETURNED, RETRIED) + FINAL

CORRUPT = "_corrupt_record"

#: A record's fields and types (times in microseconds since the epoch, UTC; ``protocol`` is
#: the adding client's on "added").
RECORD: Schema = [("v", "long"), ("time", "long"), ("shard", "long"), ("event", "string"),
                  ("protocol", "string"), ("queue", "string"), ("id", "string"), ("number", "long"),
                  ("attempt", "long"), ("priority", "long"), ("size", "long"), ("outcome", "string"),
                  ("conn", "string")]

# A version-2 line: the fields by position.
ARRAY_FIELDS = ("v", "time", "shard", "event", "protocol", "queue", "id", "number", "attempt",
                "priority", "size", "conn")

# Fields without which a version-1 line is malformed.
REQUIRED = ("time", "event", "id", "queue")
