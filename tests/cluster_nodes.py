"""Clusters of real nodes on this machine, for the tests: each node is a
whole server (supervisor, router, shards) on its own loopback address
(127.0.0.1, .2, .3), with its own data and runtime directories; the cluster
file gets link ports the kernel found free on each address."""
from __future__ import annotations

import json
import random
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from serverproc import ServerProcess, http_get, run_cli, wait_for

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


def free_ports(host: str, count: int) -> int:
    """The first of ``count`` consecutive ports free on ``host`` (checked by
    binding them), below the kernel's ephemeral range (32768 and up by
    default): a port the kernel hands to a listener on port 0 (a node's
    client ports) or to an outgoing connection is never one of these."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32700 - count)
        held = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                held.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def write_secret(path: Path, secret: Optional[bytes] = None) -> Path:
    path.write_bytes(secret or secrets.token_hex(32).encode())
    path.chmod(0o600)
    return path


class Nodes:
    """Nodes ``a``, ``b``, ``c``... of one cluster file; a context manager
    that stops every node it started."""

    def __init__(self, root: Path, shards: Sequence[int] = (2, 1, 1),
                 protocols: Optional[Iterable[str]] = None, joiners: Sequence[str] = (),
                 tls: Optional[Dict[str, str]] = None, extra: Sequence[str] = (),
                 later: Sequence[str] = ()) -> None:
        """``joiners``: nodes with ``join = true``; ``later``: nodes left out
        of the file until :meth:`add_to_file` (as an operator adds a node).
        Each node gets 8 free link ports beyond its shards': where it serves
        the copies it took over in a replicated cluster."""
        self.root = root
        self.names = [chr(ord("a") + i) for i in range(len(shards))]
        self.secret = write_secret(root / "cluster.secret")
        self.file = root / "cluster.toml"
        self.protocols = list(protocols) if protocols is not None else None
        self.extra = list(extra)
        self.procs: Dict[str, ServerProcess] = {}
        #: node -> what runs in its server's process before it starts (e.g. setting a fault's variable)
        self.preexec: Dict[str, Callable[[], None]] = {}
        #: node -> arguments of its own, after ``extra`` (its certificate, say)
        self.node_extra: Dict[str, List[str]] = {}
        self.host = {name: HOSTS[i] for i, name in enumerate(self.names)}
        lines = ['secret_file = "cluster.secret"']
        if tls:
            lines += ["[tls]", *(f'{key} = "{value}"' for key, value in tls.items())]
        self._entries: Dict[str, List[str]] = {}
        for i, name in enumerate(self.names):
            self._entries[name] = ["[[node]]", f'name = "{name}"', f'host = "{HOSTS[i]}"',
                                   f"link_port = {free_ports(HOSTS[i], shards[i] + 8)}", f"shards = {shards[i]}"]
            if name in joiners:
                self._entries[name].append("join = true")
            if name not in later:
                lines += self._entries[name]
        self.file.write_text("\n".join(lines) + "\n")
        self.shards = dict(zip(self.names, shards))

    def add_to_file(self, name: str) -> None:
        """Append node ``name``'s entry to the cluster file."""
        with open(self.file, "a") as f:
            f.write("\n".join(self._entries[name]) + "\n")

    def start(self, *names: str, linked: bool = True) -> "Nodes":
        """Start the nodes ``names`` (default all); with ``linked``, return
        once every running router reaches every running shard it knows of."""
        for name in names or self.names:
            proc = self.procs.get(name)
            if proc is None:
                proc = self.procs[name] = ServerProcess(
                    shards=self.shards[name], protocols=self.protocols, host=self.listening(name),
                    preexec=self.preexec.get(name),
                    extra=["--cluster", str(self.file), "--node", name,
                           "--data-dir", str(self.root / f"data-{name}"), *self.extra,
                           *self.node_extra.get(name, [])])
            proc.start()
        if linked:
            self.wait_linked()
        return self

    def wait_linked(self, timeout: float = 30.0) -> None:
        """Until every running node's routers are linked to every running
        node's shards (a node serves its own at once; others' links come up
        as those nodes start), as each node's /status tells."""
        running = [name for name, proc in self.procs.items() if proc.process is not None]
        want = sum(self.shards[name] for name in running)

        def linked(name: str) -> bool:
            routers = self.node_status(name)["routers"]
            # a router knows of the shards in its copy of the file (a node added
            # since is learnt from the first move to it)
            return all(r.get("shard_links_up", 0) >= min(want, r.get("shard_links", 0)) for r in routers)

        for name in running:
            wait_for(lambda: linked(name), timeout, f"node {name}'s routers to link to {want} shards")

    def node_status(self, name: str) -> Dict:
        """Node ``name``'s ``/status`` (over plain HTTP: a test of HTTPS ports says how it asks)."""
        return json.loads(http_get(self.procs[name], "/status"))

    def kill(self, name: str) -> None:
        """SIGKILL every process of node ``name`` (its data stays)."""
        self.procs[name].kill()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()

    def __enter__(self) -> "Nodes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def listening(self, name: str) -> str:
        """Where node ``name``'s client and metrics ports are: its host, unless ``--bind`` says."""
        extra = self.extra
        return extra[extra.index("--bind") + 1] if "--bind" in extra else self.host[name]

    def address(self, name: str, protocol: str = "workq") -> Tuple[str, int]:
        return self.listening(name), self.procs[name].ports[protocol]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return run_cli("cluster", *args, "--cluster", str(self.file), timeout=timeout)

    def cli_process(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "queueserver", "cluster", *args, "--cluster",
                                 str(self.file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def status(self) -> List[dict]:
        result = self.cli("status", "--json")
        return json.loads(result.stdout)

    def log(self, name: str) -> str:
        return self.procs[name].log()

    def follower_pid(self, ordinal: int) -> int:
        """The pid of the follower process of shard ``ordinal`` (the one copy,
        on whichever node follows it)."""
        found = subprocess.run(["pgrep", "-f", f"queueserver.shard.follower --ordinal {ordinal} "
                                f"--cluster {self.file} "], capture_output=True, text=True).stdout.split()
        assert len(found) == 1, found
        return int(found[0])


def ensure_loopback_aliases() -> None:
    """127.0.0.2 to .5 answer on Linux without setup (all of 127/8 is loopback)."""
    for host in HOSTS:
        with socket.socket() as sock:
            sock.bind((host, 0))

