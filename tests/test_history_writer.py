"""The shards' job history, written through real servers: one JSON line per
transition, with the protocol and connection of the client behind it, on
the direct path and forwarded alike; off with ``[history] enabled = false``."""
from __future__ import annotations

import pytest

from queueserver.client import Client
from queueserver.shard.history import decode

from serverproc import ServerProcess, wait_for
from wire import line_exchange

ID = "00000000-0000-4000-8000-%012d"


def history(data) -> list:
    records = []
    for path in sorted((data / "history").rglob("*.jsonl")):
        records += [decode(line) for line in path.read_text().splitlines()]
    return records


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "forwarded"])
def test_every_transition_is_a_line_naming_its_client(tmp_path, direct):
    data = tmp_path / "data"
    extra = ["--data-dir", str(data)] + ([] if direct else ["--no-direct-path"])
    with ServerProcess(shards=2, protocols=["workq", "takeanumber"], extra=extra) as proc:
        with Client(port=proc.ports["workq"]) as client:
            client.add(ID % 1, "hq", b"12345", 60_000, 86_400_000)
            job = client.lease(["hq"], 1000)
            client.fail(job.id, b"boom")                  # final: max-fails 0
            client.add(ID % 2, "hq", b"x", 60_000, 86_400_000)
            client.delete(ID % 2)
        added, reserved = line_exchange(proc.ports["takeanumber"], b"ADD tq 0 hello\r\n",
                                      b"RESERVE tq\r\n")
        tid = added[1:].strip().decode()
        assert reserved.startswith(b"+" + tid.encode())
        line_exchange(proc.ports["takeanumber"], f"DONE tq {tid}\r\n".encode())
        wait_for(lambda: len(history(data)) >= 7, 10, lambda: f"the history: {history(data)}")
    records = history(data)
    assert all(r["v"] == 2 for r in records)
    one = [(r["event"], r["protocol"], r["attempt"], r["outcome"], r["size"])
           for r in records if r["id"] == ID % 1]
    assert one == [("added", "workq", 0, None, 5), ("leased", "workq", 1, None, 5),
                   ("failed", "workq", 1, "failed", 5)]
    assert [r["event"] for r in records if r["id"] == ID % 2] == ["added", "deleted"]
    tan = [(r["event"], r["protocol"], r["outcome"]) for r in records if r["id"] == tid]
    assert tan == [("added", "takeanumber", None), ("leased", "takeanumber", None),
                   ("completed", "takeanumber", "completed")]
    leased = [r for r in records if r["event"] == "leased"]
    assert all(r["conn"] and r["conn"].count("-") == 1 for r in leased)
    assert len({r["conn"] for r in leased}) == 2         # two clients, two connections


def test_history_off_writes_nothing(tmp_path):
    config = tmp_path / "qs.toml"
    config.write_text("[history]\nenabled = false\n")
    data = tmp_path / "data"
    with ServerProcess(shards=1, protocols=["workq"],
                       extra=["--config", str(config), "--data-dir", str(data)]) as proc:
        with Client(port=proc.ports["workq"]) as client:
            client.add(ID % 1, "q", b"p", 60_000, 86_400_000)
    assert not (data / "history").exists()
