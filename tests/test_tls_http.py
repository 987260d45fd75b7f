"""The node's HTTP port (``/metrics``, ``/status``, the console) behind the
``[tls]`` files and the access file, through real servers and real clients
(Python's ``ssl``, ``curl``):

* ``mtls``: HTTPS with a client CA (``--metrics-tls``), identities by
  certificate: a scrape with and without a client certificate, a plain HTTP
  request to the HTTPS port, pages, queue pages, job pages and console
  actions allowed and refused (the token still needed), refusals counted,
  a silent client closed by the handshake timeout while others are served,
  SIGHUP reloading the access file and the client CA;
* ``networks``: the HTTP port bound beyond loopback (``0.0.0.0``) with a
  ``[tls]`` certificate and no ``metrics.tls``: HTTPS by default, no client
  certificate asked for, identities by source address;
* ``plain``: bound beyond loopback with ``--no-metrics-tls``: one warning at start;
* the console over HTTPS in the real browser of the console's tests
  (Chromium through Playwright), presenting a client certificate
  (Playwright's ``client_certificates``); it does not trust the test CA,
  so certificate errors are ignored for its pages (``ignore_https_errors``).
"""
from __future__ import annotations

import http.client
import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import pytest
from browser import screenshot

from tests.serverproc import ServerProcess, wait_for
from tests.test_access_server import Client, workq_add
from tests.test_tls_server import HANDSHAKE_TIMEOUT, PKI
from tests.tls_certs import Issued
from tests.wire import qname

TOKEN = "tok-" + uuid.uuid4().hex
FEEDER = "127.0.0.5"   # the address the tests add jobs from (the feeder identity)

MTLS_ACL = """
[identities.ops]
certificates = ["ops"]
inspect = ["*"]
admin = ["orders.*"]

[identities.watcher]
certificates = ["watcher"]
inspect = ["orders.*"]

[identities.alice]
certificates = ["alice.example"]
inspect = ["*"]

[identities.feeder]
networks = ["127.0.0.5/32"]
produce = ["*"]
"""

NETWORKS_ACL = """
[identities.local]
networks = ["127.0.0.1/32"]
inspect = ["*"]

[identities.narrow]
networks = ["127.0.0.2/32"]
inspect = ["orders.*"]

[identities.feeder]
networks = ["127.0.0.5/32"]
produce = ["*"]
"""

Answer = Tuple[int, Dict[str, str], bytes]


