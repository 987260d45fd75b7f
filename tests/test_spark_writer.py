"""queueserver.spark: DataFrames written to a real server through a real local
SparkSession, including a task that fails mid-partition and is retried by Spark."""
from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import time
import uuid

import pytest
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from queueserver.client import Client, Job, NotFound, TimedOut
from queueserver.client.client import _job, _Request
from queueserver.spark import (DEFAULT_NAMESPACE, QueueDataSource, QueueWriteError, QueueWriter,
                               WriteOptions, enqueue_dataframe, job_id)
from queueserver.spark.datasource import DEFAULT_TTL, DEFAULT_TTR, check_queue_name, summarize
from serverproc import ServerProcess

#: The shared session's master (conftest.py): a failed task is tried again, up to 3 times.
MASTER = "local[2,3]"

@pytest.fixture(scope="module")
def server():
    with ServerProcess(shards=2, protocols=["workq"]) as proc:
        yield proc


@pytest.fixture
def client(server):
    with Client(port=server.ports["workq"], timeout=10) as c:
        yield c


def new_queue(tag: str) -> str:
    return f"sw-{tag}-{uuid.uuid4().hex[:8]}"


def rows_frame(spark: SparkSession, n: int, partitions: int, schema: StructType, make) -> DataFrame:
    """A DataFrame of ``make(i)`` for i in 0..n-1, spread over ``partitions``."""
    return spark.createDataFrame([make(i) for i in range(n)], schema).repartition(partitions)


def drain(client: Client, queue: str) -> list:
    """Lease every ready job of ``queue``: the jobs, in the order the server gave them."""
    jobs = []
    while True:
        try:
            jobs.append(client.lease(queue, 0))
        except TimedOut:
            return jobs


def drain_pipelined(client: Client, queue: str, per_write: int = 500) -> list:
    """:func:`drain` for many jobs: ``per_write`` leases (wait 0) leave in one
    write and their answers are read in order, until a write's answers hold a
    ``TimedOut`` (the queue had no ready job left). The client's pipeline has
    no lease, so this builds the requests as :meth:`Client.lease` does."""
    request = _Request(f"lease {queue} 0\r\n".encode(), _job)
    jobs = []
    while True:
        answers = client._exchange([request] * per_write)
        refused = [a for a in answers if not isinstance(a, (Job, TimedOut))]
        assert not refused, f"lease answered {refused[0]!r}"
        jobs += [a for a in answers if isinstance(a, Job)]
        if any(isinstance(a, TimedOut) for a in answers):   # nothing was ready any more
            return jobs


# ----------------------------------------------------------- without a JVM
def test_job_ids_are_uuid5_of_the_key_as_a_string():
    assert job_id("order-1") == str(uuid.uuid5(DEFAULT_NAMESPACE, "order-1"))
    assert job_id(7) == job_id("7") != job_id("8")
    assert job_id(b"\x01\xff") == job_id("01ff")
    other = uuid.uuid4()
    assert job_id("order-1", other) == str(uuid.uuid5(other, "order-1")) != job_id("order-1")


