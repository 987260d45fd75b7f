"""etcd with authentication on: the cluster file's ``[etcd] user`` and
``password_file``, a login per endpoint, a lapsed token renewed in passing,
and a node that starts (or refuses to) with them. A real etcd (Debian's
etcd-server) per test, its authentication turned on through the gateway as
an operator would, its tokens lapsing after one idle second."""
from __future__ import annotations

import base64
import dataclasses
import os
import textwrap
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from cluster_nodes import Nodes, ensure_loopback_aliases
from etcd_server import EtcdServer, enable_auth, etcd, gateway, root_token  # noqa: F401 (etcd: the fixture)
from serverproc import one_line_error, run_cli, wait_for
from queueserver.cluster.clusterfile import ClusterError, EtcdSpec, load_cluster
from queueserver.cluster.coordination import (AuthenticationError, CoordinationError, Etcd, Membership,
                                              live_nodes)
from queueserver.cluster.etcdlogin import load_password

PREFIX = "/qs-test"
PASSWORD = "correct horse battery"
TOKEN_TTL = 1   # seconds a token lives past its last use (etcd's --auth-token-ttl)
REFUSED = "etcdserver: authentication failed, invalid user ID or password"


class Secured(NamedTuple):
    server: EtcdServer
    root: str           # root's password, to act behind the cluster's back
    spec: EtcdSpec      # user qs, its password file right


def password_file(path: Path, password: str, mode: int = 0o600) -> str:
    path.write_text(password + "\n")
    path.chmod(mode)
    return str(path)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    server = EtcdServer(tmp_path, options=["--auth-token-ttl", str(TOKEN_TTL), "--bcrypt-cost", "4"]).start()
    try:
        root = enable_auth(server, "qs", PASSWORD, PREFIX + "/")
        spec = EtcdSpec((server.endpoint,), PREFIX, 2, user="qs",
                        password_file=password_file(tmp_path / "etcd.password", PASSWORD))
        yield Secured(server, root, spec)
    finally:
        server.kill()


def refused_tokens(server: EtcdServer) -> int:
    """How many requests etcd refused for a lapsed token (its log says each)."""
    return server.log_path.read_text().count("invalid auth token")


def lease_of(secured: Secured, key: str) -> int:
    """The lease ``key`` is attached to, as root sees it (0: no key)."""
    token = root_token(secured.server, secured.root)
    found = gateway(secured.server, "/kv/range", {"key": base64.b64encode(key.encode()).decode()}, token)
    return int(found["kvs"][0].get("lease", 0)) if found.get("kvs") else 0


# ------------------------------------------------------------------ the cluster file
def test_the_cluster_file_names_an_etcd_user_and_its_password_file(tmp_path: Path) -> None:
    (tmp_path / "s").write_bytes(b"x" * 32)
    (tmp_path / "s").chmod(0o600)

    def cluster(etcd_lines: str) -> Path:
        path = tmp_path / "cluster.toml"
        path.write_text('secret_file = "s"\n[etcd]\nendpoints = ["http://127.0.0.1:2379"]\n' + etcd_lines +
                        '\n[[node]]\nname = "a"\nhost = "127.0.0.1"\nlink_port = 7400\nshards = 1\n')
        return path

    spec = load_cluster(str(cluster('user = "qs"\npassword_file = "etcd.password"')))
    assert spec.etcd is not None and spec.etcd.user == "qs"
    assert spec.etcd.password_file == str(tmp_path / "etcd.password")   # beside the cluster file
    assert load_cluster(str(cluster('user = "qs"\npassword_file = "/etc/qs/pw"'))).etcd.password_file == "/etc/qs/pw"
    for lines, says in [('user = "qs"', "user and password_file go together"),
                        ('password_file = "pw"', "user and password_file go together"),
                        ('user = ""\npassword_file = "pw"', "user must be the name of an etcd user"),
                        ('user = 7\npassword_file = "pw"', "user must be the name of an etcd user")]:
        with pytest.raises(ClusterError, match=says) as error:
            load_cluster(str(cluster(lines)))
        assert "\n" not in str(error.value)


def test_the_password_is_the_first_line_of_a_private_file(tmp_path: Path) -> None:
    assert load_password(password_file(tmp_path / "pw", "  s3cret \nsecond line")) == "s3cret"
    for path, says in [(password_file(tmp_path / "open", "s3cret", 0o644), "chmod 600 it"),
                       (password_file(tmp_path / "group", "s3cret", 0o640), "chmod 600 it"),
                       (password_file(tmp_path / "empty", "", 0o600), "no password on its first line"),
                       (str(tmp_path / "missing"), "does not exist"),
                       (str(tmp_path), "is a directory")]:
        with pytest.raises(ClusterError, match=says) as error:
            load_password(path)
        assert path in str(error.value) and "\n" not in str(error.value) and "s3cret" not in str(error.value)


# ------------------------------------------------------------------ the client
def test_the_right_credentials_read_write_and_hold_a_lease(secured: Secured) -> None:
    client = Etcd(secured.spec)
    try:
        client.call(lambda raw: raw.put(client.key("k"), "v"))
        assert client.call(lambda raw: raw.get(client.key("k"))) == [b"v"]
        with pytest.raises(CoordinationError, match="permission denied"):   # logged in, but not root
            client.call(lambda raw: raw.put("/elsewhere", "v"))
        member = Membership(client, "a", {"host": "127.0.0.1"})
        member.start()
        try:
            assert member.registered.is_set()
            assert live_nodes(client) == {"a": {"host": "127.0.0.1", "pid": os.getpid(),
                                                "started": member.info["started"]}}
        finally:
            member.stop()
        assert live_nodes(client) == {}   # revoked with the token
    finally:
        client.close()


