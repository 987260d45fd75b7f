"""Recovery on real files: round trip, torn tails cut, corruption refused in one line."""
import logging
import os
import shutil
import struct

import pytest

from queueserver.store import (
    AppendLog, CorruptLog, StoreError, UnknownVersion, WrongShard, recover, shard_dir,
)
from queueserver.store import format as F


def job(i, size=20):
    return ("add", f"job-{i}", i + 1, "q", bytes([i % 256]) * size, 0, 30, 0, 0, 0, 1000 + i, None, False)


def write(directory, records, shard=0, shards=1, **options):
    """Replay what is there, then append ``records`` and close; what was replayed."""
    rec = recover(directory, shard, shards)
    replayed = list(rec)
    wal = AppendLog(rec, **options).start()
    for record in records:
        wal.append(record)
    wal.sync()
    wal.close()
    return replayed


def segments(directory):
    return sorted(name for name in os.listdir(directory) if name.endswith(".log"))


def test_round_trip_and_report(tmp_path, caplog):
    directory = shard_dir(str(tmp_path), 3)
    records = [job(i) for i in range(100)]
    assert write(directory, records, shard=3, shards=4) == []
    caplog.set_level(logging.INFO, "queueserver.store")
    rec = recover(directory, 3, 4)
    assert list(rec) == records
    assert rec.done and rec.records == 100 and rec.seconds >= 0
    assert rec.truncated is None
    assert any("replayed 100 records" in r.getMessage() for r in caplog.records)
    assert directory.endswith("shard-3")


def test_each_start_continues_in_a_new_segment(tmp_path):
    directory = str(tmp_path)
    first, second = [job(i) for i in range(5)], [job(i) for i in range(5, 9)]
    write(directory, first)
    assert write(directory, second) == first
    assert segments(directory) == ["00000001.log", "00000002.log"]
    assert list(recover(directory, 0, 1)) == first + second


def test_rotation_by_size_keeps_order(tmp_path):
    directory = str(tmp_path)
    rec = recover(directory, 0, 1)
    list(rec)
    wal = AppendLog(rec, segment_bytes=1024).start()
    records = [job(i, size=100) for i in range(60)]
    for record in records:
        wal.append(record)
        wal.sync()
    wal.close()
    assert len(segments(directory)) > 3
    assert wal.stats()["segments_created"] == len(segments(directory))
    assert list(recover(directory, 0, 1)) == records


def test_torn_tail_at_every_offset_of_the_last_record(tmp_path, caplog):
    source = str(tmp_path / "source")
    records = [job(i) for i in range(10)]
    write(source, records)
    path = os.path.join(source, "00000001.log")
    data = open(path, "rb").read()
    last = len(F.encode_record(records[-1]))
    start = len(data) - last
    for cut in range(start, len(data)):
        directory = str(tmp_path / f"cut-{cut}")
        os.makedirs(directory)
        with open(os.path.join(directory, "00000001.log"), "wb") as f:
            f.write(data[:cut])
        caplog.clear()
        rec = recover(directory, 0, 1)
        assert list(rec) == records[:-1]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if cut == start:     # ends exactly after a record: a clean end
            assert warnings == [] and rec.truncated is None
        else:
            assert len(warnings) == 1
            assert f"00000001.log: torn tail at byte {start}" in warnings[0]
            assert "the 9 records before it are kept" in warnings[0]
        assert os.path.getsize(os.path.join(directory, "00000001.log")) == start
        # Appends continue cleanly after the cut.
        caplog.clear()
        more = [job(100), job(101)]
        write(directory, more)
        assert list(recover(directory, 0, 1)) == records[:-1] + more
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_bit_flip_in_the_last_record_is_cut_as_a_torn_tail(tmp_path, caplog):
    directory = str(tmp_path)
    records = [job(i) for i in range(10)]
    write(directory, records)
    path = os.path.join(directory, "00000001.log")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size - 3)
        byte = f.read(1)
        f.seek(size - 3)
        f.write(bytes([byte[0] ^ 0x04]))
    assert list(recover(directory, 0, 1)) == records[:-1]
    assert "checksum mismatch" in caplog.text


def flip_record(path, index, at=F.FRAME_SIZE):
    """Flip a bit in record ``index`` of a segment; the record's offset."""
    data = bytearray(open(path, "rb").read())
    offsets = [off for off, _ in F.Scan(bytes(data), 0, 1)]
    data[offsets[index] + at] ^= 0x20
    with open(path, "wb") as f:
        f.write(data)
    return offsets[index]


def test_bit_flip_in_a_middle_record_refuses_with_one_clear_line(tmp_path):
    directory = str(tmp_path)
    write(directory, [job(i) for i in range(10)])
    path = os.path.join(directory, "00000001.log")
    before = open(path, "rb").read()
    offset = flip_record(path, 4)
    with pytest.raises(CorruptLog) as info:
        list(recover(directory, 0, 1))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: corrupt record at byte {offset} (checksum mismatch)")
    assert "refusing to start" in message
    assert os.path.getsize(path) == len(before)      # nothing was cut


def test_damaged_length_in_the_middle_refuses(tmp_path):
    directory = str(tmp_path)
    write(directory, [job(i) for i in range(10)])
    path = os.path.join(directory, "00000001.log")
    data = bytearray(open(path, "rb").read())
    offsets = [off for off, _ in F.Scan(bytes(data), 0, 1)]
    struct.pack_into("<I", data, offsets[3], 1 << 20)
    open(path, "wb").write(data)
    with pytest.raises(CorruptLog, match=f"at byte {offsets[3]} \\(damaged record length\\)"):
        list(recover(directory, 0, 1))


