"""Every file under deploy/ checked by the tool made for it where this machine
has that tool, and parsed (and checked against the command line) always.

- systemd units: ``systemd-analyze verify`` on copies whose ExecStart binary
  (``/opt/queueserver/.venv/bin/queueserver``, which exists only on an
  installed host) is swapped for a stub executable; nothing else is changed
  and no message is ignored: verify must print nothing. Then
  ``systemd-analyze security --offline`` must rate each service "OK" or
  better, and a table below lists the hardening every unit must carry.
- docker-compose.yml: ``docker compose config -q`` when the compose plugin
  is installed (skipped otherwise, saying so), and always parsed with PyYAML
  and checked against the cluster file and the command line.
- Dockerfile: parsed for the required instructions. ``docker build`` is not
  run: it needs the base image from a registry this machine cannot reach.
- Grafana dashboard: valid JSON whose queries name only the metrics the
  server exports (the table below), with unique panel ids.
- cluster.toml files: tomllib, the keys of the cluster file format, and the
  server's own loader when it is importable.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib

import pytest

from dockerfile import dockerignore, instructions
from queueserver.cli import build_config, build_parser
from queueserver.config import DEFAULT_METRICS_PORT
from queueserver.protocols import DEFAULT_PORTS

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEPLOY = os.path.join(ROOT, "deploy")
SYSTEMD = os.path.join(DEPLOY, "systemd")
COMPOSE = os.path.join(DEPLOY, "compose")
INSTALLED_BINARY = "/opt/queueserver/.venv/bin/queueserver"
USERADD = "useradd --system --no-create-home --shell /usr/sbin/nologin queueserver"

SERVER_UNITS = ["queueserver.service", "queueserver-node@.service"]
HISTORY_UNIT = "queueserver-history.service"
TIMER = "queueserver-history.timer"

#: option -> value every server unit sets (what each protects: the comment
#: above the line in the unit).
HARDENING = {
    "NoNewPrivileges": "true",
    "ProtectSystem": "strict",
    "ProtectHome": "true",
    "PrivateTmp": "true",
    "PrivateDevices": "true",
    "ProtectKernelTunables": "true",
    "ProtectKernelModules": "true",
    "ProtectKernelLogs": "true",
    "ProtectControlGroups": "true",
    "ProtectClock": "true",
    "ProtectHostname": "true",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "true",
    "RestrictRealtime": "true",
    "RestrictSUIDSGID": "true",
    "LockPersonality": "true",
    "MemoryDenyWriteExecute": "true",
    "SystemCallArchitectures": "native",
    "SystemCallFilter": "@system-service",
    "CapabilityBoundingSet": "",
    "UMask": "0077",
    "StateDirectoryMode": "0700",
    "RuntimeDirectoryMode": "0700",
    "Restart": "on-failure",
    "RestartPreventExitStatus": "2",
    "User": "queueserver",
    "Group": "queueserver",
}
#: the server units also set these, to any value
SERVER_ALSO = ["LimitNOFILE", "TimeoutStopSec", "StateDirectory", "RuntimeDirectory"]
#: the JVM of `queueserver history` writes and runs its JIT's code
NOT_FOR_JVM = {"MemoryDenyWriteExecute", "RuntimeDirectoryMode", "Restart", "RestartPreventExitStatus"}

#: The metrics the server exports (each also has the constant label "node"):
#: name -> (type, labels).
METRICS = {
    "queueserver_jobs_added_total": ("counter", {"queue"}),
    "queueserver_jobs_leased_total": ("counter", {"queue"}),
    "queueserver_jobs_completed_total": ("counter", {"queue"}),
    "queueserver_jobs_failed_total": ("counter", {"queue"}),
    "queueserver_jobs_expired_total": ("counter", {"queue"}),
    "queueserver_queue_jobs": ("gauge", {"queue", "state"}),
    "queueserver_wait_seconds": ("histogram", set()),
    "queueserver_lease_seconds": ("histogram", set()),
    "queueserver_fsync_seconds": ("histogram", set()),
    "queueserver_connections": ("gauge", set()),
    "queueserver_log_bytes": ("gauge", {"shard"}),
    "queueserver_slots_owned": ("gauge", {"shard"}),
    "queueserver_shard_up": ("gauge", {"shard"}),
    "queueserver_jobs": ("gauge", {"shard"}),
    "queueserver_connections_accepted_total": ("counter", set()),
    "queueserver_bytes_received_total": ("counter", set()),
    "queueserver_bytes_sent_total": ("counter", set()),
    "queueserver_log_records_total": ("counter", {"shard"}),
    "queueserver_slot_moves_total": ("counter", {"direction"}),
}


def _series() -> dict:
    """Every series name a query may use -> (metric, labels it may carry)."""
    series = {}
    for name, (kind, labels) in METRICS.items():
        labels = labels | {"node"}
        if kind == "histogram":
            series[f"{name}_bucket"] = (name, labels | {"le"})
            series[f"{name}_sum"] = (name, labels)
            series[f"{name}_count"] = (name, labels)
        else:
            series[name] = (name, labels)
    return series


# ------------------------------------------------------------------ systemd
def _read_unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    with open(os.path.join(SYSTEMD, name)) as f:
        unit.read_string(f.read())
    return unit


def _text(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.mark.parametrize("name", SERVER_UNITS + [HISTORY_UNIT])
def test_each_unit_carries_the_hardening_table(name):
    service = _read_unit(name)["Service"]
    wanted = dict(HARDENING)
    if name == HISTORY_UNIT:
        for key in NOT_FOR_JVM:
            wanted.pop(key)
        assert "MemoryDenyWriteExecute" not in service, "the JVM needs writable+executable memory"
        assert "MemoryDenyWriteExecute" in _text(os.path.join(SYSTEMD, name)), \
            "the history unit says why it has no MemoryDenyWriteExecute"
    else:
        for key in SERVER_ALSO:
            assert service.get(key), f"{name}: {key} missing"
    missing = {key: value for key, value in wanted.items() if service.get(key) != value}
    assert not missing, f"{name}: these options are missing or differ: {missing}"


@pytest.mark.parametrize("name", SERVER_UNITS + [HISTORY_UNIT, TIMER])
def test_each_unit_says_how_to_install_it_and_makes_its_user(name):
    text = _text(os.path.join(SYSTEMD, name))
    header = text.split("\n[", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines() if line.strip())
    assert "/etc/systemd/system/" in header and "systemctl" in header
    if name != TIMER:
        assert USERADD in header


def _argv(name: str) -> list:
    argv = shlex.split(_read_unit(name)["Service"]["ExecStart"].replace("%i", "a"))
    assert argv[0] == INSTALLED_BINARY
    return argv[1:]


def test_the_node_unit_runs_the_instance_named_node_of_the_cluster(tmp_path):
    service = _read_unit("queueserver-node@.service")["Service"]
    assert "--node %i" in service["ExecStart"]
    argv = _argv("queueserver-node@.service")
    config_file = tmp_path / "queueserver.toml"
    config_file.write_text(_text(os.path.join(DEPLOY, "queueserver.toml")))
    argv = [str(config_file) if arg == "/etc/queueserver/queueserver.toml" else arg for arg in argv]
    config = build_config(build_parser().parse_args(argv))
    assert config.node == "a"
    assert config.cluster == "/etc/queueserver/cluster.toml"
    # Cluster mode needs a data directory: the unit's own state directory.
    assert config.data_dir == f"/var/lib/{service['StateDirectory']}"
    assert config.runtime_dir == f"/run/{service['RuntimeDirectory']}"
    # Both server units use these directories, so they must not run together.
    assert "queueserver.service" in _read_unit("queueserver-node@.service")["Unit"]["Conflicts"]


def test_the_history_unit_reports_on_the_server_data_directory_nightly():
    unit = _read_unit(HISTORY_UNIT)
    service = unit["Service"]
    assert service["Type"] == "oneshot"
    args = build_parser().parse_args(_argv(HISTORY_UNIT))
    assert args.command == "history"
    assert args.data_dir == "/var/lib/queueserver" == f"/var/lib/{service['StateDirectory']}"
    assert args.out == "/var/lib/queueserver/history-report"
    timer = _read_unit(TIMER)["Timer"]
    assert timer["Unit"] == HISTORY_UNIT
    assert re.fullmatch(r"\*-\*-\* \d\d:\d\d:\d\d", timer["OnCalendar"]), "once a day"
    assert timer["Persistent"] == "true"


def _units_for_systemd_analyze(tmp_path) -> str:
    """Copies of the units, the installed binary swapped for a stub (the only change)."""
    stub = tmp_path / "bin" / "queueserver"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for name in os.listdir(SYSTEMD):
        text = _text(os.path.join(SYSTEMD, name))
        assert text.count(INSTALLED_BINARY) <= 1
        (units / name).write_text(text.replace(INSTALLED_BINARY, str(stub)))
    return str(units)


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")


@needs_systemd_analyze
@pytest.mark.parametrize("name", ["queueserver.service", "queueserver-node@a.service", HISTORY_UNIT, TIMER])
def test_systemd_analyze_verify_finds_nothing(tmp_path, name):
    # The template is verified through an instance (node a); the timer with
    # its service beside it. Nothing it prints is ignored: unknown keys and
    # bad values are only warnings (exit status 0), so any output fails.
    units = _units_for_systemd_analyze(tmp_path)
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", os.path.join(units, name)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


@needs_systemd_analyze
@pytest.mark.parametrize("name", ["queueserver.service", "queueserver-node@a.service", HISTORY_UNIT])
def test_systemd_analyze_security_rates_the_sandbox_ok(tmp_path, name):
    # Exposure runs from 0 (locked down) to 10 (none); 2.5 is well within
    # "OK". The threshold is given in tenths. The units score about 1.8-1.9.
    units = _units_for_systemd_analyze(tmp_path)
    done = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--threshold=25",
                           "--no-pager", os.path.join(units, name)],
                          capture_output=True, text=True, timeout=60)
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr


# ------------------------------------------------------------------ Dockerfile
def test_the_dockerfile_has_the_required_instructions(tmp_path):
    steps = instructions()
    froms = [args for word, args in steps if word == "FROM"]
    assert froms and all(args.split()[0] == "python:3.11-slim-bookworm" for args in froms)
    final = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    run = steps[final:]
    one = {}
    for word, args in run:
        one.setdefault(word, []).append(args)

    # Installed from the source tree (the build stage's wheel), no extras.
    runs = " ".join(one["RUN"])
    assert "pip install" in runs and "[dev" not in runs and "[spark" not in runs
    assert any(word == "RUN" and "pip wheel" in args and args.rstrip().endswith(" .")
               for word, args in steps[:final])
    # The sources copied exist in the context and the .dockerignore keeps them.
    ignored = dockerignore()
    for word, args in steps[:final]:
        if word == "COPY" and "--from" not in args:
            for src in args.split()[:-1]:
                assert os.path.exists(os.path.join(ROOT, src)), src
                assert src not in ignored
    for needed in (".venv", "data", ".git", "loadtests/.peers", "**/__pycache__"):
        assert needed in ignored, f".dockerignore should keep {needed} out"

    # A fixed non-root user, and it is the one that runs.
    assert re.search(r"useradd [^&]*--uid 10001\b[^&]* queueserver\b", runs)
    assert one["USER"][-1].split(":")[0] in ("queueserver", "10001")
    assert one["VOLUME"] == ["/var/lib/queueserver"]

    exposed = set()
    for args in one["EXPOSE"]:
        for port in args.split():
            low, _, high = port.partition("-")
            exposed.update(range(int(low), int(high or low) + 1))
    assert set(DEFAULT_PORTS.values()) | {DEFAULT_METRICS_PORT, 7400, 7401} <= exposed

    health = one["HEALTHCHECK"][-1]
    command = json.loads(health.split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"] and "curl" not in health
    assert f"http://127.0.0.1:{DEFAULT_METRICS_PORT}/status" in command[2] and "urllib" in command[2]
    compile(command[2], "HEALTHCHECK", "exec")

    entrypoint = json.loads(one["ENTRYPOINT"][-1])
    cmd = json.loads(one["CMD"][-1])
    assert entrypoint == ["queueserver", "serve"]
    config = build_config(build_parser().parse_args(entrypoint[1:] + cmd))
    assert config.bind == "0.0.0.0" and config.data_dir == "/var/lib/queueserver"


# ------------------------------------------------------------------ compose
def _compose() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML (in the dev extra) parses the compose file")
    with open(os.path.join(COMPOSE, "docker-compose.yml")) as f:
        return yaml.safe_load(f)


def _cluster(path: str) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _compose_available() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "compose", "version"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _compose_available(),
                    reason="`docker compose` (the compose plugin) is not installed here; "
                           "the file is still parsed and checked by the tests below")
def test_docker_compose_config_accepts_the_file(tmp_path):
    # A copy, with the git-ignored secret made from the example, as step 1 of
    # the file's instructions would.
    copy = tmp_path / "deploy" / "compose"
    shutil.copytree(COMPOSE, copy)
    shutil.copy(copy / "cluster.secret.example", copy / "cluster.secret")
    shutil.copy(os.path.join(DEPLOY, "Dockerfile"), copy.parent / "Dockerfile")
    done = subprocess.run(["docker", "compose", "-f", str(copy / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_compose_file_is_valid_under_the_compose_specification_schema():
    """The check ``docker compose config`` starts with, where the plugin is
    absent: the Compose Specification's own JSON schema (compose-spec/compose-spec,
    ``schema/compose-spec.json``, kept in tests/data)."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the dev extra")
    with open(os.path.join(os.path.dirname(__file__), "data", "compose-spec.json")) as f:
        schema = json.load(f)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(_compose()), key=str)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    broken = dict(_compose(), services={"node-a": {"imgae": "x"}})
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))   # the schema does catch mistakes


