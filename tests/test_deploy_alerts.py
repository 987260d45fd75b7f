"""deploy/prometheus/: alert rules over the metrics a real server exports.

- Every series an alert's expression names (and every label it matches or
  groups by) is in a real scrape of ``/metrics``: a durable two-shard server
  with its job history on, after a job went through a queue. (``up`` is
  Prometheus's own series, of the scrape job prometheus.yml names.)
- Each rule has a severity and a summary and description.
- With ``promtool`` (Debian's ``prometheus`` package, unpacked by install-peers.sh):
  ``promtool check rules``, ``promtool check config prometheus.yml`` and
  ``promtool test rules queueserver-alerts.test.yml``, the rules' unit test
  (which alerts fire, with which labels and texts), must all succeed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Set

import yaml

from queueserver.client import Client

from serverproc import ServerProcess, http_get

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PROMETHEUS = os.path.join(ROOT, "deploy", "prometheus")
RULES = os.path.join(PROMETHEUS, "queueserver-alerts.yml")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")
#: Prometheus's own series the rules may use, with their labels.
PROMETHEUS_OWN = {"up": {"job", "instance"}}


def rules() -> list:
    with open(RULES) as f:
        groups = yaml.safe_load(f)["groups"]
    return [rule for group in groups for rule in group["rules"]]


def scrape(text: str) -> Dict[str, Set[str]]:
    """Series name -> the labels its samples carry, from a /metrics text."""
    series: Dict[str, Set[str]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = set(re.findall(r'(\w+)="', match.group(2) or ""))
            series.setdefault(match.group(1), set()).update(labels)
    return series


def check_expr(expr: str, series: Dict[str, Set[str]]) -> Set[str]:
    """The series ``expr`` names, each checked against the scrape; its labels too."""
    names = set(re.findall(r"\bqueueserver_\w+", expr)) | ({"up"} if re.search(r"\bup\{", expr) else set())
    assert names, f"no series in {expr!r}"
    known = {**series, **PROMETHEUS_OWN}
    missing = names - set(known)
    assert not missing, f"{expr!r} names series a real scrape does not have: {sorted(missing)}"
    for name, matchers in re.findall(r"\b(queueserver_\w+|up)\{([^}]*)\}", expr):
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
            assert label in known[name], f"{name} has no label {label} in a real scrape"
    labels = set().union(*(known[name] for name in names))
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        for label in (part.strip() for part in grouping.split(",")):
            assert label in labels, f"no series of {expr!r} has the label {label}"
    return names


def test_every_alert_names_only_what_a_real_server_exports(tmp_path):
    with ServerProcess(shards=2, protocols=["workq"],
                       extra=["--data-dir", str(tmp_path / "data"), "--history"]) as proc:
        with Client(port=proc.port("workq")) as client:
            client.add("6ba7b810-9dad-11d1-80b4-00c04fd430c8", "emails", b"hi", ttr=5000, ttl=60000)
            job = client.lease(["emails"], 1000)
            client.complete(job.id, b"done")
        series = scrape(http_get(proc, "/metrics").decode())
    assert "queueserver_jobs_completed_total" in series and "queue" in series[
        "queueserver_jobs_completed_total"], sorted(series)
    used: Set[str] = set()
    names = []
    for rule in rules():
        names.append(rule["alert"])
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        used |= check_expr(rule["expr"], series)
    assert len(names) == len(set(names)), "alert names are unique"
    assert {"queueserver_shard_up", "queueserver_router_up", "queueserver_jobs_failed_total",
            "queueserver_queue_jobs", "queueserver_fsync_seconds_bucket"} <= used


def test_the_check_finds_a_series_the_server_does_not_export():
    series = {"queueserver_shard_up": {"node", "shard"}}
    check_expr("queueserver_shard_up == 0", series)
    for wrong, message in (("queueserver_shard_down == 1", "does not have"),
                           ('queueserver_shard_up{queue="x"} == 0', "no label queue"),
                           ("sum by (queue) (queueserver_shard_up) == 0", "has the label queue")):
        try:
            check_expr(wrong, series)
        except AssertionError as err:
            assert message in str(err), (wrong, err)
        else:
            raise AssertionError(f"{wrong!r} passed the check")


def test_promtool_accepts_the_rules_and_their_unit_test():
    """promtool, from Debian's prometheus package (unpacked under
    loadtests/.peers by loadtests/install-peers.sh, which ``make test`` runs)."""
    peers = Path(os.environ.get("QS_PEERS_DIR") or Path(__file__).parent.parent / "loadtests" / ".peers")
    promtool = shutil.which("promtool") or shutil.which("promtool", path=str(peers / "root" / "usr" / "bin"))
    assert len(rules()) >= 8
    assert promtool is not None, "no promtool: run loadtests/install-peers.sh (make test does)"
    for args in (["check", "rules", "queueserver-alerts.yml"], ["check", "config", "prometheus.yml"],
                 ["test", "rules", "queueserver-alerts.test.yml"]):
        result = subprocess.run([promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
