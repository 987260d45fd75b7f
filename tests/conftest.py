"""Shared by every test module: the tests directory on the path, and the one
SparkSession of a test run (``spark``; pyspark is imported only by the
modules that use it).

Spark keeps one session per process and starting one costs about ten
seconds, so every Spark test module shares this session. Its local master
retries a failed task (``local[2,3]``), which the DataFrame writer's retry
test needs.
"""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

#: The browser fixtures (``browser``, ``page``) for the tests of served pages.
pytest_plugins = ["browser"]


#: local[threads, maxFailures]: a failed task is tried again, up to 3 times in all.
MASTER = "local[2,3]"


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole run; the JVM is shut down at the end if
    this fixture launched it (it would idle until the process exits)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")}
    os.environ.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                      SPARK_LOCAL_IP="127.0.0.1")
    launched = SparkContext._gateway is None
    session = (SparkSession.builder.master(MASTER).appName("queueserver-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    gateway = SparkContext._gateway
    if launched and gateway is not None:   # the JVM would idle until this process exits
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:   # the JVM exits when its stdin, our pipe, closes
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        SparkContext._gateway = SparkContext._jvm = None
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


