"""End to end: a durable server keeps the history of a known workload over
workq and takeanumber (completed, failed, expired by TTL, requeued by TTR,
unfinished), and ``queueserver history`` on a real SparkSession counts it
exactly."""
from __future__ import annotations

from queueserver.client import Client, NotFound
from queueserver.history.app import run

from serverproc import ServerProcess, wait_for
from wire import line_exchange

ID = "00000000-0000-4000-8000-%012d"
DAY = 86_400_000


def drive_workload(proc: ServerProcess) -> None:
    with Client(port=proc.ports["workq"]) as client:
        for i in range(1, 7):
            client.add(ID % i, "e2e-a", b"p" * i, 60_000, DAY)
        for i in range(1, 5):
            client.complete(client.lease(["e2e-a"], 1000).id, b"ok")
        for i in range(5, 7):
            client.fail(client.lease(["e2e-a"], 1000).id, b"no")     # max-fails 0: final
        client.add(ID % 7, "e2e-a", b"slow", 300, DAY)              # a 300 ms lease
        assert client.lease(["e2e-a"], 1000).id == ID % 7
        wait_for(lambda: client.inspect_job(ID % 7).state != 4, 10, "the lease to run out")
        assert client.lease(["e2e-a"], 1000).id == ID % 7
        client.complete(ID % 7, b"second time")
        client.add(ID % 8, "e2e-x", b"mortal", 60_000, 300)          # lives 300 ms

        def expired() -> bool:
            try:
                client.inspect_job(ID % 8)
                return False
            except NotFound:
                return True

        wait_for(expired, 10, "the TTL to end")
        client.add(ID % 9, "e2e-a", b"left", 60_000, DAY)
        client.add(ID % 10, "e2e-a", b"left", 60_000, DAY)
    port = proc.ports["takeanumber"]
    ids = [line_exchange(port, f"ADD e2e-t 0 t{i}\r\n".encode())[0][1:].strip().decode() for i in range(3)]
    for id in ids[:2]:
        reserved, done = line_exchange(port, b"RESERVE e2e-t\r\n", f"DONE e2e-t {id}\r\n".encode())
        assert reserved.startswith(f"+{id}".encode()) and done == b"+OK\r\n"


def test_the_history_of_a_known_workload_is_counted_exactly(spark, tmp_path):
    data = tmp_path / "data"
    with ServerProcess(shards=2, protocols=["workq", "takeanumber"],
                       extra=["--data-dir", str(data)]) as proc:
        drive_workload(proc)
    # Stopped: every shard wrote its last lines.
    out = tmp_path / "out"
    summary = run([str(data / "history")], str(out), spark=spark, stale_after=3600)
    assert summary.jobs == 13
    assert summary.outcomes["completed"] == 7
    assert summary.outcomes["failed"] == 2
    assert summary.outcomes["expired"] == 1
    assert summary.outcomes["unfinished"] == 3
    assert summary.malformed == 0 and not summary.unknown_versions
    jobs = {r["id"]: r.asDict() for r in spark.read.parquet(str(out / "jobs")).collect()}
    slow = jobs[ID % 7]
    assert slow["requeues"] == 1 and slow["attempts"] == 2 and slow["outcome"] == "completed"
    assert slow["protocol"] == "workq" and slow["queue"] == "e2e-a"
    taken = [r for r in jobs.values() if r["queue"] == "e2e-t"]
    assert sorted(r["protocol"] for r in taken) == ["takeanumber"] * 3
    assert sorted(str(r["outcome"]) for r in taken) == ["None", "completed", "completed"]
    assert jobs[ID % 8]["outcome"] == "expired"
    assert (out / "report.html").read_text().count("e2e-") >= 3
