"""The job history's retention, through real servers and real sockets.

A soak at a fixed rate with a small ``--history-max-bytes`` must keep the
history (and so the data directory) under the bound at every moment it is
looked at; files past ``--history-max-age`` go; the history's bytes and
files are in ``/metrics``; ``--no-history`` writes none; and a history file
dropped before ``queueserver history``'s checkpoint read all of it is one
warning line, while one it read is one info line.
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from queueserver.client import Client
from queueserver.shard.history import FIELDS, SEGMENT_NAME, decode

from serverproc import ServerProcess, http_get, one_line_error, run_cli, wait_for

#: long queue names make long lines: more history per cycle for the same CPU
QUEUES = [f"retention-{i}-" + "x" * 90 for i in range(8)]
DROPPED = re.compile(r" (INFO|WARNING) shard \d+: history retention dropped (history-\S+\.jsonl) "
                     r"\((\d+) bytes, [^)]*\)(.*)$", re.MULTILINE)


# ------------------------------------------------------------------ helpers
def segments(directory: Path) -> List[Path]:
    """A shard's history files, newest first."""
    found = [p for p in directory.glob("history-*.jsonl") if SEGMENT_NAME.match(p.name)]
    return sorted(found, key=lambda p: tuple(map(int, SEGMENT_NAME.match(p.name).groups())), reverse=True)


def history_bytes(directory: Path) -> int:
    """A shard's history bytes, as they are at one moment: newest file first, so
    that a file dropped to make room for bytes counted already is not counted
    too (retention removes before the writer writes)."""
    total = 0
    for path in segments(directory):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


def tree_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def cycles(port: int, rate: float, seconds: float, between: Callable[[], None] = lambda: None) -> int:
    """Full workq cycles (add, lease, complete) paced to ``rate`` per second for
    ``seconds`` (fewer if the machine is slower), calling ``between`` about ten
    times a second. Finished jobs live 1 s, so the live state stays small."""
    done = 0
    started = time.monotonic()
    last = started
    with Client(port=port) as client:
        while time.monotonic() - started < seconds:
            queue = QUEUES[done % len(QUEUES)]
            client.add(str(uuid.uuid4()), queue, b"p" * 100, 60_000, 1000)
            job = client.lease([queue], 1000)
            client.complete(job.id, b"")
            done += 1
            ahead = started + done / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            if time.monotonic() - last >= 0.1:
                between()
                last = time.monotonic()
    return done


def scrape(proc: ServerProcess) -> Dict[str, Dict[str, float]]:
    """The per-shard samples of ``/metrics``, over HTTP: name -> shard -> value."""
    samples: Dict[str, Dict[str, float]] = {}
    for family in text_string_to_metric_families(http_get(proc, "/metrics").decode()):
        for sample in family.samples:
            if "shard" in sample.labels:
                samples.setdefault(sample.name, {})[sample.labels["shard"]] = sample.value
    return samples


def per_shard(samples: Dict[str, Dict[str, float]], name: str) -> Dict[str, float]:
    return samples.get(name, {})


def dropped_lines(log: str) -> Dict[str, List[tuple]]:
    """Segment name -> every retention line about it: (level, bytes, the rest)."""
    lines: Dict[str, List[tuple]] = {}
    for level, name, size, rest in DROPPED.findall(log):
        lines.setdefault(name, []).append((level, int(size), rest))
    return lines


def server(tmp_path: Path, shards: int, *extra: str) -> ServerProcess:
    return ServerProcess(shards=shards, protocols=["workq"],
                         extra=["--data-dir", str(tmp_path / "data"), "--fsync", "never", *extra])


