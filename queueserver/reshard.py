"""Changing the shard count of a data directory, at start-up, with no job lost.

Queue names map to shards by ``shard_for(name, shards)``, so the jobs of a
data directory are where a server looks for them only with the shard count
that wrote them. Started with another ``--shards``, the supervisor re-shards
the directory before any shard runs:

1. every old shard's log is read (as a shard recovering would) and each job
   is given to the new shard its queue hashes to, exactly as it was (ready,
   scheduled, leased with its deadline, finished with its result);
2. the new shards' logs are written as snapshots in ``.reshard/`` beside
   the old ones, with the new ``layout.json``, all fsynced; then the marker
   ``.reshard/READY``. Until the marker exists, the old directory is
   untouched and a crash leaves it as it was (the half-written ``.reshard/``
   is removed at the next start);
3. from the marker on, the change is rolled forward, at this start or the
   next after a crash: the old shard directories go to ``.reshard-old/``
   (``OLD_MOVED`` records that they all did), the new ones take their
   places, the new layout replaces the old, and both scratch directories
   are removed. Every step is a rename, so repeating it is harmless.

Job numbers made before the change are asked of every shard from then on
(the number file's floor is raised); new ones come in blocks as before.
Leased jobs come back ready at the new shard's start, as after any restart.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections import defaultdict
from typing import Dict, Iterator, List

from .engine import Engine
from .engine.effects import Event
from .jobnumbers import NumberFile
from .placement import shard_for
from .store import recover, shard_dir
from .store.compaction import install_snapshot, write_snapshot
from .store.segments import fsync_dir

log = logging.getLogger("queueserver.supervisor")

STAGING = ".reshard"
TRASH = ".reshard-old"
READY = "READY"
OLD_MOVED = "OLD_MOVED"
_SHARD_DIR = re.compile(r"shard-\d+\Z")


def _no_pause() -> None:
    """Nothing else runs while a directory is re-sharded."""


def finish_interrupted(data_dir: str, layout_file: str) -> bool:
    """Complete (or, before its marker, undo) a re-shard a crash cut short;
    True if one was completed."""
    staging = os.path.join(data_dir, STAGING)
    if not os.path.isdir(staging):
        shutil.rmtree(os.path.join(data_dir, TRASH), ignore_errors=True)
        return False
    if not os.path.exists(os.path.join(staging, READY)):
        log.warning("data directory %s: removing a re-shard that was cut short before it was "
                    "complete (the old shards are untouched)", data_dir)
        shutil.rmtree(staging)
        return False
    log.warning("data directory %s: finishing a re-shard that was cut short", data_dir)
    _switch(data_dir, layout_file)
    return True


def reshard(data_dir: str, old: int, new: int, layout: Dict[str, object], layout_file: str,
            numbers: str) -> None:
    """Re-shard ``data_dir`` from ``old`` to ``new`` shards (see the module
    docstring); ``layout`` is the new layout.json's content."""
    started = time.monotonic()
    staging = os.path.join(data_dir, STAGING)
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging, 0o700)
    engines = [_read(data_dir, index, old) for index in range(old)]
    last_number = max(engine.last_number for engine in engines)
    evicted = sum(engine.evicted for engine in engines)
    queues: Dict[int, List[str]] = defaultdict(list)
    for engine in engines:
        for name in engine.queues:
            queues[shard_for(name, new)].append(name)
    now = time.time_ns() // 1000
    jobs = 0
    for index in range(new):
        directory = os.path.join(staging, f"shard-{index}")
        os.makedirs(directory, 0o700)
        records = _records(engines, index, new, queues[index], last_number, evicted if index == 0 else 0)
        tmp, _, count = write_snapshot(directory, index, new, 1, records, now, pause=_no_pause)
        install_snapshot(tmp)
        jobs += count
    with open(os.path.join(staging, layout_file), "w") as f:
        json.dump(layout, f)
        f.flush()
        os.fsync(f.fileno())
    NumberFile(numbers).raise_floor(last_number)   # numbers made so far: ask every shard
    with open(os.path.join(staging, READY), "w") as f:
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(staging)
    _switch(data_dir, layout_file)
    held = sum(len(engine.jobs) for engine in engines)
    log.info("data directory %s re-sharded from %d to %d shards: %d jobs in %d queues in %.2f s",
             data_dir, old, new, held, sum(len(names) for names in queues.values()),
             time.monotonic() - started)


def _read(data_dir: str, index: int, shards: int) -> Engine:
    """Old shard ``index``'s state, as its log rebuilds it."""
    engine = Engine(shard=index, shards=shards)
    engine.replay(recover(shard_dir(data_dir, index), index, shards))
    return engine


def _records(engines: List[Engine], index: int, new: int, queues: List[str], last_number: int,
             evicted: int) -> Iterator[Event]:
    """The snapshot of new shard ``index``: the counters, its queues, its jobs."""
    yield ("counters", last_number, evicted)
    for name in queues:
        yield ("queue", name)
    for engine in engines:
        for job in engine.jobs.values():
            if shard_for(job.name, new) == index:
                yield Engine.job_event(job)


def _switch(data_dir: str, layout_file: str) -> None:
    """Roll a ready re-shard forward; each step may be repeated after a crash."""
    staging = os.path.join(data_dir, STAGING)
    trash = os.path.join(data_dir, TRASH)
    if not os.path.exists(os.path.join(staging, OLD_MOVED)):
        os.makedirs(trash, 0o700, exist_ok=True)
        for name in os.listdir(data_dir):
            if _SHARD_DIR.match(name):
                os.rename(os.path.join(data_dir, name), os.path.join(trash, name))
        fsync_dir(trash)
        fsync_dir(data_dir)
        with open(os.path.join(staging, OLD_MOVED), "w") as f:
            os.fsync(f.fileno())
        fsync_dir(staging)
    for name in os.listdir(staging):
        if _SHARD_DIR.match(name):
            os.rename(os.path.join(staging, name), os.path.join(data_dir, name))
    fsync_dir(data_dir)
    staged_layout = os.path.join(staging, layout_file)
    if os.path.exists(staged_layout):
        os.replace(staged_layout, os.path.join(data_dir, layout_file))
        fsync_dir(data_dir)
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)
