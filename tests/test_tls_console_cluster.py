"""A cluster's consoles ask each other over HTTPS when their HTTP ports
speak it, through three real nodes (127.0.0.1-3, ``--metrics-tls``, an
access file on each):

* nodes a and b hold certificates of the cluster's CA (their cluster-file
  host as an IP alternative name, usable as server and client), and their
  client CA file is that CA; node c's certificate is of another CA;
* the access file gives inspect on every queue to the nodes' certificate
  names only (a plain address gets produce), so a question answered proves
  that the asking node presented its certificate and was resolved by it;
* a job on node b is found from node a's console (``/api/job?id=``), and
  a's cluster page shows b up, but c, whose certificate a's client CA does
  not trust, down, with one log line saying why; from c's console (which
  trusts the cluster's CA), b is down too: b refuses c's certificate.
"""
from __future__ import annotations

import http.client
import json
import re
import ssl
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from cluster_nodes import HOSTS, Nodes, free_ports
from serverproc import wait_for
from tls_certs import CA, Issued
from wire import Wire, add, new_id

ACL = """
[identities.node-a]
certificates = ["node-a"]
inspect = ["*"]

[identities.node-b]
certificates = ["node-b"]
inspect = ["*"]

[identities.node-c]
certificates = ["node-c"]
inspect = ["*"]

[identities.ops]
certificates = ["ops"]
inspect = ["*"]

[identities.local]
networks = ["127.0.0.0/8"]
produce = ["*"]
"""


class HTTPSNodes(Nodes):
    """Nodes whose HTTP ports speak HTTPS: asked as ``ops``, a client certificate of the cluster's CA."""

    context: ssl.SSLContext

    def get(self, name: str, path: str) -> Tuple[int, bytes]:
        conn = http.client.HTTPSConnection(self.host[name], self.procs[name].ports["metrics"],
                                           context=self.context, timeout=15)
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def node_status(self, name: str) -> Dict:
        status, body = self.get(name, "/status")
        assert status == 200, body
        return json.loads(body)


def nodes_up(page: bytes) -> Dict[str, str]:
    """A cluster page's nodes: name -> "up" or "down"."""
    return dict(re.findall(r'<h2>([a-z]) <span class=badge[^>]*>(up|down)</span>', page.decode()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPSNodes]:
    root = tmp_path_factory.mktemp("https-cluster")
    ours, rogue = CA(root, "cluster-ca"), CA(root, "rogue-ca")
    certs: Dict[str, Issued] = {name: (rogue if name == "c" else ours).issue(
        f"node-{name}", server=True, sans=f"IP:{HOSTS[i]}", client_too=True) for i, name in enumerate("abc")}
    both = root / "both-cas.pem"
    both.write_text(ours.cert.read_text() + rogue.cert.read_text())
    acl = root / "access.toml"
    acl.write_text(ACL)
    nodes = HTTPSNodes(root, shards=(1, 1, 1), protocols=["workq"],
                       extra=["--metrics-tls", "--acl", str(acl), "--tls-handshake-timeout", "2"])
    text = nodes.file.read_text()
    for name in nodes.names:   # each node's HTTP port, where the others ask it
        port = free_ports(nodes.host[name], 1)
        text = text.replace(f'name = "{name}"\n', f'name = "{name}"\nmetrics_port = {port}\n')
        nodes.node_extra[name] = ["--metrics-port", str(port), "--tls-certificate", str(certs[name].cert),
                                  "--tls-key", str(certs[name].key),
                                  # a and b trust the cluster's CA only; c trusts both (so it asks b)
                                  "--tls-client-ca", str(both if name == "c" else ours.cert)]
    nodes.file.write_text(text)
    ops = ours.issue("ops")
    nodes.context = ssl.create_default_context(cafile=str(both))
    nodes.context.load_cert_chain(str(ops.cert), str(ops.key))
    with nodes:
        nodes.start()
        yield nodes


def test_a_job_on_node_b_is_found_from_node_a_console_over_https(cluster: HTTPSNodes) -> None:
    import socket
    w = Wire(socket.create_connection(cluster.address("b"), timeout=15))
    try:
        ids = [new_id() for _ in range(12)]
        for i, id in enumerate(ids):
            assert w.call(add(id, f"https-{i}")) == b"+OK\r\n"
    finally:
        w.close()
    where = {}
    for id in ids:   # slots are spread over the three nodes: some jobs are on b, some on c
        status, body = cluster.get("b", f"/api/job?id={id}&scope=node")
        if status == 200:
            where[id] = "b"
    assert where, "no job landed on node b's shard"
    for id in where:
        status, body = cluster.get("a", f"/api/job?id={id}")
        assert status == 200, body
        detail = json.loads(body)
        assert detail["node"] == "b" and detail["job"]["id"] == id


def test_the_cluster_page_shows_b_up_and_an_untrusted_node_down(cluster: HTTPSNodes) -> None:
    status, page = cluster.get("a", "/cluster")
    assert status == 200
    assert nodes_up(page) == {"a": "up", "b": "up", "c": "down"}
    wait_for(lambda: "console: node c did not answer https://127.0.0.3:" in cluster.procs["a"].log()
             and "its certificate is refused: " in cluster.procs["a"].log(),
             10, lambda: "node a's line about node c's certificate:\n" + cluster.procs["a"].log()[-3000:])
    # c trusts the cluster's CA, but b does not trust c's certificate: c's handshake with b is refused
    status, page = cluster.get("c", "/cluster")
    assert status == 200, page[-3000:] + cluster.procs["c"].log()[-5000:].encode()
    assert nodes_up(page)["b"] == "down", nodes_up(page)
    wait_for(lambda: "console: node b did not answer https://127.0.0.2:" in cluster.procs["c"].log(),
             10, "node c's line about node b")
    assert "TLS handshake failed" in cluster.procs["b"].log()   # b's side: c's certificate refused