def test_the_compose_file_runs_the_three_nodes_of_its_cluster_file():
    compose = _compose()
    cluster = _cluster(os.path.join(COMPOSE, "cluster.toml"))
    hosts = {node["host"]: node["name"] for node in cluster["node"]}
    members = {name: service for name, service in compose["services"].items() if name.startswith("etcd-")}
    services = {name: service for name, service in compose["services"].items() if name not in members}
    assert set(services) == set(hosts) and len(services) == 3
    # Three etcd members, each listed in the cluster file and each a member of the others' cluster.
    assert sorted(members) == ["etcd-1", "etcd-2", "etcd-3"]
    assert cluster["etcd"]["endpoints"] == [f"http://{name}:2379" for name in sorted(members)]
    for name, member in members.items():
        env = member["environment"]
        assert env["ETCD_NAME"] == name and f"{name}=http://{name}:2380" in env["ETCD_INITIAL_CLUSTER"]
        assert env["ETCD_ADVERTISE_CLIENT_URLS"] == f"http://{name}:2379"
        (volume,) = member["volumes"]
        assert volume.split(":")[0] in compose["volumes"]

    entrypoint = json.loads(dict(instructions())["ENTRYPOINT"])
    host_ports, volumes = [], []
    for name, service in services.items():
        # The build context is the repository root and holds the Dockerfile.
        context = os.path.normpath(os.path.join(COMPOSE, service["build"]["context"]))
        assert context == ROOT
        assert os.path.isfile(os.path.join(context, service["build"]["dockerfile"]))
        args = build_parser().parse_args(entrypoint[1:] + service["command"])
        assert args.node == hosts[name], f"{name} runs the node whose host it is"
        assert args.cluster == service["configs"][0]["target"] == "/etc/queueserver/cluster.toml"
        assert args.data_dir == "/var/lib/queueserver"
        # One named volume per node, on the data directory.
        (volume,) = service["volumes"]
        source, target = volume.split(":")
        assert target == "/var/lib/queueserver" and source in compose["volumes"]
        volumes.append(source)
        assert sorted(service["depends_on"]) == sorted(members)
        # The secret, where the cluster file looks for it.
        secret = service["secrets"][0]
        assert f"/run/secrets/{secret}" == cluster["secret_file"]
        health = service["healthcheck"]["test"]
        assert health[0] == "CMD" and f"127.0.0.1:{DEFAULT_METRICS_PORT}/status" in health[-1]
        published = {}
        for port in service["ports"]:
            parts = port.split(":")
            published[int(parts[-1])] = int(parts[-2])
        assert set(published) == set(DEFAULT_PORTS.values()) | {DEFAULT_METRICS_PORT}
        host_ports.extend(published.values())
    assert len(set(volumes)) == 3
    assert len(set(host_ports)) == len(host_ports), "every node publishes on its own host ports"

    (secret,) = compose["secrets"].values()
    assert secret["file"] == "./cluster.secret"
    assert "cluster.secret" in _text(os.path.join(COMPOSE, ".gitignore")).split()
    example = open(os.path.join(COMPOSE, "cluster.secret.example"), "rb").read().rstrip()
    assert len(example) >= 16


