"""The workq sessions of docs/protocols.md are what a real server answers.

Every session of its "workq commands" section is replayed, in the page's
order, against one fresh server, and the "By hand" session against
another: each line a session sends goes out with its CRLF, each line it
shows coming back must come back, byte for byte (a ``created`` or
``started`` time: any time in that form). A session of two connections
names them (``client>``/``worker<``...); the lines are played in the
page's order, so a ``run`` that waits for a worker's ``complete`` is read
after it. The session of docs/getting-started.md is replayed the same way. The
Python pipeline example runs as a script against a fresh server and must
print what its comments say.
"""
from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from queueserver.protocols import DEFAULT_PORTS

from serverproc import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "protocols.md"
TIME = re.compile(r"^(created|started) \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
NAMED = re.compile(r"^(\w+)([<>]) ?(.*)$")


def section(title: str, page: Path = PAGE) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n{title}\n")
    end = text.find("\n## ", start + 1)
    following = text.find("\n### ", start + 1)
    ends = [e for e in (end, following) if e > 0]
    return text[start:min(ends) if ends else len(text)]


def sessions(text: str) -> List[List[Tuple[str, str, str]]]:
    """Each fenced block that is a workq session, as (connection, ">" sent or "<" received, line)."""
    found = []
    for block in re.findall(r"^```\n(.*?)^```$", text, re.S | re.M):
        lines = block.rstrip("\n").split("\n")
        if not any(line.startswith(">") or NAMED.match(line) for line in lines):
            continue
        steps = []
        for line in lines:
            named = NAMED.match(line)
            if named and named.group(1) in ("client", "worker"):
                steps.append((named.group(1), named.group(2), named.group(3)))
            elif line.startswith("> "):
                steps.append(("", ">", line[2:]))
            else:
                steps.append(("", "<", line))
        found.append(steps)
    return found


class Connection:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def line(self) -> str:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line.decode()


def replay(port: int, steps: List[Tuple[str, str, str]]) -> None:
    connections: Dict[str, Connection] = {}
    try:
        for name, way, text in steps:
            conn = connections.get(name) or connections.setdefault(name, Connection(port))
            if way == ">":
                conn.sock.sendall(text.encode() + b"\r\n")
                continue
            got = conn.line()
            if TIME.match(text):
                assert TIME.match(got) and got.split()[0] == text.split()[0], (text, got)
            else:
                assert got == text, f"the page shows {text!r}, the server answered {got!r}"
        for conn in connections.values():     # nothing more than the page shows
            conn.sock.settimeout(0.2)
            try:
                extra = conn.buf + conn.sock.recv(65536)
            except socket.timeout:
                extra = conn.buf
            assert extra == b"", f"the server answered more than the page shows: {extra!r}"
    finally:
        for conn in connections.values():
            conn.sock.close()


def test_the_workq_command_sessions_are_the_servers_answers():
    found = sessions(section("### workq commands"))
    assert len(found) >= 6, "the section's sessions were not found"
    sent = " ".join(text for steps in found for _, way, text in steps if way == ">")
    for command in ("add", "schedule", "run", "result", "lease", "complete", "fail", "delete",
                    "inspect"):
        assert re.search(rf"(^| ){command} ", sent), f"no session sends {command}"
    with ServerProcess(protocols=["workq"], extra=["--in-memory"]) as proc:
        for steps in found:
            replay(proc.port("workq"), steps)


def test_the_by_hand_session_is_the_servers_answer():
    [steps] = sessions(section("### By hand"))
    with ServerProcess(protocols=["workq"], extra=["--in-memory"]) as proc:
        replay(proc.port("workq"), steps)


def test_the_getting_started_session_is_the_servers_answer():
    [steps] = sessions(section("## A job by hand", ROOT / "docs" / "getting-started.md"))
    with ServerProcess(protocols=["workq"], extra=["--in-memory"]) as proc:
        replay(proc.port("workq"), steps)


def test_a_session_that_differs_from_the_server_fails():
    """The check can fail: a line the server does not send."""
    steps = sessions(section("### By hand"))[0]
    wrong = [(n, w, "+OK 3" if t == "+OK 2" else t) for n, w, t in steps]
    assert wrong != steps
    with ServerProcess(protocols=["workq"], extra=["--in-memory"]) as proc:
        with pytest.raises(AssertionError, match="the page shows '\\+OK 3'"):
            replay(proc.port("workq"), wrong)


def test_the_pipeline_example_prints_what_its_comments_say(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    [code] = [block for block in re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
              if "pipeline()" in block]
    expected = re.findall(r"print\(.*\)\s+# (.*)$", code, re.M)
    assert len(expected) == 2, code
    default = str(DEFAULT_PORTS["workq"])
    with ServerProcess(protocols=["workq"], extra=["--in-memory"]) as proc:
        script = tmp_path / "pipeline.py"
        script.write_text(code.replace(default, str(proc.port("workq"))))
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                                timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected
