"""Real servers for integration tests, and the helpers that drive them.

:class:`ServerProcess` is :mod:`queueserver.testing.serverprocess`'s (free
ports, a private runtime directory, always stopped by the test that started
it) with the suite's direct-path switch.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from queueserver.testing import serverprocess

#: The suite runs twice: with the direct path (the default) and, with
#: QS_DIRECT_PATH=0, with every request forwarded through the router.
DIRECT_PATH = os.environ.get("QS_DIRECT_PATH", "1") != "0"


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def http_get(proc: "ServerProcess", path: str, timeout: float = 15.0) -> bytes:
    """``GET path`` from the server's metrics port (``/metrics``, ``/status``),
    on the address its listeners use."""
    import urllib.request
    with urllib.request.urlopen(f"http://{proc.host}:{proc.ports['metrics']}{path}",
                                timeout=timeout) as answer:
        return answer.read()


#: an HTTP answer: status, headers (names in lower case), body
Answer = Tuple[int, Dict[str, str], bytes]


class HttpNode:
    """A server's metrics and console port, asked over plain HTTP."""

    def __init__(self, proc: "ServerProcess", timeout: float = 30.0) -> None:
        self.proc = proc
        self.host = proc.host
        self.port = proc.ports["metrics"]
        self.origin = f"http://{self.host}:{self.port}"
        self.timeout = timeout

    def request(self, method: str, path: str, body: Optional[bytes] = None,
                headers: Optional[Dict[str, str]] = None) -> Answer:
        import http.client
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        finally:
            conn.close()


def poll(condition: Callable[[], object], timeout: float) -> bool:
    """Ask ``condition`` every 20 ms until it is true (True) or ``timeout``
    seconds have passed (False): for a wait whose thing may rightly not happen."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_for(condition: Callable[[], object], timeout: float = 10.0,
             what: Union[str, Callable[[], str]] = "condition") -> None:
    """Poll ``condition`` until it is true; fail the test after ``timeout`` seconds.
    ``what`` names the wait in the failure; a callable is asked only then
    (e.g. to add a server's log)."""
    if not poll(condition, timeout):
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for "
                             f"{what() if callable(what) else what}")


def replies_across_shard_restart(proc: "ServerProcess", shard: int, ask: Callable[[], bytes],
                                 normal: Callable[[bytes], bool], timeout: float = 20.0) -> List[bytes]:
    """SIGKILL ``shard-<shard>`` of ``proc``, then ``ask`` again and again
    until a reply is ``normal`` and the supervisor has started the shard
    anew: every reply, in order."""
    name = f"shard-{shard}"
    pid = proc.child_pids()[name]
    os.kill(pid, signal.SIGKILL)
    replies: List[bytes] = []

    def served_again() -> bool:
        replies.append(ask())
        return normal(replies[-1]) and proc.child_pids()[name] != pid

    wait_for(served_again, timeout, lambda: f"{name} to serve again:\n{proc.log()}")
    return replies


class ServerProcess(serverprocess.ServerProcess):
    """The suite's server: with QS_DIRECT_PATH=0, every request goes through
    the router unless the test chose a ``--[no-]direct-path`` itself."""

    def argv(self) -> List[str]:
        argv = super().argv()
        if not DIRECT_PATH and not any("direct-path" in arg for arg in self.extra):
            argv.append("--no-direct-path")
        return argv


def run_cli(*args: str, timeout: float = 30, prefix: Sequence[str] = (),
            **kwargs: Any) -> subprocess.CompletedProcess:
    """``queueserver ARGS...`` as a real process (after ``prefix``, e.g. a
    privilege wrapper), its output captured as text. A ``serve`` that names
    no metrics port takes a free one (two suites at once never collide on
    the default)."""
    if args and args[0] == "serve" and not any("metrics" in arg for arg in args):
        args = (*args, "--metrics-port", "0")
    return subprocess.run([*prefix, sys.executable, "-m", "queueserver", *args], capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def one_line_error(result: subprocess.CompletedProcess, status: int = 2) -> str:
    """The single stderr line of a command that must fail with ``status`` and no traceback."""
    err = result.stderr.strip()
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in err and "\n" not in err, err
    assert err, "no message on stderr"
    return err
