"""The log's byte format, on byte strings: headers, frames, and why a scan stops."""
import struct

import pytest

from queueserver.store import format as F

RECORDS = [
    ("add", "job-1", 1, "emails", b"payload\x00\xff", 5, 30, 0, 3, 2, 1_700_000_000_000_000, None, False),
    ("lease", "job-1", 1_700_000_000_000_100),
    ("complete", "job-1", b"done", 1_700_000_000_000_200),
    ("restore", "j", 7, "q", b"", 0, 0, [0, 1, 2], 5),
    ("delete", "job-1"),
]


def segment(records=RECORDS, shard=0, shards=2, seq=1, base=False):
    return F.encode_header(shard, shards, seq, 1234, base=base) + b"".join(map(F.encode_record, records))


def scan(buf, shard=0, shards=2):
    s = F.Scan(buf, shard, shards)
    return s, [record for _, record in s]


def test_round_trip_keeps_types():
    s, records = scan(segment())
    assert s.stop.kind == F.END and s.stop.offset == len(segment())
    assert s.header == F.Header(F.VERSION, False, 0, 2, 1, 1234)
    # Arrays come back as tuples, bytes as bytes, str as str, None and bools as such.
    assert records[0] == RECORDS[0]
    assert records[3] == ("restore", "j", 7, "q", b"", 0, 0, (0, 1, 2), 5)
    assert [r[0] for r in records] == ["add", "lease", "complete", "restore", "delete"]


def test_header_fields_and_base_flag():
    header, stop = F.read_header(F.encode_header(3, 4, 99, 42, base=True))
    assert stop is None
    assert header == F.Header(F.VERSION, True, 3, 4, 99, 42)
    assert len(F.encode_header(0, 1, 1, 0)) == F.HEADER_SIZE


def test_empty_segment_is_a_clean_end():
    s, records = scan(segment([]))
    assert records == [] and s.stop == F.Stop(F.END, F.HEADER_SIZE, "end of file")


def test_cut_anywhere_in_the_last_record_is_a_torn_tail():
    full = segment()
    last = len(F.encode_record(RECORDS[-1]))
    start = len(full) - last
    for cut in range(start + 1, len(full)):
        s, records = scan(full[:cut])
        assert records == list(scan(full)[1][:-1])
        assert s.stop.kind == F.TORN and s.stop.offset == start, cut
        assert s.end == start


def test_garbage_or_zeros_after_the_last_record_are_a_torn_tail():
    full = segment()
    for tail in (b"\x00" * 4096, b"\xde\xad\xbe\xef" * 3, b"\x05"):
        s, records = scan(full + tail)
        assert len(records) == len(RECORDS)
        assert s.stop.kind == F.TORN and s.stop.offset == len(full)


def test_bit_flip_in_last_record_is_torn_but_in_a_middle_one_is_corruption():
    full = segment()
    offsets = [off for off, _ in F.Scan(full, 0, 2)]
    flipped = bytearray(full)
    flipped[-2] ^= 0x10
    s, records = scan(bytes(flipped))
    assert s.stop.kind == F.TORN and s.stop.offset == offsets[-1]
    assert s.stop.detail == "checksum mismatch"
    assert len(records) == len(RECORDS) - 1

    flipped = bytearray(full)
    flipped[offsets[1] + F.FRAME_SIZE] ^= 0x01
    s, records = scan(bytes(flipped))
    assert s.stop.kind == F.CORRUPT
    assert s.stop.offset == offsets[1] and s.stop.resume == offsets[2]
    assert len(records) == 1


def test_a_damaged_length_in_the_middle_is_not_mistaken_for_a_torn_tail():
    # A length pointing past the end of the file would look like an
    # incomplete record; its own check fails, and the valid records after it
    # make it corruption.
    full = segment()
    offsets = [off for off, _ in F.Scan(full, 0, 2)]
    flipped = bytearray(full)
    struct.pack_into("<I", flipped, offsets[2], 10_000)
    s, _ = scan(bytes(flipped))
    assert s.stop == F.Stop(F.CORRUPT, offsets[2], "damaged record length", offsets[3])


def test_a_torn_record_whose_payload_holds_frames_is_still_a_torn_tail():
    # A client may send any bytes, even our own frames: inside a record whose
    # (verified) length runs past the end they are payload, not records.
    inner = b"".join(F.encode_record(("delete", f"fake-{i}")) for i in range(50))
    full = segment(RECORDS + [("add", "evil", 1, "q", inner)])
    start = len(segment())
    for cut in range(start + 1, len(full), 7):
        s, records = scan(full[:cut])
        assert s.stop.kind == F.TORN and s.stop.offset == start, cut
        assert records == scan(segment())[1]