# -------------------------------------------------------------------- tests
def test_a_soak_at_a_fixed_rate_keeps_the_data_directory_under_the_bound(tmp_path):
    """150 cycles/s for 20 s (some 1.8 MB of history) on 2 shards, with the
    history bounded to 512 KiB and the logs compacted past 64 KiB: the
    history never passes its bound, nor the data directory the bound plus
    the logs' allowance (four times the compaction threshold per shard)."""
    shards, bound, compact = 2, 512 << 10, 64 << 10
    data = tmp_path / "data"
    dirs = [data / "history" / f"shard-{i}" for i in range(shards)]
    largest = {"history": 0, "shard": 0, "data": 0}

    def look() -> None:
        sizes = [history_bytes(d) for d in dirs]
        largest["shard"] = max(largest["shard"], *sizes)
        largest["history"] = max(largest["history"], sum(sizes))
        largest["data"] = max(largest["data"], tree_bytes(data))

    with server(tmp_path, shards, "--history-max-bytes", str(bound),
                "--compact-after-bytes", str(compact)) as proc:
        done = cycles(proc.ports["workq"], rate=150, seconds=20, between=look)
        look()
        samples = scrape(proc)
    log = proc.log()
    written = sum(per_shard(samples, "queueserver_history_bytes").values())
    dropped = dropped_lines(log)
    total = written + sum(size for lines in dropped.values() for _, size, _ in lines)
    print(f"{done} cycles; history written {total} B ({total / done:.0f} B per cycle), largest: {largest}")
    assert total > 2 * bound, "too little history to test the bound"
    assert largest["shard"] <= bound // shards
    assert largest["history"] <= bound
    assert largest["data"] <= bound + shards * 4 * compact
    assert all(len(lines) == 1 for lines in dropped.values())   # one line per dropped file
    assert sum(per_shard(samples, "queueserver_history_segments_dropped_total").values()) == len(dropped)


def test_files_past_the_age_go(tmp_path):
    """With --history-max-age 2, files close every quarter second and go two
    seconds after their last line: once traffic stops, the history empties."""
    history = tmp_path / "data" / "history" / "shard-0"
    with server(tmp_path, 1, "--history-max-age", "2") as proc:
        cycles(proc.ports["workq"], rate=100, seconds=3)
        wait_for(lambda: len(segments(history)) > 0, 10, "history files")
        wait_for(lambda: not segments(history), 20, lambda: f"old history files to go:\n{proc.log()}")
        samples = scrape(proc)
    assert per_shard(samples, "queueserver_history_bytes") == {"0": 0}
    assert per_shard(samples, "queueserver_history_segments") == {"0": 0}
    assert re.search(r"history retention dropped history-\S+ \(\d+ bytes, older than max_age 2 s\)",
                     proc.log())


def test_metrics_show_the_history_bytes_and_files_of_each_shard(tmp_path):
    """Scraped over HTTP, ``queueserver_history_bytes`` and
    ``queueserver_history_segments`` are what each shard's directory holds."""
    data = tmp_path / "data"
    dirs = {str(i): data / "history" / f"shard-{i}" for i in range(2)}
    with server(tmp_path, 2, "--history-max-bytes", str(128 << 10)) as proc:
        cycles(proc.ports["workq"], rate=200, seconds=4)
        on_disk: Dict[str, tuple] = {}
        seen: List[Optional[dict]] = [None]

        def agree() -> bool:
            samples = scrape(proc)
            for shard, directory in dirs.items():
                on_disk[shard] = (history_bytes(directory), len(segments(directory)))
            seen[0] = samples
            return all(per_shard(samples, "queueserver_history_bytes").get(s) == b
                       and per_shard(samples, "queueserver_history_segments").get(s) == n
                       for s, (b, n) in on_disk.items())

        wait_for(agree, 20, lambda: f"metrics {seen[0]} to show the files {on_disk}")
    samples = seen[0]
    assert all(b > 0 and n > 0 for b, n in on_disk.values())
    assert sum(per_shard(samples, "queueserver_history_segments_dropped_total").values()) > 0
    assert set(per_shard(samples, "queueserver_history_unread_segments_dropped_total").values()) == {0}


