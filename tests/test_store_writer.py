"""The writer: group commit under `always`, the `interval` and `never` policies."""
import os
import threading
import time

import gevent
import pytest
from gevent.threadpool import ThreadPool

from queueserver.store import AppendLog, StoreError, recover


def wait_for(condition):
    while not condition():
        gevent.sleep(0.002)


def open_log(directory, **options):
    rec = recover(str(directory), 0, 1)
    list(rec)
    return AppendLog(rec, **options).start()


def test_appends_during_an_fsync_are_covered_by_the_next_single_fsync(tmp_path):
    pool = ThreadPool(1)
    wal = open_log(tmp_path, threadpool=pool, slow_sync_ms=0)   # every fsync in the pool
    gate = threading.Event()
    pool.spawn(gate.wait)                 # the only thread is busy: the next fsync is in progress
    acks = []
    wal.append(("add", "first"))
    wal.commit(acks.append)
    wait_for(lambda: wal.stats()["in_flight_records"] == 1)
    served = []
    for i in range(99):                   # the loop keeps serving meanwhile
        wal.append(("add", i))
        wal.commit(acks.append)
        served.append(i)
        gevent.sleep(0)
    assert acks == [] and len(served) == 99
    gate.set()
    wait_for(lambda: len(acks) == 100)
    assert acks == [None] * 100
    stats = wal.stats()
    assert stats["fsyncs"] == 2
    assert stats["max_records_per_fsync"] == 99
    assert stats["fsynced_records"] == 100
    wal.close()
    pool.kill()
    assert list(recover(str(tmp_path), 0, 1)) == [("add", "first")] + [("add", i) for i in range(99)]


class CountingPool:
    """The hub's threadpool, counting the file work given to it."""

    def __init__(self) -> None:
        self.calls = 0

    def apply(self, func, args=(), kwds=None):
        self.calls += 1
        return gevent.get_hub().threadpool.apply(func, args, kwds)


def test_fast_fsyncs_run_in_the_loop_and_a_slow_one_sends_the_next_to_the_pool(tmp_path, monkeypatch):
    """Group commit with no threadpool round trip while the disk is fast;
    after an fsync slower than slow_sync_ms, the pool, until one is fast."""
    pool = CountingPool()
    wal = open_log(tmp_path, threadpool=pool, slow_sync_ms=50)
    started = pool.calls   # (opening the first segment)
    for i in range(5):
        wal.append(("add", i))
        wal.sync()
    stats = wal.stats()
    assert (stats["fsyncs"], stats["pooled_fsyncs"], pool.calls - started) == (5, 0, 0)

    fdatasync = os.fdatasync

    def slow(fd):
        time.sleep(0.08)
        fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    wal.append(("add", "slow"))
    wal.sync()                                  # in the loop still, but slow:
    assert wal.stats()["pooled_fsyncs"] == 0
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    wal.append(("add", "pooled"))
    wal.sync()                                  # the next one goes to the pool, and is fast:
    wal.append(("add", "back"))
    wal.sync()                                  # so the one after is in the loop again
    stats = wal.stats()
    assert (stats["fsyncs"], stats["pooled_fsyncs"], pool.calls - started) == (8, 1, 1)
    wal.close()
    assert list(recover(str(tmp_path), 0, 1)) == [("add", i) for i in range(5)] + [
        ("add", "slow"), ("add", "pooled"), ("add", "back")]


def test_concurrent_committers_share_fsyncs(tmp_path):
    wal = open_log(tmp_path)

    def client(c):
        for i in range(20):
            wal.append(("add", f"{c}-{i}"))
            wal.sync()

    gevent.joinall([gevent.spawn(client, c) for c in range(50)], raise_error=True)
    stats = wal.stats()
    assert stats["appended_records"] == 1000 == stats["fsynced_records"]
    assert stats["fsyncs"] < 1000
    assert stats["max_records_per_fsync"] > 1
    wal.close()
    recovered = list(recover(str(tmp_path), 0, 1))
    assert sorted(recovered) == sorted(("add", f"{c}-{i}") for c in range(50) for i in range(20))
    for c in range(50):   # each client's records in its order
        mine = [r[1] for r in recovered if r[1].startswith(f"{c}-")]
        assert mine == [f"{c}-{i}" for i in range(20)]


def test_commit_with_nothing_pending_answers_at_once(tmp_path):
    wal = open_log(tmp_path)
    acks = []
    wal.commit(acks.append)
    assert acks == [None]
    wal.append(("x",))
    wal.sync()
    wal.commit(acks.append)
    assert acks == [None, None]
    wal.close()


def test_interval_acknowledges_after_the_write_and_fsyncs_in_the_background(tmp_path):
    wal = open_log(tmp_path, policy="interval", interval_ms=5)
    for i in range(10):
        wal.append(("add", i))
    wal.sync()
    assert wal.stats()["pending_bytes"] == 0
    wait_for(lambda: wal.stats()["fsynced_records"] == 10)
    assert wal.stats()["fsyncs"] >= 1
    wal.close()
    assert list(recover(str(tmp_path), 0, 1)) == [("add", i) for i in range(10)]


def test_never_writes_without_fsync(tmp_path):
    wal = open_log(tmp_path, policy="never")
    for i in range(50):
        wal.append(("add", i))
        wal.sync()
    assert wal.stats()["fsyncs"] == 0
    assert wal.stats()["written_bytes"] > 0
    wal.close()
    assert list(recover(str(tmp_path), 0, 1)) == [("add", i) for i in range(50)]


def test_appends_without_commit_are_written_too(tmp_path):
    wal = open_log(tmp_path)
    wal.append(("add", 1))
    wait_for(lambda: wal.stats()["pending_bytes"] == 0)
    assert wal.stats()["fsyncs"] == 1
    wal.close()


def test_closed_log_refuses_appends_and_commits(tmp_path):
    wal = open_log(tmp_path)
    wal.append(("add", 1))
    wal.close()
    with pytest.raises(StoreError, match="closed"):
        wal.append(("add", 2))
    wal.close()   # twice is harmless
    assert list(recover(str(tmp_path), 0, 1)) == [("add", 1)]


def test_a_failing_callback_does_not_stop_the_writer(tmp_path, caplog):
    wal = open_log(tmp_path)
    wal.append(("add", 1))
    wal.commit(lambda err: 1 / 0)
    wal.append(("add", 2))
    wal.sync()
    assert "a commit callback failed" in caplog.text
    wal.close()
