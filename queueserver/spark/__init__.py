"""Spark integration: write DataFrames to queueserver as jobs (needs the ``spark``
extra; nothing outside this package imports pyspark)."""
from .datasource import (DEFAULT_NAMESPACE, NAME, QueueCommitMessage, QueueDataSource, QueueWriteError,
                         QueueWriter, WriteOptions, enqueue_dataframe, job_id, register)

__all__ = ["DEFAULT_NAMESPACE", "NAME", "QueueCommitMessage", "QueueDataSource", "QueueWriteError",
           "QueueWriter", "WriteOptions", "enqueue_dataframe", "job_id", "register"]