def test_a_torn_older_segment_is_corruption(tmp_path):
    directory = str(tmp_path)
    write(directory, [job(i) for i in range(5)])
    write(directory, [job(i) for i in range(5, 10)])
    path = os.path.join(directory, "00000001.log")
    os.truncate(path, os.path.getsize(path) - 3)
    with pytest.raises(CorruptLog, match="00000001.log: incomplete record .* later segments after it"):
        list(recover(directory, 0, 1))


def test_unknown_version_refuses(tmp_path):
    directory = str(tmp_path)
    write(directory, [job(0)])
    path = os.path.join(directory, "00000001.log")
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<H", data, 8, 3)
    open(path, "wb").write(data)
    with pytest.raises(UnknownVersion) as info:
        list(recover(directory, 0, 1))
    assert str(info.value).startswith(f"{path}: log format version 3, but this build reads versions 1, 2")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("shard, shards", [(1, 2), (0, 4)])
def test_file_of_another_shard_or_shard_count_refuses(tmp_path, shard, shards):
    directory = str(tmp_path)
    write(directory, [job(0)], shard=0, shards=2)
    with pytest.raises(WrongShard) as info:
        list(recover(directory, shard, shards))
    message = str(info.value)
    assert "00000001.log: belongs to shard 0 of 2, but this is shard" in message
    assert f"shard {shard} of {shards}" in message and "\n" not in message
    assert isinstance(info.value, StoreError)


def test_renamed_segment_refuses(tmp_path):
    directory = str(tmp_path)
    write(directory, [job(0)])
    os.rename(os.path.join(directory, "00000001.log"), os.path.join(directory, "00000007.log"))
    with pytest.raises(CorruptLog, match="header says segment 1"):
        list(recover(directory, 0, 1))


def test_newest_segment_with_a_torn_header_is_removed(tmp_path, caplog):
    directory = str(tmp_path)
    records = [job(i) for i in range(3)]
    write(directory, records)
    with open(os.path.join(directory, "00000002.log"), "wb") as f:
        f.write(F.MAGIC[:5])
    assert list(recover(directory, 0, 1)) == records
    assert segments(directory) == ["00000001.log"]
    assert "shorter than its header" in caplog.text


def test_the_writer_needs_a_replayed_recovery(tmp_path):
    rec = recover(str(tmp_path), 0, 1)
    with pytest.raises(StoreError, match="replay the log"):
        AppendLog(rec)
    list(rec)
    with pytest.raises(StoreError, match="read once"):
        list(rec)
    with pytest.raises(ValueError, match="fsync policy"):
        AppendLog(rec, policy="sometimes")


def test_copy_of_a_directory_recovers_the_same(tmp_path):
    directory = str(tmp_path / "a")
    records = [job(i) for i in range(20)]
    write(directory, records)
    shutil.copytree(directory, str(tmp_path / "b"))
    assert list(recover(str(tmp_path / "b"), 0, 1)) == records


def test_the_epoch_survives_restarts_and_compaction(tmp_path):
    """A log written under epochs 3 then 5 says 5 after a restart, continues
    under it, and a snapshot keeps it; ``newest_epoch`` reads it without a replay."""
    from queueserver.store.segments import newest_epoch
    directory = str(tmp_path)
    assert newest_epoch(directory, 0, 1) == 0 and newest_epoch(directory + "/none", 0, 1) == 0
    rec = recover(directory, 0, 1)
    list(rec)
    wal = AppendLog(rec).start()
    assert wal.epoch == 0
    wal.epoch = 3
    wal.append(job(0))
    wal.epoch = 5
    wal.append(job(1))
    wal.sync()
    wal.close()
    assert newest_epoch(directory, 0, 1) == 5
    rec = recover(directory, 0, 1)
    assert list(rec) == [job(0), job(1)] and rec.max_epoch == 5
    wal = AppendLog(rec).start()
    assert wal.epoch == 5      # the newest the log holds, until its owner says otherwise
    wal.compact([job(1)])
    wal.close()
    rec = recover(directory, 0, 1)
    assert list(rec) == [job(1)] and rec.max_epoch == 5
    assert newest_epoch(directory, 0, 1) == 5
    assert write(directory, [job(2)]) == [job(1)]   # an empty newest segment: the one before it speaks
    assert newest_epoch(directory, 0, 1) == 5


def test_a_version_1_log_is_continued_in_version_2(tmp_path):
    directory = str(tmp_path)
    head = struct.pack("<8sHHIIQQ", F.MAGIC, 1, 0, 0, 1, 1, 1234)
    data = bytearray(head + struct.pack("<I", F.xxhash.xxh32_intdigest(head)))
    for i in range(3):
        body = F._packer.pack(job(i))
        data += struct.pack("<III", len(body), F.length_check(len(body)), F.checksum(body, len(body))) + body
    with open(os.path.join(directory, "00000001.log"), "wb") as f:
        f.write(data)
    assert write(directory, [job(3)]) == [job(0), job(1), job(2)]
    rec = recover(directory, 0, 1)
    assert list(rec) == [job(i) for i in range(4)] and rec.max_epoch == 0
    with open(os.path.join(directory, "00000002.log"), "rb") as f:
        assert F.read_header(f.read(F.HEADER_SIZE))[0].version == F.VERSION
