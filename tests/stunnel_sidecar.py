"""stunnel in client mode, as docs/security.md tells an operator to run it
beside a plain-TCP client: the service section is read from that page (so
the page's configuration is the one the tests prove), with this test's
addresses and files put in its place. The binary is Debian's stunnel4,
unpacked by loadtests/install-peers.sh; it runs in the foreground, its log
kept, and is always stopped by the test that started it."""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional

from peer_binaries import peer_binary, peer_env, peers

SECURITY_PAGE = Path(__file__).resolve().parent.parent / "docs" / "security.md"
SECTION = "### An original plain-TCP client through stunnel"
#: What the page's service section must set, each replaced by the test's own value.
SETTINGS = ("accept", "connect", "CAfile", "checkHost", "cert", "key")
#: The process's own settings, which a service manager gives in production.
GLOBALS = "foreground = yes\npid =\ndebug = info\n"


def documented_config() -> str:
    """The stunnel configuration of docs/security.md's stunnel section."""
    page = SECURITY_PAGE.read_text()
    start = page.index(SECTION)
    block = re.search(r"```ini\n(.*?)```", page[start:], re.S)
    assert block is not None, f"no ini block under {SECTION!r} in {SECURITY_PAGE}"
    return block.group(1)


def with_values(config: str, values: Dict[str, str]) -> str:
    """``config`` with each ``key = value`` of ``values`` put in; every key must be there."""
    for key, value in values.items():
        config, found = re.subn(rf"^{key}\s*=.*$", f"{key} = {value}", config, flags=re.M)
        assert found == 1, f"the documented stunnel configuration sets {key} {found} times, not once"
    return config


def _listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (read from the kernel, not by
    connecting: a connection to stunnel would open one to the server)."""
    wanted = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as table:
        return any(fields[1] == wanted and fields[3] == "0A"
                   for fields in (line.split() for line in list(table)[1:]))


class StunnelClient:
    """One stunnel that accepts plain TCP on :attr:`port` and speaks TLS,
    with ``cert``/``key``, to ``server_port`` on loopback, checking the
    server's certificate against ``ca`` and the name ``server_name``."""

    def __init__(self, directory: Path, server_port: int, ca: Path, server_name: str,
                 cert: Path, key: Path) -> None:
        self.directory = directory
        self.port = peers.free_port()
        self.config_path = directory / "stunnel.conf"
        self.log_path = directory / "stunnel.log"
        self.config_path.write_text(GLOBALS + with_values(documented_config(), {
            "accept": f"127.0.0.1:{self.port}", "connect": f"127.0.0.1:{server_port}", "CAfile": str(ca),
            "checkHost": server_name, "cert": str(cert), "key": str(key)}))
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self, timeout: float = 30.0) -> "StunnelClient":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([peer_binary("stunnel4", "stunnel4"), str(self.config_path)],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=peer_env(), preexec_fn=peers.die_with_parent(signal.SIGKILL))
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"stunnel exited with status {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"stunnel did not listen on 127.0.0.1:{self.port} in {timeout} s:\n{self.log()}")
            time.sleep(0.02)
        return self

    def connect(self, timeout: float = 10.0) -> socket.socket:
        """A plain TCP connection to the sidecar, as the original client makes."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def __enter__(self) -> "StunnelClient":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