# ------------------------------------------------------------------ cluster files
CLUSTER_FILES = [os.path.join(DEPLOY, "cluster.toml"), os.path.join(COMPOSE, "cluster.toml")]
NODE_KEYS = {"name", "host", "link_port", "shards", "bind", "metrics_port", "join", "removed",
             *(f"{protocol}_port" for protocol in DEFAULT_PORTS)}


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=["systemd", "compose"])
def test_the_cluster_files_have_the_keys_of_the_format(path):
    cluster = _cluster(path)
    assert set(cluster) <= {"secret_file", "tls", "etcd", "replicas", "node"}
    assert cluster["replicas"] == 1
    assert cluster["etcd"]["endpoints"] and cluster["etcd"]["lease_ttl"] >= 2
    assert isinstance(cluster["secret_file"], str) and cluster["secret_file"]
    nodes = cluster["node"]
    assert [node["name"] for node in nodes] == ["a", "b", "c"]
    for node in nodes:
        assert set(node) <= NODE_KEYS
        assert {"name", "host", "link_port", "shards"} <= set(node)
        assert isinstance(node["link_port"], int) and isinstance(node["shards"], int)
        assert not node.get("join", False), "the example cluster's nodes make the cluster"
    assert len({node["host"] for node in nodes}) == 3
    if path == CLUSTER_FILES[0]:
        assert set(cluster["tls"]) == {"cert", "key", "ca"}
        assert all(value.startswith("/etc/queueserver/tls/") for value in cluster["tls"].values())


