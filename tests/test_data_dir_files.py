"""A data directory whose shard files this server's user cannot use: one
line and exit status 2 before any shard starts (not a shard that fails,
traceback and all, and is restarted again and again), and a shard that still
meets such a file at start refuses with one line (the supervisor does not
restart it). Real processes throughout.

Tests run as root here, and root reads and writes anything, so "another
user's files" is made real: the files are given to ``nobody`` and the server
runs as root without the capabilities that override file permissions
(``setpriv``), so it fails exactly as a service user meeting root's files
does. Run as another user, the tests take the permissions away instead.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from typing import List

import pytest

from serverproc import ServerProcess, one_line_error, run_cli

ONLY_WORKQ = ["--workq-port", "0", "--no-takeanumber", "--no-goqueue", "--no-queued", "--no-taskflux"]
NOBODY = 65534
ROOT = os.geteuid() == 0


def without_override() -> List[str]:
    """The command prefix that runs a process as this user but, for root,
    without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (for it and its children)."""
    if not ROOT:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "these tests need setpriv (util-linux) to run root without its file override"
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search",
            "--inh-caps", "-dac_override,-dac_read_search", "--"]


def give_away(path) -> None:
    """Make ``path`` (and what is under it) unusable to the server as another
    user's files are: owned by nobody (as root), or without permissions."""
    paths = [str(path)]
    if os.path.isdir(path):
        for top, dirs, files in os.walk(path):
            paths += [os.path.join(top, name) for name in dirs + files]
    for p in paths:
        if ROOT:
            os.chown(p, NOBODY, NOBODY)
            os.chmod(p, 0o700 if os.path.isdir(p) else 0o600)
        else:
            os.chmod(p, 0)


def take_back(path) -> None:
    """Undo :func:`give_away` (so pytest can remove the directory)."""
    os.chmod(path, 0o700)
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chmod(os.path.join(top, name), 0o700)
    if ROOT:
        for top, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(top, name), 0, 0)
        os.chown(path, 0, 0)


def owner_hint() -> str:
    return f"it belongs to {pwd.getpwuid(NOBODY).pw_name}" if ROOT else "check its permissions"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A data directory a 2-shard server has used: shard logs and history directories."""
    data = tmp_path_factory.mktemp("written") / "data"
    with ServerProcess(shards=2, protocols=["workq"], extra=["--data-dir", str(data)]):
        pass
    assert sorted(os.listdir(data / "shard-1")) == ["00000001.log"]
    return data


@pytest.fixture
def data(written, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(written, copy)
    yield copy
    take_back(copy)


def serve(data, runtime_dir) -> subprocess.CompletedProcess:
    return run_cli("serve", "--data-dir", str(data), "--runtime-dir", str(runtime_dir), *ONLY_WORKQ,
                   prefix=without_override())


def test_a_shard_directory_of_another_user_is_one_line_before_any_shard_starts(data, tmp_path):
    give_away(data / "shard-1")
    line = one_line_error(serve(data, tmp_path / "rt"))
    assert line.startswith(f"queueserver serve: error: data directory {data}: cannot use "
                           f"{data / 'shard-1'}: permission denied; {owner_hint()}"), line
    # No shard started: shard-0 begins a new segment at every start.
    assert sorted(os.listdir(data / "shard-0")) == ["00000001.log"]


def test_a_segment_of_another_user_is_named(data, tmp_path):
    give_away(data / "shard-0" / "00000001.log")
    line = one_line_error(serve(data, tmp_path / "rt"))
    assert f"cannot use {data / 'shard-0' / '00000001.log'}: permission denied; {owner_hint()}" in line
    if ROOT:
        assert f"chown -R root {data}" in line
    assert sorted(os.listdir(data / "shard-0")) == ["00000001.log"]


def test_a_history_directory_of_another_user_is_one_line(data, tmp_path):
    give_away(data / "history" / "shard-0")
    line = one_line_error(serve(data, tmp_path / "rt"))
    assert f"cannot use {data / 'history' / 'shard-0'}: permission denied; {owner_hint()}" in line


def test_the_same_data_directory_serves_once_it_is_the_servers_again(data, tmp_path):
    give_away(data / "shard-1")
    one_line_error(serve(data, tmp_path / "rt"))
    take_back(data)
    with ServerProcess(shards=2, protocols=["workq"], extra=["--data-dir", str(data)]) as proc:
        assert proc.ports["workq"]
    assert sorted(os.listdir(data / "shard-1")) == ["00000001.log", "00000002.log"]


def test_a_shard_that_meets_another_users_log_refuses_with_one_line(data, tmp_path):
    """The shard's own guard (files can change after the supervisor looked):
    exit status 3, which the supervisor does not restart, one line, and the
    reason left beside its socket for the supervisor's own line."""
    give_away(data / "shard-0" / "00000001.log")
    rt = tmp_path / "rt"
    rt.mkdir()
    socket_path = rt / "shard-0.sock"
    from queueserver.lifecycle import EXIT_REFUSED
    result = subprocess.run([*without_override(), sys.executable, "-m", "queueserver.shard",
                             "--index", "0", "--shards", "2", "--socket", str(socket_path),
                             "--data-dir", str(data / "shard-0")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        f"ERROR shard 0 cannot start: [Errno 13] Permission denied: "
        f"'{data / 'shard-0' / '00000001.log'}'"), result.stderr
    assert (rt / "shard-0.sock.refused").read_text().startswith("[Errno 13] Permission denied")


def test_a_data_directory_that_is_a_file_says_not_a_directory(tmp_path):
    path = tmp_path / "data"
    path.write_text("")
    line = one_line_error(run_cli("serve", "--data-dir", str(path), "--runtime-dir",
                                  str(tmp_path / "rt"), *ONLY_WORKQ))
    assert line == (f"queueserver serve: error: data directory {path} is not a directory "
                    f"(pick another with --data-dir)")
    assert path.read_text() == ""


def test_a_shard_directory_that_is_a_file_is_one_line(data, tmp_path):
    shutil.rmtree(data / "shard-1")
    (data / "shard-1").write_text("")
    line = one_line_error(serve(data, tmp_path / "rt"))
    assert line == (f"queueserver serve: error: data directory {data}: {data / 'shard-1'} is not "
                    f"a directory; move it away")


def test_a_segment_nobody_may_write_is_named_even_for_root(data, tmp_path):
    """Tried, not guessed from mode bits: an immutable segment (which not even
    root may change or remove, as compaction must) stops the start too."""
    segment = data / "shard-0" / "00000001.log"
    if ROOT:
        subprocess.run(["chattr", "+i", str(segment)], check=True)
        reason = "operation not permitted"
    else:
        segment.chmod(0o400)
        reason = "permission denied"
    try:
        line = one_line_error(run_cli("serve", "--data-dir", str(data), "--runtime-dir",
                                      str(tmp_path / "rt"), *ONLY_WORKQ))
    finally:
        if ROOT:
            subprocess.run(["chattr", "-i", str(segment)], check=True)
    assert line.endswith(f"cannot use {segment}: {reason}; check its permissions and attributes "
                         f"(ls -l, lsattr)"), line
    assert sorted(os.listdir(data / "shard-0")) == ["00000001.log"]