def test_zeros_where_a_frame_should_be_are_garbage():
    s, records = scan(segment() + b"\0" * 12 + F.encode_record(("x",)))
    assert s.stop.kind == F.CORRUPT and s.stop.detail == "damaged record length"
    s, records = scan(segment() + b"\0" * 100)
    assert s.stop.kind == F.TORN and len(records) == len(RECORDS)


def test_impossible_lengths_with_a_valid_check_are_refused():
    for length in (0, F.MAX_RECORD + 1):
        frame = struct.pack("<III", length, F.length_check(length), 0)
        s, _ = scan(segment() + frame + F.encode_record(("x",)))
        assert s.stop.kind == F.CORRUPT
        assert s.stop.detail == f"impossible record length {length}"


def test_unknown_version_is_reported_before_anything_else():
    buf = bytearray(segment())
    struct.pack_into("<H", buf, 8, 7)
    s, records = scan(bytes(buf))
    assert records == []
    assert s.stop.kind == F.VERSION_UNKNOWN
    assert "version 7" in s.stop.detail


def test_other_shard_and_other_shard_count_are_refused():
    s, records = scan(segment(shard=1, shards=2), shard=0, shards=2)
    assert records == [] and s.stop.kind == F.OTHER_SHARD
    assert "shard 1 of 2" in s.stop.detail and "shard 0 of 2" in s.stop.detail
    s, _ = scan(segment(shard=0, shards=4), shard=0, shards=2)
    assert s.stop.kind == F.OTHER_SHARD and "of 4" in s.stop.detail


def test_not_a_log_damaged_header_and_short_header():
    assert scan(b"hello world, this is not a log file at all")[0].stop.kind == F.NOT_A_LOG
    buf = bytearray(segment())
    buf[20] ^= 0xFF                       # the shard count, under the header checksum
    assert scan(bytes(buf))[0].stop.kind == F.NOT_A_LOG
    for cut in (0, 3, 9, F.HEADER_SIZE - 1):
        assert scan(segment()[:cut])[0].stop.kind == F.TORN


def test_record_size_limit():
    with pytest.raises(ValueError):
        F.encode_record(("add", b"x" * (F.MAX_RECORD + 1)))


# ------------------------------------------------------------------ epochs
def test_every_record_carries_its_epoch_and_the_checksum_covers_it():
    buf = F.encode_header(0, 2, 1, 1234) + F.encode_record(("lease", "a", 1), 0) + \
        F.encode_record(("lease", "b", 2), 7) + F.encode_record(("lease", "c", 3), 9)
    s = F.Scan(buf, 0, 2)
    epochs = []
    for _, record in s:
        epochs.append((record[1], s.epoch))
    assert epochs == [("a", 0), ("b", 7), ("c", 9)] and s.max_epoch == 9
    # A record whose epoch was changed (a deposed primary's record passed off as newer) fails its checksum.
    offsets = [off for off, _ in F.Scan(buf, 0, 2)]
    forged = bytearray(buf)
    struct.pack_into("<I", forged, offsets[1] + 12, 8)
    s, records = scan(bytes(forged))
    assert s.stop.kind == F.CORRUPT and s.stop.detail == "checksum mismatch" and len(records) == 1


def _v1_segment(records, shard=0, shards=2, seq=1):
    """A segment as version 1 wrote it: 12-byte frames, no epoch."""
    head = struct.pack("<8sHHIIQQ", F.MAGIC, 1, 0, shard, shards, seq, 1234)
    out = bytearray(head + struct.pack("<I", F.xxhash.xxh32_intdigest(head)))
    for record in records:
        body = F._packer.pack(record)
        out += struct.pack("<III", len(body), F.length_check(len(body)), F.checksum(body, len(body))) + body
    return bytes(out)


def test_a_version_1_segment_is_still_read_with_epoch_0():
    buf = _v1_segment(RECORDS)
    s, records = scan(buf)
    assert s.header.version == 1 and s.stop.kind == F.END
    assert records == scan(segment())[1] and s.max_epoch == 0
    # its torn tail is still told from corruption, with its own frame size
    s, records = scan(buf[:-3])
    assert s.stop.kind == F.TORN and len(records) == len(RECORDS) - 1
    flipped = bytearray(buf)
    offsets = [off for off, _ in F.Scan(buf, 0, 2)]
    flipped[offsets[1] + 12] ^= 0x01
    s, records = scan(bytes(flipped))
    assert s.stop.kind == F.CORRUPT and s.stop.resume == offsets[2]
