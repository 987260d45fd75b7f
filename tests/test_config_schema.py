"""The configuration schema through the real command: every mistake is one
line on stderr naming the key or flag and the fix, with status 2; good
settings reach the router and shard processes as agreed."""
from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from serverproc import ServerProcess, one_line_error, run_cli, wait_for
from wire import Wire, add, new_id, qname

BAD_FILES = [
    # (file text, fragments the one line must contain)
    ("[server]\nshards = 2\nbind = \n", ["bad.toml", "TOML syntax error", "line 3"]),
    ('[server]\nshards = "two"\n', ['server.shards must be an integer, got "two"']),
    ("shards = 2.5\n", ["shards must be an integer, got 2.5"]),
    ("[server]\nshard = 2\n", ["unknown key server.shard", "did you mean server.shards?"]),
    ("[workq]\nprot = 9922\n", ["unknown key workq.prot", "did you mean workq.port?"]),
    ("[workq]\nallow_dups = true\n", ["unknown key workq.allow_dups", "enabled, port, bind"]),
    ("[takeanumber]\nreservation_timout = 5\n",
     ["unknown key takeanumber.reservation_timout", "did you mean takeanumber.reservation_timeout?"]),
    ("max_payloads = 5\n", ["unknown key max_payloads", "did you mean max_payload?"]),
    ("shards = 2\n[server]\nshards = 3\n", ["shards is set both at the top level and in [server]"]),
    ("[server]\nqueue_idle_timeout = -1\n", ["server.queue_idle_timeout must be at least 0 seconds"]),
    ('[server]\nqueue_idle_timeout = "5m"\n', ["server.queue_idle_timeout must be a number of seconds"]),
    ("[takeanumber]\nreservation_timeout = -5\n",
     ["takeanumber.reservation_timeout must be at least 0 ms", "got -5"]),
    ('[takeanumber]\nempty_reserve_error = "yes"\n', ["takeanumber.empty_reserve_error must be true or false"]),
    ("[queued]\nallow_dups = 1\n", ["queued.allow_dups must be true or false, got 1"]),
    ("[workq]\nport = 70000\n", ["workq.port must be a port number from 0 to 65535", "got 70000"]),
    ("[goqueue]\nport = -1\n", ["goqueue.port must be a port number from 0 to 65535"]),
    ('[server]\nbind = "nowhere"\n', ['server.bind must be an IP address', 'got "nowhere"']),
    ('[taskflux]\nbind = "1.2.3"\n', ['taskflux.bind must be an IP address']),
    ('[server]\nlog_level = "loud"\n', ["server.log_level must be one of debug, info, warning, error"]),
    ("[server]\nmax_payload = 0\n", ["server.max_payload must be at least 1 bytes, got 0"]),
    ("[server]\nmax_connections = 0\n", ["server.max_connections must be at least 1"]),
    ("[server]\nmax_outstanding_bytes = 4096\n", ["server.max_outstanding_bytes must be at least 65536"]),
    ("[server]\nmax_queues = 0\n", ["server.max_queues must be at least 1"]),
    ("[console]\ntoken = 3\n", ["unknown key console.token", "did you mean console.token_file?"]),
    ("[console]\nhistory_report = 5\n", ["console.history_report must be a file path", "got 5"]),
    ('[console]\ntoken_file = ""\n', ["console.token_file must be a file path"]),
    ("console = 3\n", ["console must be a table"]),
    ("server = 3\n", ["server must be a table"]),
    ("workq = 3\n", ["workq must be a table"]),
    ('[metrics]\ntls = "both"\n', ["metrics.tls must be true or false"]),
    ("[metrics]\ntls_port = 9471\n", ["metrics.tls_port: the HTTP port is one port"]),
    ("[metrics]\ntls = true\n", ["metrics speaks TLS but tls.certificate (--tls-certificate) and tls.key"]),
]


