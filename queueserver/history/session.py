"""The SparkSession a history run uses: the caller's, spark-submit's, or a local one it owns."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Optional

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
APP_NAME = "queueserver history"


@contextmanager
def spark_session(master: Optional[str] = None, progress: bool = False) -> Iterator[SparkSession]:
    """An active session if there is one (a test's, a notebook's), else a new one, stopped at the end.

    Without ``master``, a session under spark-submit (which starts the JVM
    and passes its port in ``PYSPARK_GATEWAY_PORT``) takes spark-submit's
    master; anywhere else it runs locally on every core."""
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName(APP_NAME).config(
        "spark.ui.showConsoleProgress", "true" if progress else "false")
    if master is not None:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        yield spark
    finally:
        spark.stop()