def test_options_are_checked_before_any_task_runs():
    schema = StructType([StructField("id", LongType()), StructField("payload", StringType()),
                         StructField("q", StringType()), StructField("n", IntegerType())])
    ok = WriteOptions.parse({"queue": "jobs", "keycolumn": "ID", "batch": "10", "namespace": str(DEFAULT_NAMESPACE)},
                            schema)
    assert (ok.key_index, ok.payload_index, ok.queue, ok.batch, ok.ttr, ok.ttl, ok.priority) == \
        (0, 1, "jobs", 10, DEFAULT_TTR, DEFAULT_TTL, None)
    assert WriteOptions.parse({"queuecolumn": "q", "keycolumn": "id"}, schema).queue_index == 2
    for options, message in [
        ({"queue": "jobs"}, "keyColumn is required"),
        ({"keycolumn": "id"}, "exactly one of the options queue and queueColumn"),
        ({"queue": "a", "queuecolumn": "q", "keycolumn": "id"}, "exactly one"),
        ({"queuecolumn": "n", "keycolumn": "id"}, "must be a string column"),
        ({"queue": "jobs", "keycolumn": "id", "payloadcolumn": "n"}, "string or binary column"),
        ({"queue": "jobs", "keycolumn": "nope"}, "no column 'nope'"),
        ({"queue": "two words", "keycolumn": "id"}, "cannot be sent"),
        ({"queue": "jobs", "keycolumn": "id", "ttr": "0"}, "ttr must be within 1..86400000"),
        ({"queue": "jobs", "keycolumn": "id", "priority": "high"}, "priority must be an integer"),
        ({"queue": "jobs", "keycolumn": "id", "maxattempts": "256"}, "maxAttempts must be within 0..255"),
        ({"queue": "jobs", "keycolumn": "id", "namespace": "nope"}, "namespace must be a UUID"),
        ({"queue": "jobs", "keycolumn": "id", "bacth": "5"}, "unknown option(s) ['bacth']"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            WriteOptions.parse(options, schema)
    for name in ["", "a\r\nb", "tab\there", None]:
        with pytest.raises(QueueWriteError, match="cannot be sent"):
            check_queue_name(name)
    assert summarize([None], 0.0)["rows_per_second"] == 0.0


# ------------------------------------------------------------ with Spark
PAYLOAD_SCHEMA = StructType([StructField("key", StringType()), StructField("payload", StringType())])


def test_rows_become_jobs_once_with_their_options(spark, server, client):
    queue, n = new_queue("fixed"), 90
    df = rows_frame(spark, n, 4, PAYLOAD_SCHEMA, lambda i: (f"{queue}-{i}", f"payload {i} é"))
    options = dict(port=server.ports["workq"], queue=queue, keyColumn="key", priority=-7, ttr=1234,
                   ttl=987654, maxAttempts=3, batch=7)
    totals = enqueue_dataframe(df, **options)
    assert {k: totals[k] for k in ("rows", "added", "duplicates", "partitions")} == \
        {"rows": n, "added": n, "duplicates": 0, "partitions": 4}
    assert client.inspect_queue(queue)["ready-len"] == n
    for i in range(n):
        info = client.inspect_job(job_id(f"{queue}-{i}"))
        assert info["name"] == queue and info["payload"] == f"payload {i} é".encode()
        assert (info["priority"], info["ttr"], info["ttl"], info["max-attempts"]) == (-7, 1234, 987654, 3)

    again = enqueue_dataframe(df, **options)
    assert (again["rows"], again["added"], again["duplicates"]) == (n, 0, n)
    assert client.inspect_queue(queue)["ready-len"] == n
    leased = drain(client, queue)
    assert sorted(job.payload for job in leased) == sorted(f"payload {i} é".encode() for i in range(n))


def test_queue_column_and_binary_payloads(spark, server, client):
    queues = [new_queue("even"), new_queue("odd")]
    schema = StructType([StructField("id", LongType()), StructField("q", StringType()),
                         StructField("body", BinaryType())])
    n = 40

    def body(i: int) -> bytes:
        return b"\x00bin\r\n" + i.to_bytes(2, "big") + b"\r\n"   # NUL and CRLF inside

    namespace = uuid.uuid4()   # integer keys of this test's own
    df = rows_frame(spark, n, 3, schema, lambda i: (i, queues[i % 2], bytearray(body(i))))
    totals = enqueue_dataframe(df, port=server.ports["workq"], queue_column="q", payload_column="body",
                               key_column="id", batch=5, namespace=namespace)
    assert (totals["rows"], totals["added"], totals["duplicates"], totals["partitions"]) == (n, n, 0, 3)
    for parity, queue in enumerate(queues):
        assert client.inspect_queue(queue)["ready-len"] == n // 2
        info = client.inspect_job(job_id(parity, namespace))
        assert (info["name"], info["ttr"], info["ttl"], info["priority"]) == \
            (queue, DEFAULT_TTR, DEFAULT_TTL, 0)
        leased = {job.id: job.payload for job in drain(client, queue)}
        assert leased == {job_id(i, namespace): body(i) for i in range(parity, n, 2)}


def _retry_source(fail_in_flight: bool):
    """A ``queueserver``-like source whose partition 1 dies on its first attempt
    after 25 of its rows (batches of 10): 20 are on the server and answered, and
    the next 5 are buffered (``fail_in_flight`` False, as when the upstream
    computation fails) or the next 10 were sent and their answers never read
    (True, as when the task dies with a batch on the wire)."""

    def first_attempt_of_partition_1() -> bool:
        context = TaskContext.get()
        return context.partitionId() == 1 and context.attemptNumber() == 0

    def dying(rows):
        for count, row in enumerate(rows, 1):
            yield row
            if count == 25:
                raise RuntimeError("injected failure after 25 rows")

    class RetriedWriter(QueueWriter):
        def write(self, iterator):
            self.flushes = 0
            self.dies = first_attempt_of_partition_1()
            if self.dies and not fail_in_flight:
                iterator = dying(iterator)
            return super().write(iterator)

        def _flush(self, client, pipeline, sent, counts):
            self.flushes += 1
            if self.dies and fail_in_flight and self.flushes == 3:
                with socket.create_connection((client.host, client.port)) as raw:
                    raw.sendall(b"".join(request.data for request in pipeline.requests))
                raise RuntimeError("injected failure with a batch in flight")
            return super()._flush(client, pipeline, sent, counts)

    class RetriedSource(QueueDataSource):
        @classmethod
        def name(cls):
            return "queueserver_retry_test"

        def writer(self, schema, overwrite):
            return RetriedWriter(WriteOptions.parse(self.options, schema))

    return RetriedSource


@pytest.mark.parametrize("fail_in_flight", [False, True], ids=["between-batches", "batch-in-flight"])
def test_a_task_retried_after_failing_mid_partition_adds_each_row_once(spark, server, client, tmp_path,
                                                                       fail_in_flight):
    assert spark.sparkContext.master == MASTER, f"master {spark.sparkContext.master} does not retry tasks"
    source = _retry_source(fail_in_flight)
    spark.dataSource.register(source)
    queue, n = new_queue("retry"), 120
    df = rows_frame(spark, n, 4, PAYLOAD_SCHEMA, lambda i: (f"{queue}-{i}", f"row {i}"))   # 30 a partition
    summary = tmp_path / "summary.json"
    (df.write.format(source.name()).mode("append").option("port", server.ports["workq"])
     .option("queue", queue).option("keyColumn", "key").option("batch", 10)
     .option("summaryFile", str(summary)).save())
    totals = json.loads(summary.read_text())
    # The retried attempt found what the failed one had added as duplicates.
    assert (totals["rows"], totals["partitions"]) == (n, 4)
    assert totals["added"] + totals["duplicates"] == n
    if fail_in_flight:
        assert 20 <= totals["duplicates"] <= 30
    else:
        assert totals["duplicates"] == 20
    assert client.inspect_queue(queue)["ready-len"] == n
    leased = {job.id: job.payload for job in drain(client, queue)}
    assert leased == {job_id(f"{queue}-{i}"): f"row {i}".encode() for i in range(n)}


def test_a_server_error_fails_the_spark_write_with_the_servers_text(spark, server, client):
    keys = [str(uuid.uuid4()) for _ in range(12)]
    df = rows_frame(spark, 12, 2, PAYLOAD_SCHEMA, lambda i: (keys[i], f"error test {i}"))
    with pytest.raises(Exception, match=re.escape("-CLIENT-ERROR Invalid Name")) as caught:
        enqueue_dataframe(df, port=server.ports["workq"], queue="no!such:queue", key_column="key")
    assert "queueserver refused job" in str(caught.value)
    for key in keys:
        with pytest.raises(NotFound):
            client.inspect_job(job_id(key))


def _writer(port: int, **options: str) -> QueueWriter:
    schema = StructType([StructField("key", StringType()), StructField("q", StringType()),
                         StructField("payload", BinaryType())])
    return QueueWriter(WriteOptions.parse({"port": str(port), "keycolumn": "key", **options}, schema))


def test_the_writer_counts_matches_and_refuses_in_process(server, client, tmp_path, caplog):
    """QueueWriter.write and commit called directly (as Spark's workers do), for
    the cases that need no cluster to show."""
    port, queue = server.ports["workq"], new_queue("direct")
    rows = [(f"{queue}-{i}", queue, b"p%d" % i) for i in range(12)]
    first = _writer(port, queuecolumn="q", batch="5").write(iter(rows[:10]))
    assert (first.rows, first.added, first.duplicates, first.partition) == (10, 10, 0, -1)
    writer = _writer(port, queuecolumn="q", batch="5", summaryfile=str(tmp_path / "s.json"))
    second = writer.write(iter(rows))
    assert (second.rows, second.added, second.duplicates) == (12, 2, 10)
    with caplog.at_level(logging.INFO, logger="queueserver.spark"):
        writer.commit([first, None, second])
    totals = json.loads((tmp_path / "s.json").read_text())
    assert (totals["rows"], totals["added"], totals["duplicates"], totals["partitions"]) == (22, 12, 10, 2)
    assert "22 rows, 12 added, 10 duplicates, 2 partitions" in caplog.text and "rows/s" in caplog.text
    assert client.inspect_job(job_id(f"{queue}-11"))["payload"] == b"p11"

    # One bad queue in a batch: the batch's other rows are added (a re-run
    # finds them as duplicates); the task fails naming the refused row.
    good = new_queue("good")
    mixed = [(f"{good}-{i}", "bad!" if i == 3 else good, b"x") for i in range(6)]
    with pytest.raises(QueueWriteError,
                       match=re.escape(f"(key '{good}-3', queue 'bad!'): -CLIENT-ERROR Invalid Name")):
        _writer(port, queuecolumn="q").write(iter(mixed))
    assert client.inspect_queue(good)["ready-len"] == 5

    with pytest.raises(QueueWriteError, match="'two words' cannot be sent"):   # would break the line
        _writer(port, queuecolumn="q").write(iter([("k", "two words", b"x")]))
    with pytest.raises(QueueWriteError, match=re.escape("keyColumn is null")):
        _writer(port, queue=good).write(iter([(None, None, b"x")]))
    with pytest.raises(QueueWriteError, match=re.escape("has no payload")):
        _writer(port, queue=good).write(iter([("k", None, None)]))
    with socket.socket() as probe:   # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    with pytest.raises(QueueWriteError, match=re.escape(f"queueserver at 127.0.0.1:{closed}")):
        _writer(closed, queue=good).write(iter(rows))
    with pytest.raises(ValueError, match="only appends jobs"):
        QueueDataSource({"queue": good, "keycolumn": "key"}).writer(PAYLOAD_SCHEMA, True)


def test_throughput_of_100k_rows_of_100_bytes(spark, server, client):
    n, queue = 100_000, new_queue("bench")
    df = spark.range(n).select(F.col("id").alias("key"),
                               F.lpad(F.col("id").cast("string"), 100, "x").alias("payload")).cache()
    assert df.count() == n   # built and cached first: the time below is the write's
    started = time.monotonic()
    namespace = uuid.uuid4()
    totals = enqueue_dataframe(df, port=server.ports["workq"], queue=queue, key_column="key",
                               namespace=namespace)
    seconds = time.monotonic() - started
    df.unpersist()
    print(f"\nspark -> queueserver: {n:,} rows of 100 B over {totals['partitions']} partitions in "
          f"{seconds:.2f} s = {n / seconds:,.0f} rows/s (commit summary: {totals['rows_per_second']:,.0f} rows/s)")
    assert (totals["added"], totals["duplicates"]) == (n, 0)
    assert client.inspect_queue(queue)["ready-len"] == n
    info = client.inspect_job(job_id(n - 1, namespace))
    assert info["payload"] == str(n - 1).rjust(100, "x").encode()


def test_100k_rows_drained_back_exactly_once_and_a_second_write_adds_nothing(spark, server, client):
    """Every row of a 100,000-row, 4-partition write is on the server once: draining
    the queue leases exactly its payloads, each under the job id of its key; the
    same DataFrame written again is 100,000 duplicates and leaves nothing to lease."""
    n, queue, namespace = 100_000, new_queue("drain"), uuid.uuid4()
    df = spark.range(n, numPartitions=4).select(
        F.format_string("key-%d", "id").alias("key"),
        F.format_string("%s payload of row %d", F.sha2(F.col("id").cast("string"), 256), "id").alias("payload"))
    options = dict(port=server.ports["workq"], queue=queue, key_column="key", namespace=namespace,
                   ttr=600_000, batch=500)   # leases that outlive the test: the jobs stay leased
    started = time.monotonic()
    first = enqueue_dataframe(df, **options)
    wrote = time.monotonic()
    assert {k: first[k] for k in ("rows", "added", "duplicates", "partitions")} == \
        {"rows": n, "added": n, "duplicates": 0, "partitions": 4}

    leased = drain_pipelined(client, queue)
    drained = time.monotonic()
    expected = {job_id(f"key-{i}", namespace):
                f"{hashlib.sha256(str(i).encode()).hexdigest()} payload of row {i}".encode() for i in range(n)}
    # Counts and a few examples, not pytest's diff of two 100,000-entry dicts.
    assert len(leased) == n
    assert len({job.id for job in leased}) == n               # no job leased twice
    assert {job.name for job in leased} == {queue}
    by_id = {job.id: job.payload for job in leased}
    missing, unknown = sorted(expected.keys() - by_id.keys()), sorted(by_id.keys() - expected.keys())
    wrong = sorted(id for id in by_id.keys() & expected.keys() if by_id[id] != expected[id])
    assert (len(missing), len(unknown), len(wrong)) == (0, 0, 0), \
        f"ids not job_id(key, namespace) (missing e.g. {missing[:3]}, unknown e.g. {unknown[:3]}) " \
        f"or payloads under another row's key (e.g. {[(id, by_id[id]) for id in wrong[:3]]})"
    assert client.inspect_queue(queue)["ready-len"] == 0

    again = enqueue_dataframe(df, **options)
    rewrote = time.monotonic()
    assert {k: again[k] for k in ("rows", "added", "duplicates", "partitions")} == \
        {"rows": n, "added": 0, "duplicates": n, "partitions": 4}
    assert client.inspect_queue(queue)["ready-len"] == 0
    assert len(drain_pipelined(client, queue)) == 0
    print(f"\n100k rows: written in {wrote - started:.2f} s, drained in {drained - wrote:.2f} s "
          f"({n / (drained - wrote):,.0f} leases/s), written again (all duplicates) in {rewrote - drained:.2f} s")