def test_no_history_flag_writes_none_and_overrides_the_file(tmp_path):
    config = tmp_path / "qs.toml"
    config.write_text("[history]\nenabled = true\nmax_bytes = 1048576\n")
    with server(tmp_path, 1, "--config", str(config), "--no-history") as proc:
        cycles(proc.ports["workq"], rate=100, seconds=1)
        samples = scrape(proc)
    assert not (tmp_path / "data" / "history").exists()
    assert "queueserver_history_bytes" not in samples
    config.write_text("[history]\nenabled = false\n")
    with server(tmp_path, 1, "--config", str(config), "--history") as proc:
        cycles(proc.ports["workq"], rate=100, seconds=1)
        wait_for(lambda: segments(tmp_path / "data" / "history" / "shard-0"), 10, "a history file")


@pytest.mark.parametrize("args, message", [
    (["--history-max-bytes", "1000"], "--history-max-bytes must be at least 65536 bytes, got 1000"),
    (["--history-max-age", "-1"], "--history-max-age must be at least 0 seconds (0 keeps history of "
                                  "any age), got -1.0"),
    (["--config", "{toml}"], "history.max_byte; did you mean history.max_bytes?"),
])
def test_history_settings_are_checked_in_one_line(tmp_path, args, message):
    toml = tmp_path / "qs.toml"
    toml.write_text("[history]\nmax_byte = 5\n")
    args = [arg.replace("{toml}", str(toml)) for arg in args]
    err = one_line_error(run_cli("serve", "--data-dir", str(tmp_path / "data"), *args))
    assert message in err


def test_a_file_dropped_before_the_checkpoint_read_it_is_one_warning(spark, tmp_path):
    """``queueserver history`` reads the history once; then more traffic than
    the bound holds. Each file retention drops is one line: info for the files
    the checkpoint had read whole, a warning for the rest (the file being
    written when it ran, which grew since, and every later one)."""
    from queueserver.history.app import run
    bound, out = 256 << 10, tmp_path / "out"
    history = tmp_path / "data" / "history"
    with server(tmp_path, 1, "--history-max-bytes", str(bound), "--history-checkpoint", str(out)) as proc:
        cycles(proc.ports["workq"], rate=200, seconds=1.5)     # some 100 KB: nothing dropped yet
        wait_for(lambda: per_shard(scrape(proc), "queueserver_history_bytes").get("0")
                 == history_bytes(history / "shard-0"), 10, "the history on disk")
        assert per_shard(scrape(proc), "queueserver_history_segments_dropped_total") == {"0": 0}
        run([str(history)], str(out), spark=spark)
        checkpoint = json.loads((out / "_checkpoint.json").read_text())
        read = {path.rsplit("/", 1)[1]: mark[2] for path, mark in checkpoint["files"].items()}
        cycles(proc.ports["workq"], rate=200, seconds=6)       # some 400 KB more

        def warned() -> int:
            return sum(level == "WARNING" for lines in dropped_lines(proc.log()).values()
                       for level, _, _ in lines)

        wait_for(lambda: per_shard(scrape(proc), "queueserver_history_unread_segments_dropped_total")
                 == {"0": warned()}, 10, "the metric to count the warnings")
    dropped = dropped_lines(proc.log())
    assert set(read) <= set(dropped), "every file read was dropped since"
    warnings = 0
    for name, lines in dropped.items():
        assert len(lines) == 1, (name, lines)
        level, size, rest = lines[0]
        if read.get(name) == size:
            assert (level, rest) == ("INFO", f"; read by queueserver history ({out})"), lines
        else:
            warnings += 1
            assert level == "WARNING" and "before queueserver history read it" in rest, lines
            assert (f"has read {read[name]} of its {size} bytes" if name in read
                    else f"{out} has not read it") in rest, lines
    assert 0 < warnings < len(dropped)


def test_both_versions_decode_to_the_same_record():
    """Version-2 lines (arrays) are version-1 records (objects) without their keys."""
    v1 = {"v": 1, "time": 5, "shard": 0, "event": "completed", "protocol": "workq", "queue": "q",
          "id": "a", "number": 3, "attempt": 1, "priority": 0, "size": 9, "outcome": "completed",
          "conn": "0-1"}
    v2 = json.dumps([2, *[v1[f] for f in FIELDS[1:]]])
    assert decode(v2) == {**v1, "v": 2}
    assert decode(json.dumps(v1)) == v1