def test_without_credentials_an_etcd_with_authentication_says_to_set_them(secured: Secured) -> None:
    client = Etcd(EtcdSpec(secured.spec.endpoints, PREFIX, 2))
    with pytest.raises(CoordinationError, match=r"user name is empty \(its authentication is on: set "
                                                r"\[etcd\] user and password_file\)"):
        live_nodes(client)
    client.close()


def test_credentials_for_an_etcd_without_authentication_are_not_needed(etcd: EtcdServer) -> None:
    client = Etcd(EtcdSpec((etcd.endpoint,), PREFIX, 2, user="qs",
                           password_file=password_file(etcd.directory / "pw", PASSWORD)))
    client.call(lambda raw: raw.put(client.key("k"), "v"))
    assert client.call(lambda raw: raw.get(client.key("k"))) == [b"v"]
    client.close()


def test_a_wrong_password_is_one_line_naming_the_endpoint_and_user(secured: Secured, tmp_path: Path) -> None:
    wrong = dataclasses.replace(secured.spec, password_file=password_file(tmp_path / "wrong", "guess"))
    client = Etcd(wrong)
    with pytest.raises(AuthenticationError) as error:
        live_nodes(client)
    assert str(error.value) == f"etcd at {secured.server.endpoint}: authentication failed for user 'qs': {REFUSED}"
    client.close()
    password_file(tmp_path / "wrong", PASSWORD, 0o644)   # the right password, in a file open to others
    with pytest.raises(AuthenticationError, match="chmod 600 it"):
        Etcd(wrong).log_in()


def test_a_lapsed_token_is_renewed_in_passing(secured: Secured) -> None:
    client = Etcd(secured.spec)
    try:
        for turn in range(3):
            client.call(lambda raw: raw.put(client.key("k"), str(turn)))
            refused = refused_tokens(secured.server)
            time.sleep(TOKEN_TTL + 2)   # idle: etcd drops the token (its own clock; nothing to wait on)
            assert client.call(lambda raw: raw.get(client.key("k"))) == [str(turn).encode()]
            assert refused_tokens(secured.server) == refused + 1   # the token had lapsed, and one login renewed it
    finally:
        client.close()


def test_a_member_registers_again_after_its_token_lapsed(secured: Secured) -> None:
    """A member's lease refreshes carry no token (etcd takes keep-alives
    without), so its token lapses while it lives; when its lease is revoked
    behind its back, it registers again through a fresh login, each time."""
    client = Etcd(secured.spec)
    member = Membership(client, "a", {})
    member.start()
    key = client.key("nodes", "a")
    try:
        for _ in range(3):
            lease = lease_of(secured, key)
            assert lease
            refused = refused_tokens(secured.server)
            time.sleep(TOKEN_TTL + 2)   # the member's token lapses, its lease stays alive
            assert lease_of(secured, key) == lease
            gateway(secured.server, "/kv/lease/revoke", {"ID": lease}, root_token(secured.server, secured.root))
            wait_for(lambda: lease_of(secured, key) not in (0, lease), 10, "the member to register again")
            assert refused_tokens(secured.server) > refused
    finally:
        member.stop()
        client.close()


# ------------------------------------------------------------------ a node
def test_a_node_with_credentials_registers_and_one_with_a_wrong_password_does_not_start(
        tmp_path: Path, secured: Secured) -> None:
    ensure_loopback_aliases()
    with Nodes(tmp_path, shards=(1,), protocols=["workq"]) as nodes:
        password = tmp_path / "node.password"
        password_file(password, PASSWORD)
        with open(nodes.file, "a") as f:
            f.write(textwrap.dedent(f"""\
                [etcd]
                endpoints = ["{secured.server.endpoint}"]
                prefix = "{PREFIX}"
                lease_ttl = 2
                user = "qs"
                password_file = "node.password"
                """))
        nodes.start()
        client = Etcd(secured.spec)
        wait_for(lambda: set(live_nodes(client)) == {"a"}, 15, "the node to register")
        assert [(row["shard"], row["etcd"], row["up"]) for row in nodes.status()] == [("a/0", "alive", True)]
        nodes.stop()
        assert live_nodes(client) == {}
        client.close()
        assert PASSWORD not in nodes.log("a")

        password_file(password, "guess")
        runtime = tmp_path / "rt-wrong"
        result = run_cli("serve", "--cluster", str(nodes.file), "--node", "a", "--data-dir",
                         str(tmp_path / "data-a"), "--runtime-dir", str(runtime), "--workq-port", "0",
                         "--no-takeanumber", "--no-goqueue", "--no-queued", "--no-taskflux")
        error = one_line_error(result)
        assert error.endswith(f"etcd at {secured.server.endpoint}: authentication failed for user 'qs': {REFUSED}")
        assert "guess" not in error
        assert not any(str(runtime) in _cmdline(pid) for pid in os.listdir("/proc") if pid.isdigit())


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:   # gone meanwhile
        return ""
