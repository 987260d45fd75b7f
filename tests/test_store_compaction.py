"""Compaction: live records kept, history dropped, crashes between its steps recover."""
import logging
import os
import shutil

import gevent
import gevent.event
import pytest

from queueserver.store import AppendLog, StoreError, recover, should_compact
from queueserver.store.compaction import DEFAULT_MIN_BYTES


def open_log(directory, **options):
    rec = recover(str(directory), 0, 1)
    replayed = list(rec)
    return AppendLog(rec, **options).start(), replayed


def files(directory):
    return sorted(os.listdir(directory))


def add(i, size=50):
    return ("add", f"job-{i}", i, "q", b"x" * size)


def test_policy_helper():
    mib = 1024 * 1024
    assert not should_compact(10 * mib, 0)
    assert not should_compact(DEFAULT_MIN_BYTES, 0)
    assert should_compact(DEFAULT_MIN_BYTES + 1, 0)
    assert not should_compact(150 * mib, 100 * mib)      # under 2 × the snapshot
    assert should_compact(201 * mib, 100 * mib)
    assert should_compact(5000, 1000, min_bytes=4096, factor=4.0)
    assert not should_compact(3999, 1000, min_bytes=100, factor=4.0)


class Model:
    """Live jobs as a shard would hold them: what a snapshot rebuilds."""

    def __init__(self):
        self.live = {}

    def apply(self, wal, record):
        if record[0] == "add":
            self.live[record[1]] = record
        else:
            del self.live[record[1]]
        wal.append(record)

    def snapshot(self):
        return list(self.live.values())


def replay(records):
    model = Model()
    for record in records:
        if record[0] == "add":
            model.live[record[1]] = record
        elif record[0] == "delete":
            del model.live[record[1]]
    return model.live


def mostly_history(directory, **options):
    """A log of 1,000 adds of which 900 were deleted: mostly history. The log,
    its live jobs, and its size on disk."""
    wal, _ = open_log(directory, compact_min_bytes=4096, **options)
    model = Model()
    for i in range(1000):
        model.apply(wal, add(i))
        if i % 10:
            model.apply(wal, ("delete", f"job-{i}"))
    wal.sync()
    return wal, model, wal.disk_bytes()


class SlowNewSegments:
    """The hub's threadpool, except that once ``gate`` is armed, making a new
    segment waits until it is set: a writer that has not rotated yet, as on
    a busy machine (the pool is what the log is given; a monkeypatched method
    would not reach the compiled writer's own calls)."""

    def __init__(self) -> None:
        self.gate = gevent.event.Event()
        self.armed = False

    def apply(self, func, args=(), kwds=None):
        if self.armed and len(args) > 1 and getattr(args[0], "__name__", "") == "_new_segment":
            self.gate.wait()
        return gevent.get_hub().threadpool.apply(func, args, kwds)


def test_compaction_keeps_live_records_and_drops_history(tmp_path):
    directory = str(tmp_path)
    wal, model, before = mostly_history(directory)
    assert wal.needs_compaction()
    result = wal.compact(model.snapshot())
    assert result["records"] == 100
    assert wal.disk_bytes() < before / 5
    assert not wal.needs_compaction()
    model.apply(wal, add(5000))
    wal.sync()
    wal.close()
    assert files(directory) == ["00000002.log", "00000003.log"]
    recovered = list(recover(directory, 0, 1))
    assert recovered == [add(i) for i in range(0, 1000, 10)] + [add(5000)]


def test_a_compaction_finished_before_its_segment_rotates_counts_the_segment_gone(tmp_path):
    """On a busy machine the snapshot can be installed before the writer has
    rotated away from the segment it replaces; that segment is obsolete and
    must not ask for a second compaction at once."""
    directory = str(tmp_path)
    pool = SlowNewSegments()
    wal, model, before = mostly_history(directory, threadpool=pool)
    pool.armed = True
    wal.compact(model.snapshot())
    assert files(directory) == ["00000001.log", "00000002.log"]   # not rotated yet
    assert wal.disk_bytes() < before / 5
    assert not wal.needs_compaction()
    pool.gate.set()
    wal.close()
    assert files(directory) == ["00000002.log", "00000003.log"]
    assert list(recover(directory, 0, 1)) == [add(i) for i in range(0, 1000, 10)]


def test_records_appended_during_compaction_are_kept_after_the_snapshot(tmp_path):
    directory = str(tmp_path)
    wal, _ = open_log(directory)
    model = Model()
    for i in range(300):
        model.apply(wal, add(i))
    wal.sync()
    snapshot = model.snapshot()
    during = []

    def appender():
        i = 0
        while not compaction.ready():
            record = ("mark", i)
            wal.append(record)
            during.append(record)
            wal.sync()
            i += 1

    compaction = gevent.spawn(wal.compact, snapshot, chunk_records=5)
    writer = gevent.spawn(appender)
    gevent.joinall([compaction, writer], raise_error=True)
    assert len(during) > 1          # the event loop served while the snapshot was written
    wal.close()
    assert list(recover(directory, 0, 1)) == snapshot + during


