"""Compaction: a snapshot segment replaces the history before it.

Disk use must follow the live jobs, not everything that ever happened. A
snapshot is a segment with the base flag holding records that rebuild the
live state (the caller's: e.g. one add-like record per live job). It is
written under a ``.tmp`` name and fsynced, then renamed into place and the
directory fsynced; only then are the older segments removed. A crash at any
step leaves either the full history (the ``.tmp`` is removed at recovery) or
the snapshot and what follows it (older segments are removed at recovery).

The orchestration (cutting the log at a point so later records go to a
segment after the snapshot) is :meth:`AppendLog.compact
<queueserver.store.writer.AppendLog.compact>`; here are the steps and the
policy.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Protocol, Sequence, Tuple, TypeVar

import gevent

from . import format as F
from .segments import TMP_SUFFIX, abandon, fsync_dir, segment_name, write_all

MIB = 1024 * 1024
DEFAULT_MIN_BYTES = 64 * MIB
DEFAULT_FACTOR = 2.0

_T = TypeVar("_T")


class Runner(Protocol):
    """``run(func, *args)``: ``func(*args)``, wherever it runs (the writer's threadpool)."""

    def __call__(self, func: Callable[..., _T], *args: Any) -> _T: ...


def should_compact(log_bytes: int, snapshot_bytes: int, min_bytes: int = DEFAULT_MIN_BYTES,
                   factor: float = DEFAULT_FACTOR) -> bool:
    """Compact once the log outgrows both a floor and ``factor`` × the last snapshot.

    The floor keeps a small server from compacting all the time; the factor
    bounds disk use to a constant times the live state (a snapshot is about
    the live state's size), and makes compaction's cost amortised: each
    compaction writes the live state once per as many bytes of history.
    """
    return log_bytes > max(min_bytes, factor * snapshot_bytes)


def _direct(func: Callable[..., _T], *args: Any) -> _T:
    return func(*args)


def write_snapshot(directory: str, shard: int, shards: int, seq: int, records: Iterable[Sequence[Any]],
                   created_us: int, run: Runner = _direct, chunk_records: int = 1000,
                   pause: Callable[[], object] = gevent.sleep, epoch: int = 0) -> Tuple[str, int, int]:
    """Write ``records`` as snapshot ``seq`` under its temporary name, fsynced.

    Records are encoded ``chunk_records`` at a time, each chunk written by
    ``run(func, *args)`` (the writer passes its threadpool), with ``pause()``
    (a yield to the event loop) between chunks so the shard keeps serving; a
    forked child that writes alone passes a pause that does nothing. Returns
    the temporary path, its size and the record count; the caller installs it.
    Its records carry ``epoch``: the log's when it was cut (see :mod:`.format`).
    """
    tmp = os.path.join(directory, segment_name(seq) + TMP_SUFFIX)
    fd = run(os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    size = count = 0
    try:
        chunk = bytearray(F.encode_header(shard, shards, seq, created_us, base=True))
        for record in records:
            chunk += F.encode_record(record, epoch)
            count += 1
            if count % chunk_records == 0:
                run(write_all, fd, bytes(chunk))
                size += len(chunk)
                chunk.clear()
                pause()
        run(write_all, fd, bytes(chunk))
        size += len(chunk)
        run(os.fsync, fd)
    except BaseException:
        abandon(fd, tmp)
        raise
    os.close(fd)
    return tmp, size, count


def install_snapshot(tmp: str) -> str:
    """Rename a written snapshot into place, durably; its final path."""
    final = tmp[:-len(TMP_SUFFIX)]
    os.rename(tmp, final)
    fsync_dir(os.path.dirname(final) or ".")
    return final