def _join_example(text: str) -> str:
    """The commented [[node]] block of the add-node procedure, uncommented."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "#        [[node]]")
    block = []
    for line in lines[start:]:
        block.append(line.lstrip("#").strip())
        if block[-1] == "join = true":
            return "\n".join(block) + "\n"
    raise AssertionError("the add-node example has no join = true")


def test_the_systemd_cluster_file_explains_adding_a_node():
    text = _text(CLUSTER_FILES[0])
    assert "queueserver cluster add-node" in text and "--cluster" in text
    added = tomllib.loads(_text(CLUSTER_FILES[0]) + _join_example(text))["node"][-1]
    assert added["join"] is True and added["name"] not in ("a", "b", "c")


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=["systemd", "compose"])
def test_the_server_loads_the_cluster_files(path, tmp_path):
    clusterfile = pytest.importorskip("queueserver.cluster.clusterfile")
    spec = clusterfile.load_cluster(path)
    assert [node.name for node in spec.nodes] == ["a", "b", "c"]
    if path == CLUSTER_FILES[0]:
        # The add-node example, appended as the procedure says, loads too.
        text = _text(path)
        joined = tmp_path / "cluster.toml"
        joined.write_text(text + _join_example(text))
        spec = clusterfile.load_cluster(str(joined))
        assert spec.nodes[-1].join and spec.nodes[-1].name == "d"


# ------------------------------------------------------------------ Grafana
def _dashboard() -> dict:
    with open(os.path.join(DEPLOY, "grafana", "queueserver-dashboard.json")) as f:
        return json.load(f)


def _panels(panels: list):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _check_query(expr: str, series: dict) -> set:
    """The metrics ``expr`` uses; fails on an unknown series or label."""
    names = set(re.findall(r"\bqueueserver_\w+", expr))
    assert names, f"no queueserver metric in {expr!r}"
    unknown = names - set(series)
    assert not unknown, f"{expr!r} uses series the server does not export: {sorted(unknown)}"
    allowed = set().union(*(series[name][1] for name in names))
    for name, matchers in re.findall(r"\b(queueserver_\w+)\{([^}]*)\}", expr):
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
            assert label in series[name][1], f"{name} has no label {label} ({expr!r})"
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in (part.strip() for part in grouping.split(",")):
            assert label in allowed, f"no metric of {expr!r} has the label {label}"
    return {series[name][0] for name in names}


def test_the_dashboard_queries_only_the_exported_metrics():
    dashboard = _dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    inputs = {item["name"]: item for item in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    datasource = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    node = variables["node"]
    assert node["type"] == "query" and node["datasource"] == datasource
    assert node["query"]["query"] == node["definition"] == "label_values(queueserver_shard_up, node)"

    series = _series()
    used = set()
    for variable in variables.values():
        used |= _check_query(variable["definition"], series)
    panels = list(_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    cells = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        area = {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])}
        assert not area & cells, f"panel {panel['id']} overlaps another"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == datasource
        assert panel["targets"], f"panel {panel['title']} has no query"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"] == datasource
            used |= _check_query(target["expr"], series)
    assert used == set(METRICS), f"metrics on no panel: {sorted(set(METRICS) - used)}"


def test_the_dashboard_has_the_panels_asked_for():
    exprs = {panel["title"]: " ".join(t["expr"] for t in panel.get("targets", []))
             for panel in _panels(_dashboard()["panels"])}
    every = " ".join(exprs.values())
    for event in ("added", "leased", "completed", "failed", "expired"):
        assert f"rate(queueserver_jobs_{event}_total" in every
    for metric in ("wait", "lease"):
        for quantile in ("0.5", "0.99"):
            assert f"histogram_quantile({quantile}, sum by (node, le) (rate(queueserver_{metric}_seconds_bucket" \
                   in every
    assert "histogram_quantile(0.99, sum by (node, le) (rate(queueserver_fsync_seconds_bucket" in every
    assert "by (queue, state) (queueserver_queue_jobs" in every
