"""The console over plain HTTP (no browser) on a real server: status codes of
every route and of bad input, the token and CSRF rules of the actions, an
action on GET (405), an oversized body (413), ``/metrics`` and ``/status``
unchanged, and never a traceback in an error's body.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlencode

import pytest

from queueserver.client import Client

from serverproc import Answer, HttpNode, ServerProcess, wait_for

TOKEN = "tok-" + uuid.uuid4().hex

class Node(HttpNode):
    """The console's port, asked as a browser or a script would."""

    def get(self, path: str, **headers: str) -> Answer:
        return self.request("GET", path, headers=headers)

    def form(self, path: str, fields: Dict[str, str], origin: Optional[str] = "self",
             **headers: str) -> Answer:
        head = {"Content-Type": "application/x-www-form-urlencoded", **headers}
        if origin is not None:
            head["Origin"] = self.origin if origin == "self" else origin
        return self.request("POST", path, urlencode(fields).encode(), head)

    def api(self, path: str, fields: Optional[Dict[str, str]] = None, token: str = TOKEN) -> Answer:
        return self.request("POST", path, urlencode(fields or {}).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded", "X-Queueserver-Token": token})

    def csrf(self, path: str) -> str:
        status, _, body = self.get(path)
        assert status == 200
        match = re.search(rb'name="csrf" value="([^"]+)"', body)
        assert match, body[:500]
        return match.group(1).decode()

    def add(self, queue: str, count: int) -> List[str]:
        ids = [str(uuid.uuid4()) for _ in range(count)]
        with Client(self.host, self.proc.port("workq")) as client:
            pipe = client.pipeline()
            for id in ids:
                pipe.add(id, queue, b"payload", 60_000, 3_600_000)
            assert pipe.execute() == [None] * count
        return ids

    def exists(self, id: str) -> bool:
        status = self.get(f"/api/job?id={id}")[0]
        assert status in (200, 404)
        return status == 200


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    home = tmp_path_factory.mktemp("console-http")
    (home / "tokens").write_text(f"ops {TOKEN}\n")
    (home / "qs.toml").write_text(f'[console]\ntoken_file = "{home / "tokens"}"\n')
    with ServerProcess(shards=2, protocols=["workq"], extra=["--config", str(home / "qs.toml")]) as proc:
        yield Node(proc)


def no_traceback(answer: Answer) -> Answer:
    status, headers, body = answer
    assert body, f"an empty {status}"
    assert b"Traceback" not in body and b'File "' not in body, body[:800]
    return answer


# ------------------------------------------------------------ the pages
def test_metrics_and_status_are_unchanged(node):
    status, headers, body = node.get("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain") and b"# HELP" in body
    status, headers, body = node.get("/status")
    assert status == 200 and headers["content-type"] == "application/json" and json.loads(body)


def test_pages_answer_with_their_security_headers(node):
    node.add("http-pages", 3)
    for path in ("/", "/queues/http-pages", "/queues/http-pages?state=finished", "/cluster", "/search?q=http"):
        status, headers, body = node.get(path)
        assert status == 200, (path, body[:300])
        assert headers["content-type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and body.startswith(b"<!doctype html>")
    status, headers, body = node.get("/static/console.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript") and b"/api/queues" not in body[:0]
    status, headers, body = node.request("HEAD", "/")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_the_json_api(node):
    ids = node.add("http-api", 2)
    wait_for(lambda: any(r["name"] == "http-api" for r in json.loads(node.get("/api/queues")[2])["queues"]),
             10, "http-api on /api/queues")
    row = next(r for r in json.loads(node.get("/api/queues")[2])["queues"] if r["name"] == "http-api")
    assert row["ready"] == 2
    status, headers, body = node.get(f"/api/job?id={ids[0]}")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body)["job"]["id"] == ids[0]
    status, _, body = node.get(f"/api/job?id={ids[0]}&scope=node")   # what other nodes ask
    assert status == 200 and json.loads(body)["job"]["queue"] == "http-api"
    status, _, body = no_traceback(node.get(f"/api/job?id={uuid.uuid4()}"))
    assert status == 404 and "error" in json.loads(body)
    status, _, body = no_traceback(node.get("/api/job?id=nonsense"))
    assert status == 400 and "error" in json.loads(body)
    status, _, body = node.get("/api/queues/http-api/rates")
    assert status == 200 and isinstance(json.loads(body)["rates"], list)
    status, headers, body = node.get("/api/queues?format=html")
    assert status == 200 and b"http-api" in body and headers["content-type"].startswith("text/html")


# ------------------------------------------------------------ bad input
@pytest.mark.parametrize("path, status", [
    ("/no/such/page", 404),
    ("/queues/no-such-queue", 404),
    ("/jobs/not-an-id", 400),
    ("/jobs/" + "9" * 40, 400),
    ("/jobs/00000000-0000-4000-8000-00000000dead", 404),   # well-formed, not there
    ("/queues/http-bad?state=lost", 400),
    ("/queues/http-bad?page=abc", 400),
    ("/queues/http-bad?page=0", 400),
    ("/queues/http-bad?page=999999999", 400),
    ("/queues/%ff%fe", 404),
    ("/history/report", 404),
    ("/search?" + "&".join(f"f{i}=1" for i in range(300)), 400),   # past MAX_FIELDS (a page of picked jobs and more)
])
def test_bad_input_is_a_page_with_a_status(node, path, status):
    node.add("http-bad", 1)
    got, headers, body = no_traceback(node.get(path))
    assert got == status, (path, body[:400])
    assert headers["content-type"] == "text/html; charset=utf-8"


ODD = ["/queues/%00", "/queues/" + "a" * 1000, "/search?q=" + "x" * 1000, "/jobs/-1", "/api/job", "/api/job?id=",
       "/%", "/%zz", "/queues/a%2Fb", "//", "/queues//", "/static/../../etc/passwd", "/jobs/1?page=x",
       "/queues/q?per_page=-5", "/queues/q?per_page=1e9", "/api/queues/%20/rates", "/search?q=%00",
       "/search?q=%ff", "/jobs/%F0%9F%92%A5", "/queues/%E2%80%AE", "/cluster?x=" + "%" * 50, "/?q=a&q=b"]


@pytest.mark.parametrize("path", ODD)
def test_odd_requests_are_answered_without_a_500(node, path):
    status, _, body = no_traceback(node.get(path))
    assert status in (200, 303, 400, 404), (path, status, body[:300])


def test_a_million_jobs_a_page_is_capped(node):
    node.add("http-many", 130)
    status, _, body = node.get("/queues/http-many?per_page=1000000")
    assert status == 200
    assert body.count(b"<td class=id") == 100
    assert b"At most 100 jobs a page" in body


# ------------------------------------------------------------ actions
def test_an_action_on_get_is_405(node):
    id = node.add("http-get", 1)[0]
    for path in (f"/jobs/{id}/delete", f"/jobs/{id}/requeue", "/queues/http-get/purge"):
        status, headers, body = no_traceback(node.get(path))
        assert status == 405 and headers["allow"] == "POST", path
    assert node.exists(id)


def test_delete_with_the_header_token(node):
    id = node.add("http-delete", 1)[0]
    status, _, body = no_traceback(node.api(f"/jobs/{id}/delete", token="wrong"))
    assert status == 403 and "error" in json.loads(body)
    assert node.exists(id)
    status, headers, body = node.api(f"/jobs/{id}/delete")
    assert status == 200 and headers["content-type"] == "application/json"
    result = json.loads(body)
    assert result["ok"] is True and result["count"] == 1
    assert not node.exists(id)
    status, _, body = no_traceback(node.api(f"/jobs/{id}/delete"))
    assert status == 404


def test_a_form_post_needs_the_token_csrf_and_same_origin(node):
    id = node.add("http-form", 1)[0]
    csrf = node.csrf(f"/jobs/{id}")
    path = f"/jobs/{id}/delete"
    refusals = [
        ({"token": TOKEN}, "self"),                                   # no CSRF field
        ({"token": TOKEN, "csrf": "1.deadbeef"}, "self"),             # a forged one
        ({"token": TOKEN, "csrf": csrf}, "http://evil.example"),      # another site's form
        ({"token": TOKEN, "csrf": csrf}, None),                       # no Origin, no Referer
        ({"token": "wrong", "csrf": csrf}, "self"),                   # a wrong token
        ({"csrf": csrf}, "self"),                                     # no token
    ]
    for fields, origin in refusals:
        status, headers, body = no_traceback(node.form(path, fields, origin))
        assert status == 403, (fields, origin, body[:300])
        # a browser's post (it says where it comes from) gets a page; a script's, JSON
        assert headers["content-type"] == ("text/html; charset=utf-8" if origin else "application/json")
        assert node.exists(id)
    status, headers, _ = node.form(path, {"token": TOKEN, "csrf": csrf, "queue": "http-form"}, origin=None,
                                   Referer=f"{node.origin}/jobs/{id}")
    assert status == 303 and headers["location"].startswith("/queues/http-form?notice=deleted")
    assert not node.exists(id)


def test_requeue_a_leased_job(node):
    id = node.add("http-requeue", 1)[0]
    with Client(node.host, node.proc.port("workq")) as client:
        assert client.lease("http-requeue", wait_timeout=5000).id == id
        assert json.loads(node.get(f"/api/job?id={id}")[2])["job"]["state"] == "leased"
        status, _, body = node.api(f"/jobs/{id}/requeue")
        assert status == 200 and json.loads(body)["ok"] is True, body
    assert json.loads(node.get(f"/api/job?id={id}")[2])["job"]["state"] == "ready"


def test_requeue_a_failed_job_and_not_a_ready_one(node):
    id = str(uuid.uuid4())
    with Client(node.host, node.proc.port("workq")) as client:
        client.add(id, "http-failed", b"payload", 60_000, 3_600_000, max_attempts=1)
        assert client.lease("http-failed", wait_timeout=5000).id == id
        client.fail(id, b"boom")
    job = json.loads(node.get(f"/api/job?id={id}")[2])
    assert job["job"]["state"] == "finished" and job["extra"]["outcome"] == "failed", job
    status, _, body = node.get(f"/jobs/{id}")
    assert b"/requeue" in body
    status, _, body = node.api(f"/jobs/{id}/requeue")
    assert status == 200 and json.loads(body)["ok"] is True, body
    assert json.loads(node.get(f"/api/job?id={id}")[2])["job"]["state"] == "ready"
    status, _, body = no_traceback(node.api(f"/jobs/{id}/requeue"))   # ready: nothing to requeue
    assert status == 400 and "error" in json.loads(body)


def test_purge_needs_its_confirmation(node):
    node.add("http-purge", 5)
    status, _, body = no_traceback(node.api("/queues/http-purge/purge"))
    assert status == 400 and "confirm" in json.loads(body)["error"]
    csrf = node.csrf("/queues/http-purge")
    status, _, body = node.form("/queues/http-purge/purge", {"csrf": csrf})   # step one: the question
    assert status == 200 and b"Purge http-purge?" in body and b'name=confirm' in body
    status, _, body = node.form("/queues/http-purge/purge", {"csrf": csrf, "token": TOKEN, "confirm": "http"})
    assert status == 400 and b"does not match" in body
    assert json.loads(node.get("/api/queues")[2])["queues"]
    status, _, body = node.api("/queues/http-purge/purge", {"confirm": "http-purge"})
    assert status == 200 and json.loads(body)["count"] == 5, body
    status, _, body = no_traceback(node.api("/queues/no-such-queue/purge", {"confirm": "no-such-queue"}))
    assert status == 404


def test_an_oversized_body_is_413(node):
    status, headers, body = no_traceback(node.request(
        "POST", "/jobs/1/delete", b"token=" + b"x" * (100 * 1024),
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": node.origin}))
    assert status == 413
    status, _, _ = node.get("/")   # the server still serves
    assert status == 200


def test_a_malformed_body_is_a_clear_error(node):
    status, _, body = no_traceback(node.request("POST", "/jobs/1/delete", b"{not json",
                                                {"Content-Type": "application/json",
                                                 "X-Queueserver-Token": TOKEN}))
    assert status == 400 and "JSON" in json.loads(body)["error"]
    status, _, body = no_traceback(node.request("POST", "/jobs/1/delete", b"\xff\xfe=\xff",
                                                {"Content-Type": "application/x-www-form-urlencoded",
                                                 "Origin": node.origin}))
    assert status == 400


# ------------------------------------------------- a missing token, hang-ups
def test_a_post_without_a_token_is_told_the_token_is_missing(node):
    id = node.add("http-no-token", 1)[0]
    # as `curl -X POST` sends it: no token, no body, no Origin: a script, answered in JSON
    status, headers, body = no_traceback(node.request("POST", f"/jobs/{id}/delete", headers={"Accept": "*/*"}))
    assert status == 403 and headers["content-type"] == "application/json", body[:300]
    error = json.loads(body)["error"]
    assert error.startswith("Token missing") and "X-Queueserver-Token" in error and "Origin" not in error
    status, _, body = no_traceback(node.request("POST", "/queues/http-no-token/purge", b"confirm=http-no-token",
                                                {"Content-Type": "application/x-www-form-urlencoded"}))
    assert status == 403 and json.loads(body)["error"].startswith("Token missing")
    # a browser's form with no token (from our own page): a page that says so
    csrf = node.csrf(f"/jobs/{id}")
    status, headers, body = no_traceback(node.form(f"/jobs/{id}/delete", {"csrf": csrf}))
    assert status == 403 and headers["content-type"] == "text/html; charset=utf-8"
    assert b"Token missing" in body and b"Origin" not in body
    assert node.exists(id)


def test_a_client_that_hangs_up_is_one_quiet_line_not_a_traceback(node):
    """A browser that leaves a page mid-request or mid-answer resets its
    connection: the server goes on, and its log shows no traceback."""
    import socket
    import struct
    import time
    node.add("http-hangup", 3)
    before = len(node.proc.log())

    def reset(sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    half = socket.create_connection((node.host, node.port), timeout=5)   # mid-request
    half.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.2)
    reset(half)
    reader = socket.create_connection((node.host, node.port), timeout=5)   # mid-answer: answers pile up unread
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    reader.sendall(b"GET /queues/http-hangup HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
    time.sleep(0.5)
    reset(reader)
    wait_for(lambda: node.get("/")[0] == 200, 10, "the console to answer again")
    time.sleep(0.3)
    log = node.proc.log()[before:]
    assert "Traceback" not in log and "ConnectionResetError" not in log and "BrokenPipeError" not in log, log