def test_disk_use_follows_live_jobs_not_history(tmp_path):
    directory = str(tmp_path)
    wal, _ = open_log(directory, segment_bytes=8192, compact_min_bytes=32768)
    model = Model()
    written = 0
    for i in range(20000):
        model.apply(wal, add(i))
        written += 1
        if i >= 10:
            model.apply(wal, ("delete", f"job-{i - 10}"))
        if i % 100 == 99:
            wal.sync()
            if wal.needs_compaction():
                wal.compact(model.snapshot())
            assert wal.disk_bytes() < 32768 + 2 * 8192
    assert wal.compactions > 10
    assert wal.stats()["written_bytes"] > 50 * wal.disk_bytes()
    wal.sync()
    wal.close()
    assert sum(os.path.getsize(os.path.join(directory, f)) for f in files(directory)) < 50000
    assert replay(recover(directory, 0, 1)) == model.live


def crash_states(tmp_path):
    """Run a compaction with records before and after it; the directories a
    crash between its steps would leave, and what each must recover."""
    live = str(tmp_path / "live")
    wal, _ = open_log(live, segment_bytes=2048)
    model = Model()
    for i in range(200):
        model.apply(wal, add(i))
        if i % 2:
            model.apply(wal, ("delete", f"job-{i}"))
    wal.sync()
    history = list(recover_copy(live, tmp_path / "peek"))
    old = str(tmp_path / "old")
    shutil.copytree(live, old)          # the segments before the cut, complete
    snapshot = model.snapshot()
    wal.compact(snapshot)
    after = [add(1000 + i) for i in range(20)]
    for record in after:
        wal.append(record)
    wal.sync()
    wal.close()
    snap_name = sorted(f for f in files(live) if f not in files(old))[0]
    return live, old, snap_name, history, snapshot, after


def recover_copy(directory, scratch):
    shutil.copytree(directory, str(scratch))
    return recover(str(scratch), 0, 1)


def test_crash_before_the_snapshot_is_renamed_recovers_the_full_history(tmp_path, caplog):
    live, old, snap_name, history, snapshot, after = crash_states(tmp_path)
    crashed = str(tmp_path / "crashed")
    shutil.copytree(old, crashed)
    for name in files(live):
        if name == snap_name:      # written and fsynced, not yet renamed
            shutil.copy(os.path.join(live, name), os.path.join(crashed, name + ".tmp"))
        elif name not in files(old):
            shutil.copy(os.path.join(live, name), os.path.join(crashed, name))
    caplog.set_level(logging.INFO, "queueserver.store")
    recovered = list(recover(crashed, 0, 1))
    assert recovered == history + after
    assert replay(recovered) == replay(snapshot + after)
    assert not [f for f in files(crashed) if f.endswith(".tmp")]
    assert "removing an unfinished segment or snapshot" in caplog.text


def test_crash_before_old_segments_are_removed_recovers_from_the_snapshot(tmp_path):
    live, old, snap_name, history, snapshot, after = crash_states(tmp_path)
    crashed = str(tmp_path / "crashed")
    shutil.copytree(old, crashed)
    for name in files(live):
        shutil.copy(os.path.join(live, name), os.path.join(crashed, name))
    assert len(files(crashed)) > len(files(live))
    assert list(recover(crashed, 0, 1)) == snapshot + after
    assert files(crashed) == files(live)     # the obsolete segments are gone


def test_crash_right_after_the_snapshot_before_any_later_record(tmp_path):
    live, old, snap_name, history, snapshot, after = crash_states(tmp_path)
    crashed = str(tmp_path / "crashed")
    os.makedirs(crashed)
    shutil.copy(os.path.join(live, snap_name), os.path.join(crashed, snap_name))
    rec = recover(crashed, 0, 1)
    assert list(rec) == snapshot
    wal = AppendLog(rec).start()        # continues after the snapshot, never in it
    wal.append(add(7777))
    wal.close()
    assert list(recover(crashed, 0, 1)) == snapshot + [add(7777)]


def test_a_second_compaction_removes_the_first_snapshot(tmp_path):
    directory = str(tmp_path)
    wal, _ = open_log(directory)
    wal.append(add(1))
    wal.compact([add(1)])
    wal.append(add(2))
    wal.sync()
    wal.compact([add(1), add(2)])
    wal.append(add(3))
    wal.close()
    assert files(directory) == ["00000004.log", "00000005.log"]
    assert list(recover(directory, 0, 1)) == [add(1), add(2), add(3)]


def test_one_compaction_at_a_time(tmp_path):
    wal, _ = open_log(tmp_path)
    for i in range(50):
        wal.append(add(i))
    first = gevent.spawn(wal.compact, [add(i) for i in range(50)], chunk_records=1)
    gevent.sleep(0)
    with pytest.raises(StoreError, match="already running"):
        wal.compact([])
    first.get()
    wal.close()
    with pytest.raises(StoreError, match="not open"):
        wal.compact([])