@pytest.mark.parametrize("text, fragments", BAD_FILES, ids=[t for t, _ in BAD_FILES])
def test_a_bad_config_file_is_one_line_naming_the_key(tmp_path, text, fragments):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    line = one_line_error(run_cli("serve", "--config", str(path), "--runtime-dir", str(tmp_path / "rt")))
    for fragment in fragments:
        assert fragment in line
    assert not (tmp_path / "rt").exists()  # nothing was started or made


BAD_FLAGS = [
    (["--shards", "0"], "--shards must be at least 1, got 0"),
    (["--shards", "x"], "argument --shards: invalid int value: 'x'"),
    (["--workq-port", "70000"], "--workq-port must be a port number from 0 to 65535"),
    (["--queue-idle-timeout", "-3"], "--queue-idle-timeout must be at least 0 seconds"),
    (["--reservation-timeout", "-1"], "--reservation-timeout must be at least 0 ms"),
    (["--max-outstanding-bytes", "100"], "--max-outstanding-bytes must be at least 65536 bytes"),
    (["--max-payload", "0"], "--max-payload must be at least 1 bytes"),
    (["--log-level", "loud"], "--log-level must be one of debug, info, warning, error, critical"),
    (["--bind", "example"], "--bind must be an IP address"),
    (["--nonsense"], "unrecognized arguments: --nonsense"),
]


@pytest.mark.parametrize("argv, fragment", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line_naming_the_flag(argv, fragment):
    assert fragment in one_line_error(run_cli("serve", *argv))


def test_a_missing_or_unreadable_config_file_is_one_line(tmp_path):
    missing = one_line_error(run_cli("serve", "--config", str(tmp_path / "none.toml")))
    assert f"config file {tmp_path / 'none.toml'} does not exist" in missing
    directory = one_line_error(run_cli("serve", "--config", str(tmp_path)))
    assert f"cannot read config file {tmp_path}: is a directory" in directory
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"shards = 2\n\xff\xfe\n")
    assert "is not UTF-8 text" in one_line_error(run_cli("serve", "--config", str(binary)))


def _router_config(proc: ServerProcess) -> Dict[str, Any]:
    argv = proc.child_argv("router")
    return json.loads(argv[argv.index("--config") + 1])


def test_server_section_reaches_the_router_with_max_payload_and_limits(tmp_path):
    config = tmp_path / "qs.toml"
    config.write_text('[server]\nshards = 2\nlog_level = "debug"\nmax_payload = 4096\n'
                      "max_connections = 77\nmax_outstanding_bytes = 131072\nmax_queues = 12\n"
                      "queue_idle_timeout = 1.5\n"
                      "[takeanumber]\nreservation_timeout = 250\n[queued]\nallow_dups = true\n"
                      "[taskflux]\nenabled = false\n")
    proc = ServerProcess(shards=2, protocols=["workq", "takeanumber", "goqueue", "queued"],
                         extra=["--config", str(config), "--takeanumber-empty-error"]).start()
    try:
        assert set(proc.child_pids()) == {"shard-0", "shard-1", "router"}
        for shard in ("shard-0", "shard-1"):
            argv = proc.child_argv(shard)
            assert argv[argv.index("--max-queues") + 1] == "6"   # max_queues shared out
            assert argv[argv.index("--queue-idle-timeout") + 1] == "1.5"
        router = _router_config(proc)
        assert router["limits"] == {"max_connections": 77, "max_outstanding_bytes": 131072}
        assert router["options"] == {
            "workq": {"max_payload": 4096},
            "takeanumber": {"reservation_timeout": 250, "empty_reserve_error": True, "max_payload": 4096},
            "goqueue": {"max_payload": 4096},
            "queued": {"allow_dups": True, "max_payload": 4096},
        }
        w = Wire(proc.connect())
        assert w.call(add(new_id(), "cfg")) == b"+OK\r\n"
        w.close()
    finally:
        proc.stop()


