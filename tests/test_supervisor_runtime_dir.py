"""The runtime directory through real processes: refused when unsafe,
locked while a server runs, left clean after a stop, and every start-up
failure one line on stderr."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from typing import Dict, Tuple

import pytest

from serverproc import ServerProcess, one_line_error, run_cli, wait_for
from wire import Wire, add, new_id

ONLY_WORKQ = ["--workq-port", "0", "--no-takeanumber", "--no-goqueue", "--no-queued", "--no-taskflux",
              "--shards", "1"]
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")


def serve(runtime_dir: str, *extra: str):
    return run_cli("serve", "--runtime-dir", runtime_dir, *ONLY_WORKQ, *extra)


def snapshot(path: str) -> Dict[str, Tuple[int, int, int, bytes]]:
    """Every entry of ``path`` (itself included): mode, owner, mtime and content."""
    entries = {}
    for name in ["."] + sorted(os.listdir(path)):
        full = os.path.join(path, name)
        info = os.lstat(full)
        content = b""
        if stat.S_ISREG(info.st_mode):
            with open(full, "rb") as f:
                content = f.read()
        entries[name] = (info.st_mode, info.st_uid, info.st_mtime_ns, content)
    return entries


@needs_root
def test_a_directory_of_another_user_is_refused_and_left_alone(tmp_path):
    rt = tmp_path / "theirs"
    rt.mkdir()
    (rt / "ports.json").write_text('{"workq": 1}')
    (rt / "router-0.ready").write_text("1")
    os.chmod(rt, 0o777)
    os.chown(rt, NOBODY, NOBODY)
    before = snapshot(str(rt))
    line = one_line_error(serve(str(rt)))
    assert f"refusing runtime directory {rt}: it is owned by uid {NOBODY}" in line
    assert "--runtime-dir" in line
    assert snapshot(str(rt)) == before   # not chmod-ed, nothing removed or added


def test_a_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "link"
    link.symlink_to(real)
    line = one_line_error(serve(str(link)))
    assert f"refusing runtime directory {link}: it is a symbolic link" in line
    assert os.listdir(real) == []
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o755


def test_our_own_loose_directory_is_tightened_and_cleaned_after_a_stop(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    os.chmod(rt, 0o755)
    (rt / "router-0.ready").write_text("stale")  # an earlier run's: gone before we start
    proc = ServerProcess(protocols=["workq"], runtime_dir=str(rt)).start()
    try:
        assert stat.S_IMODE(os.stat(rt).st_mode) == 0o700
        with open(rt / "lock") as f:
            assert f.read().strip() == str(proc.process.pid)
        assert {"ports.json", "router-0.ready", "shard-0.sock"} <= set(os.listdir(rt))
    finally:
        assert proc.stop() == 0
    assert os.listdir(rt) == ["lock"]  # no ports.json, readiness file or socket is left


def test_a_second_server_on_the_same_directory_exits_at_once_and_touches_nothing(tmp_path):
    rt = str(tmp_path / "rt")
    first = ServerProcess(protocols=["workq"], runtime_dir=rt).start()
    try:
        wait_for(lambda: os.path.exists(os.path.join(rt, "router-0.ready")), what="router readiness")
        before = snapshot(rt)
        line = one_line_error(serve(rt, "--shards", "2", "--workq-port", "0"), status=2)
        assert f"runtime directory {rt} is in use by another queueserver (pid {first.process.pid})" in line
        assert snapshot(rt) == before
        with open(os.path.join(rt, "ports.json")) as f:
            assert json.load(f) == first.ports
        w = Wire(first.connect())  # the first one still serves
        assert w.call(add(new_id(), "still")) == b"+OK\r\n"
        w.close()
    finally:
        assert first.stop() == 0
    # Once it stopped, the directory is free again.
    second = ServerProcess(protocols=["workq"], runtime_dir=rt).start()
    second.stop()


def test_a_port_in_use_is_one_line_naming_protocol_port_and_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rt = tmp_path / "rt"
        line = one_line_error(serve(str(rt), "--workq-port", str(port)))
    assert line.endswith(f"cannot listen for workq on 127.0.0.1:{port}: address already in use "
                         f"(another server running? pick another port with --workq-port)")
    assert not rt.exists()   # the ports are bound first: nothing was made
    ServerProcess(protocols=["workq"], runtime_dir=str(rt)).start().stop()


def test_a_runtime_directory_that_cannot_be_made_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_line_error(serve(str(blocker / "rt")))
    assert f"cannot create runtime directory {blocker / 'rt'}: not a directory" in line
    assert "--runtime-dir" in line
    assert "is not a directory" in one_line_error(serve(str(blocker)))


def test_a_runtime_directory_in_a_closed_parent_is_one_line(tmp_path):
    parent = tmp_path / "closed"
    parent.mkdir(mode=0o500)
    rt = parent / "rt"
    argv = ["serve", "--runtime-dir", str(rt), *ONLY_WORKQ]
    if os.geteuid() == 0:  # root writes anywhere: run it without the capability that allows that
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to drop CAP_DAC_OVERRIDE as root")
        result = run_cli(*argv, prefix=[setpriv, "--bounding-set", "-dac_override,-dac_read_search",
                                        "--inh-caps", "-dac_override,-dac_read_search", "--"])
    else:
        result = run_cli(*argv)
    line = one_line_error(result)
    assert f"cannot create runtime directory {rt}: permission denied" in line
    assert os.listdir(parent) == []


def test_a_runtime_directory_that_is_not_writable_is_one_line(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(rt)], capture_output=True).returncode != 0:
        pytest.skip("needs chattr +i (root on a filesystem with the immutable flag)")
    try:
        line = one_line_error(serve(str(rt)))
        assert f"runtime directory {rt} is not writable: cannot open {rt / 'lock'}" in line
        assert "--runtime-dir" in line
        assert os.listdir(rt) == []
    finally:
        subprocess.run([chattr, "-i", str(rt)], check=True)


def test_every_port_in_use_is_named_in_one_line(tmp_path):
    with socket.socket() as a, socket.socket() as b:
        for taken in (a, b):
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        workq, goqueue = a.getsockname()[1], b.getsockname()[1]
        line = one_line_error(run_cli("serve", "--runtime-dir", str(tmp_path / "rt"), "--shards", "1",
                                      "--workq-port", str(workq), "--goqueue-port", str(goqueue),
                                      "--takeanumber-port", "0", "--no-queued", "--no-taskflux"))
    assert line.endswith(f"cannot listen for workq on 127.0.0.1:{workq}, goqueue on 127.0.0.1:{goqueue}: "
                         f"address already in use (another server running? pick other ports with "
                         f"--workq-port, --goqueue-port)")


def test_a_server_without_a_data_directory_says_jobs_live_in_memory_only(tmp_path):
    with ServerProcess(protocols=["workq"]) as proc:
        assert "jobs are kept in memory only" in proc.log()
    with ServerProcess(protocols=["workq"], extra=["--data-dir", str(tmp_path / "d")]) as proc:
        assert "in memory only" not in proc.log()
