"""The command line, the TOML config, the runtime directory, and isolation
between clients, against real processes."""
from __future__ import annotations

import os
import stat

from serverproc import ServerProcess, run_cli
from wire import Wire, add, new_id


def test_serve_help_lists_every_option():
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    for flag in ("--shards", "--bind", "--workq-port", "--runtime-dir", "--log-level", "--config",
                 "--takeanumber-port", "--goqueue-port", "--queued-port", "--taskflux-port",
                 "--allow-dups", "--reservation-timeout", "--takeanumber-empty-error", "--max-payload",
                 "--max-connections", "--max-outstanding-bytes", "--max-queues", "--queue-idle-timeout"):
        assert flag in result.stdout


def test_bad_config_is_refused_with_a_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("shards = 2\nnonsense = 1\n")
    result = run_cli("serve", "--config", str(bad))
    assert result.returncode == 2
    assert "nonsense" in result.stderr
    assert run_cli("serve", "--shards", "0").returncode == 2


def test_config_file_sets_shards_and_ports_and_flags_override(tmp_path):
    config = tmp_path / "qs.toml"
    config.write_text('shards = 2\nlog_level = "debug"\n[workq]\nport = 1\n'
                      '[takeanumber]\nenabled = false\n[goqueue]\nenabled = false\n'
                      '[queued]\nenabled = false\n[taskflux]\nenabled = false\n')
    proc = ServerProcess(shards=2, protocols=["workq"], extra=["--config", str(config)])
    proc.start()  # its --workq-port 0 overrides the file's port 1
    try:
        assert set(proc.ports) == {"workq", "metrics"}   # metrics: the HTTP port of /metrics
        w = Wire(proc.connect())
        assert w.call(add(new_id(), "cfg")) == b"+OK\r\n"
        w.close()
        pids = proc.child_pids()
        assert set(pids) == {"shard-0", "shard-1", "router"}
        # The private runtime directory and its sockets are closed to others.
        assert stat.S_IMODE(os.stat(proc.runtime_dir).st_mode) == 0o700
        sockets = [f for f in os.listdir(proc.runtime_dir) if f.endswith(".sock")]
        assert len(sockets) == 2
        for name in sockets:
            assert stat.S_IMODE(os.stat(os.path.join(proc.runtime_dir, name)).st_mode) == 0o600
    finally:
        proc.stop()


def test_logs_say_what_listens_where_and_each_process_start_and_exit():
    proc = ServerProcess(shards=2, protocols=["workq"]).start()
    port = proc.port()
    proc.stop()
    log = proc.log()
    assert f"workq listening on 127.0.0.1:{port}" in log
    for name in ("shard-0", "shard-1", "router"):
        assert f"{name} started (pid" in log
        assert f"{name} exited with status 0" in log


def test_a_client_that_never_reads_does_not_stall_others():
    proc = ServerProcess(shards=2, protocols=["workq"]).start()
    try:
        setup = Wire(proc.connect())
        big = b"x" * 50000
        for _ in range(20):
            setup.call(add(new_id(), "fat", big))
        hog = proc.connect()
        hog.settimeout(0.5)
        request = b"inspect jobs fat 0 100\r\n"  # about 1 MB of answer each
        try:
            for _ in range(200):
                hog.sendall(request)
        except (TimeoutError, OSError):
            pass  # the router stopped reading it: that is the point
        worker = Wire(proc.connect())
        for _ in range(50):
            q, id = "lively", new_id()
            assert worker.call(add(id, q)) == b"+OK\r\n"
            assert worker.call(f"lease {q} 1000\r\n".encode()).startswith(f"+OK 1\r\n{id}".encode())
            assert worker.call(f"complete {id} 0\r\n\r\n".encode()) == b"+OK\r\n"
        hog.close()
        worker.close()
        setup.close()
    finally:
        proc.stop()


def test_deploy_example_config_loads():
    from queueserver.config import Config
    path = os.path.join(os.path.dirname(__file__), "..", "deploy", "queueserver.toml")
    config = Config.load(path)
    assert config == Config(shards=config.shards, runtime_dir="/run/queueserver",
                            data_dir="/var/lib/queueserver", listeners=config.listeners)
    assert config.durable
    assert config.listeners["workq"].port == 9922
    assert config.listeners["queued"].options == {"allow_dups": False}
    assert config.listeners["takeanumber"].options == {"reservation_timeout": 0}