class HTTPS:
    """Requests to a server's HTTPS port as one client: a certificate (or
    none), from a source address."""

    def __init__(self, proc: ServerProcess, context: ssl.SSLContext, source: str = "127.0.0.1") -> None:
        self.proc, self.context, self.source = proc, context, source

    def request(self, method: str, path: str, body: Optional[bytes] = None, **headers: str) -> Answer:
        conn = http.client.HTTPSConnection("127.0.0.1", self.proc.ports["metrics"], context=self.context,
                                           timeout=15, source_address=(self.source, 0))
        try:
            conn.request(method, path, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        finally:
            conn.close()

    def get(self, path: str, **headers: str) -> Answer:
        return self.request("GET", path, **headers)

    def act(self, path: str, fields: str = "", token: Optional[str] = TOKEN) -> Answer:
        """A console action as a script posts it (the token in its header)."""
        headers = {"Content_Type": "application/x-www-form-urlencoded"}
        if token is not None:
            headers["X_Queueserver_Token"] = token
        return self.request("POST", path, fields.encode(), **headers)


def add_job(proc: ServerProcess, queue: str) -> str:
    feeder = Client(proc, "workq", FEEDER)
    try:
        return workq_add(feeder, queue).decode()
    finally:
        feeder.sock.close()


def refusals(answer: Answer) -> Dict[Tuple[str, str], float]:
    """``queueserver_access_refusals_total`` by (identity, verb), from a /metrics answer."""
    found = {}
    for line in answer[2].decode().splitlines():
        if line.startswith("queueserver_access_refusals_total{"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            found[(labels["identity"].strip('"'), labels["verb"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return found


# ------------------------------------------------------------------ mTLS
class MTLS:
    def __init__(self, proc: ServerProcess, pki: PKI, ops: Issued, watcher: Issued, acl: Path) -> None:
        self.proc, self.pki, self.acl = proc, pki, acl
        self.ops = HTTPS(proc, pki.context(ops))
        self.watcher = HTTPS(proc, pki.context(watcher))
        self.alice = HTTPS(proc, pki.context(pki.alice))
        self.bob = HTTPS(proc, pki.context(pki.bob))          # trusted CA, no identity names him
        self.nobody = HTTPS(proc, pki.context(None))          # no client certificate
        self.ops_files = ops


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MTLS]:
    yield from mtls_server(tmp_path_factory.mktemp("mtls"))


def mtls_server(home: Path) -> Iterator[MTLS]:
    """A 2-shard server whose HTTP port asks for client certificates, with its rules in ``home``."""
    pki = PKI(home / "pki")
    ops, watcher = pki.one.issue("ops"), pki.two.issue("watcher")
    acl = home / "access.toml"
    acl.write_text(MTLS_ACL)
    (home / "tokens").write_text(f"ops {TOKEN}\n")
    config = home / "qs.toml"
    config.write_text(f'[console]\ntoken_file = "{home / "tokens"}"\n')
    extra = ["--config", str(config), "--tls-certificate", str(pki.server.cert), "--tls-key", str(pki.server.key),
             "--tls-client-ca", str(pki.client_ca), "--tls-handshake-timeout", str(HANDSHAKE_TIMEOUT),
             "--metrics-tls", "--acl", str(acl)]
    with ServerProcess(shards=2, protocols=["workq"], extra=extra) as proc:
        yield MTLS(proc, pki, ops, watcher, acl)


def test_an_https_scrape_with_a_client_certificate(mtls: MTLS) -> None:
    status, headers, body = mtls.ops.get("/metrics")
    assert status == 200 and b"queueserver_shard_up" in body, body[:300]
    status, headers, body = mtls.ops.get("/status")
    assert status == 200 and headers["content-type"] == "application/json"
    assert len(json.loads(body)["shards"]) == 2


def test_without_a_client_certificate_the_handshake_is_refused(mtls: MTLS) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        mtls.nobody.get("/metrics")   # TLS 1.3: the alert comes with the first read
    wait_for(lambda: "HTTP client 127.0.0.1" in mtls.proc.log() and "TLS handshake failed" in mtls.proc.log(),
             10, "the failed handshake's log line")


def test_plain_http_on_the_https_port_is_answered_400_in_plain_http(mtls: MTLS) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", mtls.proc.ports["metrics"], timeout=10)
    try:
        conn.request("GET", "/metrics")
        answer = conn.getresponse()
        assert answer.status == 400
        assert b"speaks HTTPS" in answer.read()
    finally:
        conn.close()
    wait_for(lambda: "plain HTTP on the HTTPS port" in mtls.proc.log(), 10, "the refusal's log line")


def test_curl_scrapes_with_its_client_certificate(mtls: MTLS) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is part of the test tools (apt-get install curl)"
    url = f"https://127.0.0.1:{mtls.proc.ports['metrics']}/metrics"
    done = subprocess.run([curl, "-sS", "--fail", "--max-time", "10", "--cacert", str(mtls.pki.one.cert),
                           "--cert", str(mtls.ops_files.cert), "--key", str(mtls.ops_files.key), url],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "queueserver_shard_up" in done.stdout, done.stderr
    refused = subprocess.run([curl, "-sS", "--max-time", "10", "--cacert", str(mtls.pki.one.cert), url],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and refused.stdout == ""   # no certificate: no answer


def test_an_unknown_identity_gets_403_in_one_line(mtls: MTLS) -> None:
    status, _, body = mtls.bob.get("/")
    assert (status, body) == (403, b"Unknown client: not allowed to connect\n")
    wait_for(lambda: "(bob): no identity of" in mtls.proc.log(), 10, "the unknown client's log line")


def test_pages_need_inspect_on_every_queue_and_a_queue_page_on_its_queue(mtls: MTLS) -> None:
    mine, theirs = qname("orders."), qname("billing.")
    mine_id, theirs_id = add_job(mtls.proc, mine), add_job(mtls.proc, theirs)
    for path in ("/", "/workers", "/cluster"):
        status, headers, body = mtls.watcher.get(path)
        assert status == 403 and headers["content-type"].startswith("text/html"), path
        assert b"watcher may not inspect every queue" in body and b"<div class=code>403</div>" in body
    assert mtls.watcher.get("/metrics")[0] == 403
    status, headers, body = mtls.watcher.get("/status")
    assert status == 403 and json.loads(body) == {"error": "Permission denied: watcher may not inspect every queue"}
    status, headers, body = mtls.watcher.get("/api/queues")
    assert status == 403 and json.loads(body)["error"].startswith("Permission denied: watcher")
    assert mtls.watcher.get(f"/queues/{mine}")[0] == 200
    assert mtls.watcher.get(f"/queues/{theirs}")[0] == 403
    assert mtls.watcher.get(f"/jobs/{mine_id}")[0] == 200
    status, _, body = mtls.watcher.get(f"/jobs/{theirs_id}")
    assert status == 403 and b"this job&#x27;s queue" in body and theirs.encode() not in body
    assert mtls.watcher.get(f"/api/job?id={theirs_id}")[0] == 403
    for path in ("/", f"/queues/{theirs}", f"/jobs/{theirs_id}", "/metrics"):
        assert mtls.ops.get(path)[0] == 200, path
    assert mtls.bob.get("/")[0] == 403   # (this test's own: others may run in another worker's server)
    counted = refusals(mtls.ops.get("/metrics"))
    assert counted[("watcher", "inspect")] >= 9, counted
    assert counted[("unknown", "connect")] >= 1, counted


def test_an_action_needs_admin_on_its_queue_and_the_token(mtls: MTLS) -> None:
    orders, billing = qname("orders."), qname("billing.")
    job, other = add_job(mtls.proc, orders), add_job(mtls.proc, billing)
    status, _, body = mtls.alice.act(f"/jobs/{job}/delete")          # the token, but no admin
    assert status == 403 and json.loads(body)["error"] == "Permission denied: alice may not admin this job's queue"
    assert mtls.ops.act(f"/jobs/{job}/delete", token=None)[0] == 403  # admin, but no token
    assert mtls.ops.act(f"/jobs/{other}/delete")[0] == 403            # admin elsewhere only
    assert mtls.ops.get(f"/api/job?id={job}")[0] == 200               # still there
    status, _, body = mtls.ops.act(f"/jobs/{job}/delete")
    assert status == 200 and json.loads(body)["ok"], body
    assert mtls.ops.get(f"/api/job?id={job}")[0] == 404
    assert mtls.alice.act(f"/queues/{orders}/purge", f"confirm={orders}")[0] == 403
    assert mtls.ops.act(f"/queues/{billing}/purge", f"confirm={billing}")[0] == 403
    assert mtls.ops.act(f"/queues/{orders}/purge", f"confirm={orders}")[0] == 200
    counted = refusals(mtls.ops.get("/metrics"))
    assert counted[("alice", "admin")] >= 2 and counted[("ops", "admin")] >= 2, counted


def test_a_silent_client_holds_only_its_own_thread_and_is_closed(mtls: MTLS) -> None:
    silent = socket.create_connection(("127.0.0.1", mtls.proc.ports["metrics"]), timeout=10)
    try:
        started = time.monotonic()
        assert mtls.ops.get("/status")[0] == 200   # served while the silent one waits:
        silent.setblocking(False)
        with pytest.raises(BlockingIOError):        # still open then (not waited out first)
            silent.recv(10)
        silent.settimeout(10)
        assert silent.recv(10) == b""               # closed by the handshake timeout
        assert HANDSHAKE_TIMEOUT * 0.8 <= time.monotonic() - started < HANDSHAKE_TIMEOUT + 5
    finally:
        silent.close()
    wait_for(lambda: "no TLS handshake in" in mtls.proc.log(), 10, "the timeout's log line")


def _browse(browser, mtls: MTLS, client: Issued):   # type: ignore[no-untyped-def]
    """A browser context that presents ``client``'s certificate to the HTTPS port."""
    origin = f"https://127.0.0.1:{mtls.proc.ports['metrics']}"
    context = browser.new_context(viewport={"width": 1280, "height": 900}, ignore_https_errors=True,
                                  client_certificates=[{"origin": origin, "certPath": str(client.cert),
                                                        "keyPath": str(client.key)}])
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    return context, tab, origin


def test_the_console_over_https_in_a_browser(browser, mtls: MTLS) -> None:   # type: ignore[no-untyped-def]
    import re
    queue = qname("orders.")
    job = add_job(mtls.proc, queue)
    context, tab, origin = _browse(browser, mtls, mtls.ops_files)
    try:
        assert tab.goto(origin + "/").status == 200
        assert tab.locator(f'tr[data-queue="{queue}"]').count() == 1
        tab.goto(f"{origin}/jobs/{job}")
        tab.fill("form[action$='/delete'] input[name=token]", TOKEN)
        tab.click("button:has-text('Delete job')")
        tab.wait_for_url(re.compile(r"/queues/.*notice=deleted"))
        assert f"Deleted job {job}" in tab.inner_text(".flash")
        screenshot(tab, "console-https-deleted")
    finally:
        context.close()
    assert mtls.ops.get(f"/api/job?id={job}")[0] == 404
    watcher = mtls.pki.two.dir / "watcher"
    context, tab, origin = _browse(browser, mtls, Issued(watcher.with_suffix(".key"), watcher.with_suffix(".pem")))
    try:
        assert tab.goto(origin + "/").status == 403   # the console's own 403 page
        assert "403" in tab.inner_text(".code") and "watcher may not inspect every queue" in tab.inner_text("main")
        screenshot(tab, "console-https-refused")
        assert tab.goto(f"{origin}/queues/{queue}").status == 200
    finally:
        context.close()


@pytest.fixture
def own_mtls(tmp_path: Path) -> Iterator[MTLS]:
    """A server of its own, for a test that changes its rules (the module's
    may serve other tests after it, in this worker or another)."""
    yield from mtls_server(tmp_path)


def test_sighup_reloads_the_access_file_and_the_client_ca(own_mtls: MTLS) -> None:
    mtls = own_mtls
    assert mtls.watcher.get("/metrics")[0] == 403
    mtls.acl.write_text(MTLS_ACL.replace('inspect = ["orders.*"]', 'inspect = ["*"]'))
    mtls.pki.trust(mtls.pki.one)   # the CA of watcher's certificate is no longer trusted
    mtls.proc.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "HTTP port: access rules reloaded" in mtls.proc.log()
             and "HTTP port: new HTTPS connections use the certificate" in mtls.proc.log(), 10, "the reload")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        mtls.watcher.get("/metrics")   # the new client CA refuses his certificate now
    assert mtls.ops.get("/metrics")[0] == 200   # CA one's still is


# ------------------------------------------------------------ networks
@pytest.fixture(scope="module")
def networks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("networks")
    pki = PKI(home / "pki")
    acl = home / "access.toml"
    acl.write_text(NETWORKS_ACL)
    config = home / "qs.toml"
    config.write_text('[metrics]\nbind = "0.0.0.0"\n')   # beyond loopback, metrics.tls unset
    extra = ["--config", str(config), "--tls-certificate", str(pki.server.cert), "--tls-key", str(pki.server.key),
             "--acl", str(acl)]
    with ServerProcess(shards=1, protocols=["workq"], extra=extra) as proc:
        proc.pki = pki   # type: ignore[attr-defined]
        yield proc


def test_beyond_loopback_with_a_certificate_the_port_speaks_https_by_default(networks: ServerProcess) -> None:
    context = ssl.create_default_context(cafile=str(networks.pki.one.cert))   # type: ignore[attr-defined]
    local, narrow = HTTPS(networks, context, "127.0.0.1"), HTTPS(networks, context, "127.0.0.2")
    status, _, body = local.get("/metrics")   # no client certificate: by its address, local
    assert status == 200 and b"queueserver_shard_up" in body
    assert "metrics on https://0.0.0.0:" in networks.log()
    assert "bound beyond loopback in plain HTTP" not in networks.log()
    queue = qname("orders.")
    add_job(networks, queue)
    assert narrow.get("/metrics")[0] == 403
    assert narrow.get(f"/queues/{queue}")[0] == 200
    assert narrow.get(f"/queues/{qname('billing.')}")[0] == 403
    status, _, body = HTTPS(networks, context, "127.0.0.3").get("/status")
    assert (status, body) == (403, b"Unknown client: not allowed to connect\n")
    curl = shutil.which("curl")
    assert curl is not None
    done = subprocess.run([curl, "-sS", "--fail", "--max-time", "10", "--cacert",
                           str(networks.pki.one.cert),   # type: ignore[attr-defined]
                           f"https://127.0.0.1:{networks.ports['metrics']}/status"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout)["shards"], done.stderr


# --------------------------------------------------------------- plain
def test_plain_http_beyond_loopback_warns_once_at_start(tmp_path: Path) -> None:
    config = tmp_path / "qs.toml"
    config.write_text('[metrics]\nbind = "0.0.0.0"\ntls = false\n')
    with ServerProcess(shards=1, protocols=["workq"], extra=["--config", str(config)]) as proc:
        conn = http.client.HTTPConnection("127.0.0.1", proc.ports["metrics"], timeout=10)
        conn.request("GET", "/status")
        assert conn.getresponse().status == 200
        conn.close()
        assert proc.log().count("bound beyond loopback in plain HTTP") == 1
