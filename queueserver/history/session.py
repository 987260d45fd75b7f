"""The SparkSession a history run uses: the caller's, spark-submit's, or a local one it owns."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Iterator, Optional

from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from .errors import HistoryError

DEFAULT_MASTER = "local[*]"
APP_NAME = "queueserver history"
JAVA_NEEDED = ("Spark needs Java 17: install it (Debian: apt-get install openjdk-17-jre-headless) "
               "or set JAVA_HOME to one")


def _check_java() -> None:
    """Before this process launches Spark's JVM: a ``java`` to launch, or one
    line saying so (Spark's launcher would print half a line, then PySpark a
    traceback)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        if not os.access(os.path.join(home, "bin", "java"), os.X_OK):
            raise HistoryError(f"JAVA_HOME is {home}, which has no bin/java; {JAVA_NEEDED}")
    elif shutil.which("java") is None:
        raise HistoryError(f"no java on PATH and JAVA_HOME is not set; {JAVA_NEEDED}")


def will_launch() -> bool:
    """Whether a session made now would launch Spark's JVM from this process (none is running,
    and spark-submit did not start one for it)."""
    return SparkSession.getActiveSession() is None and SparkContext._gateway is None \
        and "PYSPARK_GATEWAY_PORT" not in os.environ


def check_java() -> None:
    """Before anything is logged: a missing Java is one line (see :func:`_check_java`)."""
    if will_launch():
        _check_java()


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
    launching = SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    if launching:
        _check_java()
    try:
        spark = builder.getOrCreate()
    except PySparkRuntimeError as err:
        if launching and err.getErrorClass() == "JAVA_GATEWAY_EXITED":   # a java that is no Java 17
            raise HistoryError(f"Spark's JVM did not start (why is in the lines above); {JAVA_NEEDED}") from None
        raise
    spark.sparkContext.setLogLevel("WARN")
    try:
        yield spark
    finally:
        spark.stop()
