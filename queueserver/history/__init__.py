"""``queueserver history``: the job history of the shards, turned into tables and a report by Spark.

The shards write one JSON line per job transition under
``DATA/history/shard-N/``; :mod:`queueserver.history.app` reads them with
PySpark and writes the ``jobs``, ``queue_minutes`` and ``stuck`` Parquet
tables and ``report.html``, incrementally. This package's ``__init__`` and
:mod:`.options` import nothing from pyspark, so the server's command line can
offer the subcommand without loading Spark.
"""
