"""Write a Spark DataFrame to queueserver: every row becomes a workq job.

A Spark Python Data Source (PySpark 4) named ``queueserver``, write-only::

    register(spark)
    (df.write.format("queueserver").mode("append")
       .option("port", 9922).option("queue", "emails").option("keyColumn", "id")
       .save())

or :func:`enqueue_dataframe`, which registers the source, writes, and returns
the totals. The source's code runs in Spark's Python workers, so their
Python must have this package: :func:`register` sees to that on a local
master (see there); elsewhere set ``PYSPARK_PYTHON`` to such a Python.

Idempotent, because Spark runs tasks more than once (a failed or lost task is
retried, a speculative copy may run beside it, a job may be re-run whole):
a row's job id is the UUIDv5 of (``namespace``, its ``keyColumn`` value as a
string), and the server refuses an id it already holds with
``-CLIENT-ERROR Duplicate job``, which the writer counts as a duplicate, not
an error. Rows written again are therefore never queued twice, as long as
the first copy is still on the server (a job leaves once its result is
fetched by ``run``, is deleted, or outlives its TTL; a write after that adds
it anew). The id ignores the queue: one key is one job, whichever queue
it names. Any other answer from the server fails the task with the server's
text, so Spark retries it and, if it keeps failing, fails the write; the
rows of that partition already accepted stay queued, and a re-run adds only
the rest.

Each partition is written over one TCP connection (TCP_NODELAY) with
queueserver's own :class:`~queueserver.client.Client`: ``batch`` adds leave
in one write, and their answers are read and matched in order before the
next batch. Each task reports its counts in a :class:`QueueCommitMessage`;
the driver's :meth:`QueueWriter.commit` adds them up, logs a summary, and
(option ``summaryFile``) writes the totals as JSON for the caller: the
commit runs in a Python worker process of the driver, not in the process
that called ``save()``.

Options (names are case-insensitive, as everywhere in Spark):

============== ================================================================
host           server address (default 127.0.0.1)
port           workq port (default 9922)
queue          the queue of every row, or
queueColumn    a string column naming each row's queue
payloadColumn  a string (sent UTF-8) or binary column (default ``payload``)
keyColumn      required: the column whose value identifies a row's job
priority       signed 32-bit (default: the server's, 0)
ttr            time to run in ms, 1..86400000 (default 60000)
ttl            time to live in ms, 1..2^64-1 (default 86400000, one day)
maxAttempts    0..255 (default: the server's, unlimited)
maxFails       0..255 (default: the server's)
batch          rows per pipelined write, 1..10000 (default 256); a batch
               also leaves once its payloads reach 4 MiB
namespace      UUID for the UUIDv5 ids (default :data:`DEFAULT_NAMESPACE`);
               two writes with different namespaces never see each other's
               rows as duplicates
summaryFile    path on the driver's host where commit writes the totals
============== ================================================================
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Mapping, Optional, Sequence, Set, Tuple, TypedDict, overload

from pyspark import TaskContext
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (ArrayType, BinaryType, DataType, MapType, StringType, StructType,
                               VariantType)

from ..client.client import DEFAULT_PORT, Client, ClientError, Pipeline, WorkqError

log = logging.getLogger("queueserver.spark")

NAME = "queueserver"
#: The default UUIDv5 namespace of job ids; a fixed value, so that a re-run
#: of the same write (in another process, on another day) makes the same ids.
DEFAULT_NAMESPACE = uuid.UUID("5b7e1e4c-3f0a-5d0e-9c51-2a6f0f3c9d21")
DEFAULT_TTR = 60_000
DEFAULT_TTL = 86_400_000
DEFAULT_BATCH = 256
MAX_BATCH = 10_000
#: A batch also leaves once its payloads reach this many bytes, so big
#: payloads do not pile up ``batch`` at a time in the task's memory.
BATCH_BYTES = 4 << 20
DUPLICATE = "Duplicate job"

#: What would break a workq request line: such a queue name is refused here,
#: since the server would read the rest of the name as more arguments.
_UNSENDABLE = re.compile(r"[\s\x00-\x1f\x7f]")

_OPTIONS = {
    "host", "port", "queue", "queuecolumn", "payloadcolumn", "keycolumn", "priority", "ttr", "ttl",
    "maxattempts", "maxfails", "batch", "namespace", "summaryfile",
}


class QueueWriteError(RuntimeError):
    """The server refused a row (other than as a duplicate), or was unreachable."""


@dataclass
class QueueCommitMessage(WriterCommitMessage):
    """What one task did; ``rows == added + duplicates``."""
    partition: int
    attempt: int
    rows: int
    added: int
    duplicates: int
    seconds: float


class Totals(TypedDict):
    """A write's totals (:func:`summarize`): what ``summaryFile`` holds and
    :func:`enqueue_dataframe` returns."""
    rows: int
    added: int
    duplicates: int
    partitions: int
    seconds: float
    rows_per_second: float


# ------------------------------------------------------------------ options
@overload
def _int(options: Mapping[str, str], name: str, default: int, low: int, high: int) -> int: ...
@overload
def _int(options: Mapping[str, str], name: str, default: None, low: int, high: int) -> Optional[int]: ...


def _int(options: Mapping[str, str], name: str, default: Optional[int], low: int, high: int) -> Optional[int]:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"option {name} must be within {low}..{high}, got {value}")
    return value


def _column(schema: StructType, option: str, name: str) -> Tuple[int, DataType]:
    """The index and type of column ``name`` (exact, else the one case-insensitive match)."""
    names = schema.fieldNames()
    matches = [i for i, field in enumerate(names) if field == name]
    if not matches:
        matches = [i for i, field in enumerate(names) if field.lower() == name.lower()]
    if len(matches) != 1:
        problem = "no" if not matches else "more than one"
        raise ValueError(f"option {option}: {problem} column {name!r} among {names}")
    return matches[0], schema.fields[matches[0]].dataType


def check_queue_name(name: object) -> str:
    """``name`` if it can be sent as a workq queue name; the server judges the rest
    (its charset and length), here we refuse only what would break the request line."""
    if not isinstance(name, str) or not name or _UNSENDABLE.search(name):
        raise QueueWriteError(f"queue name {name!r} cannot be sent: it must be a non-empty string "
                              f"without whitespace or control characters")
    return name


@dataclass(frozen=True)
class WriteOptions:
    """The parsed options and the columns' positions in the rows."""
    host: str
    port: int
    queue: Optional[str]
    queue_index: Optional[int]
    payload_index: int
    key_index: int
    priority: Optional[int]
    ttr: int
    ttl: int
    max_attempts: Optional[int]
    max_fails: Optional[int]
    batch: int
    namespace: uuid.UUID
    summary_file: Optional[str]

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> "WriteOptions":
        """Check everything that can be checked on the driver, so a typo fails the
        write at once with one message instead of failing every task."""
        options = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(set(options) - _OPTIONS - {"path"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for the {NAME} data source")
        if options.get("path"):
            raise ValueError(f"the {NAME} data source takes no path (use the queue option)")
        queue, queue_column = options.get("queue"), options.get("queuecolumn")
        if (queue is None) == (queue_column is None):
            raise ValueError("give exactly one of the options queue and queueColumn")
        queue_index = None
        if queue is not None:
            try:
                queue = check_queue_name(queue)
            except QueueWriteError as err:
                raise ValueError(f"option queue: {err}") from None
        else:
            assert queue_column is not None   # exactly one of the two
            queue_index, queue_type = _column(schema, "queueColumn", queue_column)
            if not isinstance(queue_type, StringType):
                raise ValueError(f"queueColumn {queue_column!r} must be a string column, not {queue_type}")
        payload_index, payload_type = _column(schema, "payloadColumn", options.get("payloadcolumn", "payload"))
        if not isinstance(payload_type, (StringType, BinaryType)):
            raise ValueError(f"payloadColumn must be a string or binary column, not {payload_type}")
        if options.get("keycolumn") is None:
            raise ValueError("option keyColumn is required: job ids are made from it, so that rows "
                             "written again are recognised as duplicates")
        key_index, key_type = _column(schema, "keyColumn", options["keycolumn"])
        if isinstance(key_type, (ArrayType, MapType, StructType, VariantType)):
            raise ValueError(f"keyColumn must be a simple column (string, number, binary, date...), "
                             f"not {key_type}")
        try:
            namespace = uuid.UUID(str(options["namespace"])) if "namespace" in options else DEFAULT_NAMESPACE
        except ValueError:
            raise ValueError(f"option namespace must be a UUID, got {options['namespace']!r}") from None
        return cls(
            host=options.get("host", "127.0.0.1"),
            port=_int(options, "port", DEFAULT_PORT, 1, 65535),
            queue=queue, queue_index=queue_index, payload_index=payload_index, key_index=key_index,
            priority=_int(options, "priority", None, -2**31, 2**31 - 1),
            ttr=_int(options, "ttr", DEFAULT_TTR, 1, 86_400_000),
            ttl=_int(options, "ttl", DEFAULT_TTL, 1, 2**64 - 1),
            max_attempts=_int(options, "maxAttempts", None, 0, 255),
            max_fails=_int(options, "maxFails", None, 0, 255),
            batch=_int(options, "batch", DEFAULT_BATCH, 1, MAX_BATCH),
            namespace=namespace,
            summary_file=options.get("summaryfile"),
        )


def key_text(value: object) -> str:
    """A key value as the string its job id is made from: strings as they are,
    binary as hex, anything else by ``str`` (so 7 and "7" are the same key)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def job_id(key: object, namespace: uuid.UUID = DEFAULT_NAMESPACE) -> str:
    """The workq job id of the row whose key column holds ``key``."""
    return str(uuid.uuid5(namespace, key_text(key)))


# ------------------------------------------------------------------- writer
class QueueWriter(DataSourceWriter):
    """Made on the driver, pickled to every task (``write``) and to the commit."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.started = time.time()   # wall clock: the commit runs in another process

    def write(self, iterator: Iterator[Row]) -> QueueCommitMessage:
        """Enqueue this partition's rows, ``batch`` at a time over one connection."""
        o = self.options
        context = TaskContext.get()
        started = time.monotonic()
        counts = [0, 0]   # added, duplicates
        client = Client(o.host, o.port)
        pipeline = client.pipeline()
        sent: List[Tuple[object, str, str]] = []   # (key, queue, id) of each row in the batch
        size = 0
        known_queues: Set[str] = set()
        try:
            for row in iterator:
                key = row[o.key_index]
                if key is None:
                    raise QueueWriteError("a row's keyColumn is null: it cannot be given a job id")
                payload = row[o.payload_index]
                if payload is None:
                    raise QueueWriteError(f"the row with key {key!r} has no payload")
                queue = o.queue
                if queue is None:
                    queue = row[o.queue_index]
                    if queue not in known_queues:
                        known_queues.add(check_queue_name(queue))
                job = str(uuid.uuid5(o.namespace, key if type(key) is str else key_text(key)))
                pipeline.add(job, queue, payload, o.ttr, o.ttl, priority=o.priority,
                             max_attempts=o.max_attempts, max_fails=o.max_fails)
                sent.append((key, queue, job))
                size += len(payload)
                if len(sent) >= o.batch or size >= BATCH_BYTES:
                    self._flush(client, pipeline, sent, counts)
                    size = 0
            if sent:
                self._flush(client, pipeline, sent, counts)
        finally:
            client.close()
        added, duplicates = counts
        return QueueCommitMessage(partition=context.partitionId() if context else -1,
                                  attempt=context.attemptNumber() if context else 0,
                                  rows=added + duplicates, added=added, duplicates=duplicates,
                                  seconds=time.monotonic() - started)

    def _flush(self, client: Client, pipeline: Pipeline, sent: List[Tuple[object, str, str]],
               counts: List[int]) -> None:
        """Send the batch in one write, match the answers to the rows in order."""
        try:
            answers = pipeline.execute()
        except OSError as err:   # refused, reset, timed out, or ConnectionLost
            raise QueueWriteError(f"queueserver at {client.host}:{client.port}: {err} "
                                  f"(a retry adds only what was not added)") from err
        refused = []
        for (key, queue, job), answer in zip(sent, answers):
            if answer is None:
                counts[0] += 1
            elif isinstance(answer, ClientError) and answer.message == DUPLICATE:
                counts[1] += 1
            else:
                refused.append((key, queue, job, answer))
        sent.clear()
        if refused:
            key, queue, job, answer = refused[0]
            text = f"-{answer.code} {answer.message}" if isinstance(answer, WorkqError) else repr(answer)
            raise QueueWriteError(f"queueserver refused job {job} (key {key!r}, queue {queue!r}): {text}"
                                  + (f" ({len(refused) - 1} more refused in the same batch)"
                                     if len(refused) > 1 else ""))

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        """Add up the tasks' counts; log them; write them to ``summaryFile`` if given."""
        totals = summarize(messages, time.time() - self.started)
        log.info("queueserver write: %(rows)d rows, %(added)d added, %(duplicates)d duplicates, "
                 "%(partitions)d partitions in %(seconds).2f s (%(rows_per_second).0f rows/s)", totals)
        if self.options.summary_file:
            _write_json(self.options.summary_file, totals)

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        """Say what the tasks that finished had added: those jobs stay queued."""
        done = summarize(messages, time.time() - self.started)
        log.warning("queueserver write failed; its %d finished partitions added %d jobs and found "
                    "%d duplicates (they stay queued; writing again adds only the rest)",
                    done["partitions"], done["added"], done["duplicates"])


def summarize(messages: Sequence[Optional[WriterCommitMessage]], seconds: float) -> Totals:
    """The totals of the tasks' commit messages (``None`` for a failed task is skipped)."""
    done = [m for m in messages if isinstance(m, QueueCommitMessage)]
    rows = sum(m.rows for m in done)
    return {"rows": rows, "added": sum(m.added for m in done),
            "duplicates": sum(m.duplicates for m in done), "partitions": len(done),
            "seconds": seconds, "rows_per_second": rows / seconds if seconds > 0 else 0.0}


def _write_json(path: str, data: Mapping[str, object]) -> None:
    """Whole or not at all: the reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".summary-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# -------------------------------------------------------------- data source
class QueueDataSource(DataSource):
    """The ``queueserver`` format: write-only, append-only."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: StructType, overwrite: bool) -> QueueWriter:
        if overwrite:
            raise ValueError(f"the {NAME} data source only appends jobs: use mode('append')")
        return QueueWriter(WriteOptions.parse(self.options, schema))


def register(spark: SparkSession) -> None:
    """Register :class:`QueueDataSource` with ``spark`` unless the session has it
    (registering again would replace it with a warning).

    Spark starts the source's Python workers with ``PYSPARK_PYTHON``, by
    default ``python3`` from ``PATH``: with a venv's python run without the
    venv on ``PATH``, another Python, without this package
    (``ModuleNotFoundError: queueserver``). On a local master, whose workers
    run on this host, the source is therefore registered to run in this very
    interpreter, unless ``PYSPARK_PYTHON`` names one."""
    try:
        known = spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(NAME)
    except Exception:   # Spark Connect, or the internal API moved: register anyway
        known = False
    if not known:
        with _local_workers_run_this_python(spark):
            spark.dataSource.register(QueueDataSource)


@contextmanager
def _local_workers_run_this_python(spark: SparkSession) -> Iterator[None]:
    """Functions made meanwhile run in this interpreter, on a local master
    with no ``PYSPARK_PYTHON`` (a registered source keeps the Python it was
    made with; nothing else changes)."""
    try:
        context = spark.sparkContext
        master = context.master   # None: not set, which is no local master either
        local = master is not None and master.startswith("local")
    except Exception:   # Spark Connect: the workers are the server's
        local = False
    if not local or "PYSPARK_PYTHON" in os.environ:
        yield
        return
    chosen, context.pythonExec = context.pythonExec, sys.executable
    try:
        yield
    finally:
        context.pythonExec = chosen


def _option_name(name: str) -> str:
    """``key_column`` → ``keyColumn``; Spark option names are case-insensitive anyway."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def enqueue_dataframe(df: DataFrame, **options: object) -> Totals:
    """Write ``df`` to queueserver (options as in the module's table, in camelCase
    or snake_case; ``None`` means unset) and return the totals: ``rows``,
    ``added``, ``duplicates``, ``partitions``, ``seconds``, ``rows_per_second``."""
    register(df.sparkSession)
    with tempfile.TemporaryDirectory(prefix="qs-spark-") as tmp:
        summary = os.path.join(tmp, "summary.json")
        writer = df.write.format(NAME).mode("append")
        for name, value in options.items():
            if value is not None:
                writer = writer.option(_option_name(name), str(value))
        writer.option("summaryFile", summary).save()
        with open(summary) as f:
            totals: Totals = json.load(f)   # what QueueWriter.commit wrote
    log.info("enqueued %(rows)d rows: %(added)d added, %(duplicates)d duplicates "
             "(%(rows_per_second).0f rows/s)", totals)
    return totals
