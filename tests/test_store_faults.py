"""Real faults: a full filesystem (ENOSPC), a file-size limit (EFBIG), and kill -9."""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import gevent
import pytest

from queueserver.store import AppendLog, WriteFailed, recover


def wait_for(condition):
    while not condition():
        gevent.sleep(0.002)


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs: a filesystem that really fills up (needs root, as in CI)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); "
                    "test_file_size_limit covers write failures without root")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(directory):
    """Take every free byte of the filesystem; the filler's path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC
    return path


def test_disk_full_fails_every_waiter_then_recovers_when_space_returns(small_fs):
    rec = recover(small_fs, 0, 1)
    list(rec)
    wal = AppendLog(rec, retry_ms=20).start()
    before = [("add", i, b"a" * 100) for i in range(5)]
    for record in before:
        wal.append(record)
    wal.sync()
    segment = os.path.join(small_fs, "00000001.log")
    good = os.path.getsize(segment)
    filler = fill(small_fs)

    answers = {}

    def client(i):
        wal.append(("add", 100 + i, b"b" * 6000))
        try:
            wal.sync()
            answers[i] = None
        except WriteFailed as err:
            answers[i] = err

    gevent.joinall([gevent.spawn(client, i) for i in range(5)])
    assert sorted(answers) == list(range(5))
    for err in answers.values():
        assert isinstance(err, WriteFailed) and err.errno == errno.ENOSPC
        assert str(err).startswith(f"{segment}: cannot write the log: No space left on device")
    assert wal.stats()["write_errors"] >= 1
    assert os.path.getsize(segment) == good      # no half-written record left behind

    late = []                                     # while failing, a commit is answered at once
    wal.append(("add", 200, b"c"))
    wal.commit(late.append)
    assert len(late) == 1 and isinstance(late[0], WriteFailed)

    os.remove(filler)                             # space returns
    wait_for(lambda: wal.error is None)
    wal.append(("add", 300, b"d"))
    wal.sync()
    wal.close()
    expected = before + [("add", 100 + i, b"b" * 6000) for i in range(5)] + [
        ("add", 200, b"c"), ("add", 300, b"d")]
    assert list(recover(small_fs, 0, 1)) == expected


FSIZE_CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys
    import gevent
    from queueserver.store import AppendLog, WriteFailed, recover

    directory, policy = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # EFBIG instead of a signal
    rec = recover(directory, 0, 1)
    list(rec)
    wal = AppendLog(rec, policy=policy, retry_ms=10).start()
    segment = os.path.join(directory, "00000001.log")
    limit = os.path.getsize(segment) + 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    answers = []
    for i in range(30):
        wal.append(("add", i, b"p" * 80))
        try:
            wal.sync()
            answers.append("ok")
        except WriteFailed as err:
            answers.append(err.errno)
    size_while_failing = os.path.getsize(segment)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))   # room again
    while wal.error is not None:
        gevent.sleep(0.002)
    wal.sync()
    wal.close()
    print(json.dumps({"answers": answers, "limit": limit, "size": size_while_failing,
                      "errors": wal.stats()["write_errors"]}))
""")


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_file_size_limit(tmp_path, policy):
    """RLIMIT_FSIZE makes a write cross the limit (a short write), then fail with EFBIG."""
    directory = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", FSIZE_CHILD, directory, policy],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    answers = report["answers"]
    ok = answers.index(errno.EFBIG)
    assert ok >= 1 and answers[:ok] == ["ok"] * ok
    assert answers[ok:] == [errno.EFBIG] * (30 - ok)
    # Cut back to the last whole record, below the limit.
    frame = len(__import__("queueserver.store.format", fromlist=["x"]).encode_record(("add", 0, b"p" * 80)))
    assert report["size"] <= report["limit"]
    assert report["size"] == 40 + ok * frame
    assert list(recover(directory, 0, 1)) == [("add", i, b"p" * 80) for i in range(30)]


KILL_CHILD = textwrap.dedent("""
    import os, sys
    import gevent
    from queueserver.store import AppendLog, recover

    directory, policy = sys.argv[1], sys.argv[2]
    rec = recover(directory, 0, 1)
    list(rec)
    wal = AppendLog(rec, policy=policy, interval_ms=50, segment_bytes=64 * 1024).start()

    def worker(w):
        i = 0
        while True:
            wal.append(("add", f"{w}-{i}", os.urandom(64)))
            wal.sync()
            os.write(1, f"{w} {i}\\n".encode())     # acknowledged
            i += 1

    gevent.joinall([gevent.spawn(worker, w) for w in range(8)])
""")


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_sigkill_loses_no_acknowledged_record(tmp_path, policy):
    directory = str(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", KILL_CHILD, directory, policy],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acked = []
    try:
        while len(acked) < 2000:
            line = child.stdout.readline()
            assert line, child.stderr.read().decode()
            acked.append(line)
    finally:
        child.send_signal(signal.SIGKILL)
        # the rest through the same buffered reader: communicate() would read
        # the descriptor past what readline() holds buffered, and tear a line
        rest = child.stdout.read()
        child.stderr.read()
        child.wait()
    acked += rest.splitlines(keepends=True)
    acked = [line.decode().split() for line in acked]
    recovered = [record[1] for record in recover(directory, 0, 1)]
    assert len(set(recovered)) == len(recovered)
    assert set(f"{w}-{i}" for w, i in acked) <= set(recovered)
    for w in range(8):     # each worker's records, in order, without gaps
        mine = [int(r.split("-")[1]) for r in recovered if r.startswith(f"{w}-")]
        assert mine == list(range(len(mine)))
