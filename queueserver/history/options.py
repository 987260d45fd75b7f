"""The ``history`` subcommand's arguments, shared by ``queueserver history`` and ``spark-submit app.py``.

Kept free of pyspark imports so that building the server's command line
does not load Spark.
"""
from __future__ import annotations

import argparse
from typing import List

DEFAULT_STALE_AFTER = 3600.0
ENGINES = ("auto", "spark", "python")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The history flags, added to ``p``."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", metavar="DIR",
                        help="a server's data directory: reads its history/shard-*/*.jsonl")
    source.add_argument("--input", nargs="+", metavar="PATH",
                        help="history files or directories any Spark can read (several nodes' "
                             "history dirs together, globs, hdfs://, s3a://)")
    p.add_argument("--out", required=True, metavar="OUT",
                   help="where the jobs/, queue_minutes/ and stuck/ tables, report.html and the "
                        "checkpoint go")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="what computes the tables: spark, python (in this process, without Spark; "
                        "local paths only), or auto (default): python for a local history of up to "
                        "64 MiB, else spark")
    p.add_argument("--master", metavar="URL",
                   help="Spark master (default local[*], or the one spark-submit was given)")
    p.add_argument("--stale-after", type=float, default=DEFAULT_STALE_AFTER, metavar="SECONDS",
                   help="an unfinished job added this long before the newest event is listed as "
                        f"stuck (default {DEFAULT_STALE_AFTER:g})")
    p.add_argument("--rebuild", action="store_true",
                   help="forget the checkpoint and read every file again")
    p.add_argument("--spark-progress", action="store_true",
                   help="show Spark's console progress bars (off by default)")


def input_paths(args: argparse.Namespace) -> List[str]:
    """What to read: ``--input`` as given, or the history directory of ``--data-dir``."""
    if args.data_dir is not None:
        return [args.data_dir.rstrip("/") + "/history"]
    return list(args.input)