def test_flags_override_the_file_and_top_level_keys_still_work(tmp_path):
    config = tmp_path / "qs.toml"
    config.write_text("shards = 2\nmax_payload = 4096\nmax_connections = 5\n")
    proc = ServerProcess(shards=1, protocols=["workq"],
                         extra=["--config", str(config), "--max-payload", "2048",
                                "--max-outstanding-bytes", "65536"]).start()
    try:
        # ServerProcess passes --shards 1 after the file: one shard.
        assert set(proc.child_pids()) == {"shard-0", "router"}
        router = _router_config(proc)
        assert router["options"] == {"workq": {"max_payload": 2048}}
        assert router["limits"] == {"max_connections": 5, "max_outstanding_bytes": 65536}
    finally:
        proc.stop()


def test_defaults_reach_the_router():
    proc = ServerProcess(protocols=["workq", "queued"]).start()
    try:
        router = _router_config(proc)
        assert router["options"] == {"workq": {"max_payload": 1048576}, "queued": {"max_payload": 1048576}}
        assert router["limits"] == {"max_connections": 10000, "max_outstanding_bytes": 8388608}
    finally:
        proc.stop()


def test_max_queues_and_queue_idle_timeout_reach_the_shards():
    proc = ServerProcess(protocols=["workq"], extra=["--max-queues", "1", "--queue-idle-timeout", "0.2"]).start()
    try:
        w = Wire(proc.connect())
        # A queue left unused (no jobs, no waiters) goes after the idle timeout...
        idle = qname("idle")
        assert w.call(f"lease {idle} 1\r\n".encode()) == b"-TIMEOUT\r\n"
        wait_for(lambda: idle.encode() not in w.call(b"inspect queues 0 10\r\n"), what="the idle queue to go")
        # ...and one queue in use is all a shard holds.
        first, second = qname("cap"), qname("cap")
        assert w.call(add(new_id(), first)) == b"+OK\r\n"
        assert w.call(add(new_id(), second)) == b"-SERVER-ERROR Too many queues\r\n"
        w.close()
    finally:
        proc.stop()


@pytest.mark.parametrize("extra, answer", [([], b":-1\r\n"),
                                           (["--takeanumber-empty-error"],
                                            b"-ERR No items available to reserve.\r\n")])
def test_takeanumber_empty_reserve_answer_follows_the_flag(extra, answer):
    proc = ServerProcess(protocols=["takeanumber"], extra=extra).start()
    try:
        with proc.connect("takeanumber") as sock:
            sock.sendall(f"RESERVE {qname('empty')}\r\n".encode())
            reply = b""
            while not reply.endswith(b"\n"):
                reply += sock.recv(4096)
        assert reply == answer
    finally:
        proc.stop()


def test_console_section_is_read(tmp_path):
    from queueserver.config import CONSOLE, Config
    config = tmp_path / "qs.toml"
    config.write_text('[console]\ntoken_file = "/etc/queueserver/console-tokens"\n'
                      'history_report = "/var/lib/queueserver/report"\n')
    loaded = Config.load(str(config))
    assert loaded.console_token_file == "/etc/queueserver/console-tokens"
    assert loaded.console_history_report == "/var/lib/queueserver/report"
    assert set(CONSOLE) == {"token_file", "history_report"}
    assert Config().console_token_file is None and Config().console_history_report is None


@pytest.mark.parametrize("bind, files, setting, https", [
    ("127.0.0.1", True, None, False),     # loopback: no TLS needed
    ("0.0.0.0", True, None, True),        # beyond loopback with a certificate: HTTPS
    ("10.1.2.3", False, None, False),     # beyond loopback, no certificate to offer
    ("0.0.0.0", True, "false", False),    # said so
    ("127.0.0.1", True, "true", True),
])
def test_the_http_port_speaks_https_by_default_beyond_loopback_with_a_certificate(bind, files, setting, https):
    from queueserver.config import Config
    config = Config()
    config.update({"metrics": {"bind": bind, **({"tls": setting == "true"} if setting else {})},
                   **({"tls": {"certificate": "c.pem", "key": "k.pem"}} if files else {})})
    config.check_tls()
    assert config.metrics_tls() is https
