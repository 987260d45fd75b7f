"""The node's HTTP port: ``GET /metrics`` (Prometheus), ``GET /status``
(JSON) and the web console on every other path.

It runs in the supervisor, which has no event loop, so it is the standard
library's :class:`http.server.ThreadingHTTPServer` in one daemon thread
(each request gets a thread of its own). That is the server
``prometheus_client.start_http_server`` uses too; we do not call that
helper because it binds at once and serves the registry on every path,
while we need the port bound before the children start (so that a port in
use is the same one-line start-up error as a protocol's port) and need
``/status`` beside ``/metrics``. A request thread asks the shards and
routers (blocking sockets, :data:`~queueserver.metrics.control.ASK_TIMEOUT`
at most) and formats the answer with ``prometheus_client``'s own encoder,
in the text format or OpenMetrics as the scraper's ``Accept`` asks.

Every other path (GET, HEAD and POST) is the web console's
(:class:`~queueserver.console.app.ConsoleApp`, over a
:class:`~queueserver.console.source.ConsoleSource` started and closed with
this server). A POST body is read only up to :data:`MAX_BODY` bytes (a
longer one is a 413, and the connection is closed unread). A client that
hangs up mid-request (a browser leaving a page, a reset) is logged at DEBUG
in one line, never as a traceback.
"""
from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Optional, Tuple
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ..config import Config
from ..metrics.collect import NodeCollector, NodeView
from .app import ConsoleApp, Response
from .source import ConsoleSource

log = logging.getLogger("queueserver.metrics")

#: Most bytes of a request body (a console form post); more is a 413.
MAX_BODY = 64 * 1024
#: A too-long body up to this size is read (and dropped) before the 413, so a
#: client still sending it reads the answer rather than a reset connection.
DRAIN_BODY = 16 * MAX_BODY


#: What a client that hangs up makes reads and writes raise (reset, broken pipe, a read timed out).
_HANGUPS = (ConnectionError, TimeoutError)


def _address(client: object) -> str:
    if isinstance(client, tuple) and len(client) >= 2:
        return f"{client[0]}:{client[1]}"
    return str(client)


class _Server(ThreadingHTTPServer):
    daemon_threads = True        # a slow scraper never holds the supervisor's exit
    allow_reuse_address = True   # as the protocol ports (SO_REUSEADDR)
    request_queue_size = 64

    def __init__(self, address: Tuple[str, int], family: int, node: "NodeMetrics") -> None:
        self.address_family = family
        self.node = node
        super().__init__(address, _Handler, bind_and_activate=True)

    def handle_error(self, request: object, client_address: object) -> None:
        """A request that failed outside our handler: a client that hung up
        (a browser leaving a page mid-answer, a reset) is routine and logged
        at DEBUG in one line; anything else is a bug, logged with its
        traceback (the standard library would print it to stderr)."""
        error = sys.exc_info()[1]
        if isinstance(error, _HANGUPS):
            log.debug("HTTP client %s went away: %s", _address(client_address), error)
        else:
            log.exception("serving an HTTP request from %s failed", _address(client_address))

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up (getfqdn): not needed, and slow offline.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    server_version = "queueserver"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:   # noqa: N802 (http.server's naming)
        self._serve("GET")

    def do_HEAD(self) -> None:   # noqa: N802
        self._serve("HEAD")

    def do_POST(self) -> None:   # noqa: N802
        self._serve("POST")

    def _serve(self, method: str) -> None:
        assert isinstance(self.server, _Server)   # the only server it is given to
        node = self.server.node
        path = urlsplit(self.path).path
        try:
            if path == "/metrics" and method != "POST":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, content_type, encoder(node.registry), head=method == "HEAD")
            elif path == "/status" and method != "POST":
                body = json.dumps(node.view.gather(), indent=2, sort_keys=True) + "\n"
                self._send(200, "application/json", body.encode(), head=method == "HEAD")
            elif node.console is None:
                self._send(404, "text/plain; charset=utf-8",
                           b"not found: try /metrics (Prometheus) or /status (JSON)\n")
            else:
                self._console(node.console, method)
        except _HANGUPS as err:   # the client went away: nobody is left to answer
            self.close_connection = True
            log.debug("HTTP client %s went away during %s %s: %s", _address(self.client_address), method,
                      path[:200], err)
        except Exception:   # a bug must cost this request only
            log.exception("serving %s failed", path)
            try:
                self._send(500, "text/plain; charset=utf-8", b"internal error\n")
            except _HANGUPS:
                self.close_connection = True

    def _console(self, console: ConsoleApp, method: str) -> None:
        body = b""
        if method == "POST":
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self.close_connection = True
                self._answer(console.error(411, "Send the form with a Content-Length."))
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self.close_connection = True   # this connection is done after the answer
                answer = (console.error(413, f"A request body is at most {MAX_BODY // 1024} KiB.")
                          if length > 0 else console.error(400, "Bad Content-Length."))
                left = length if length <= DRAIN_BODY else 0
                while left > 0:   # read and dropped, so that the client still sending it reads the answer
                    chunk = self.rfile.read(min(left, 65536))
                    left = left - len(chunk) if chunk else 0
                self._answer(answer)
                return
            body = self.rfile.read(length)
        headers = {k: v for k, v in self.headers.items()}
        self._answer(console.handle(method, self.path, headers, body, self.client_address[0]),
                     head=method == "HEAD")

    def _answer(self, response: Response, head: bool = False) -> None:
        self.send_response(response.status)
        for name, value in response.all_headers():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(response.body)

    def _send(self, status: int, content_type: str, body: bytes, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:   # noqa: A002 (http.server's signature)
        log.debug("%s %s", self.address_string(), format % args)


class NodeMetrics:
    """The supervisor's metrics port: :meth:`bind` (before the children start;
    OSError if the port cannot be had), :meth:`start`, :meth:`stop`."""

    def __init__(self, host: str, port: int, node: Optional[str], shards: Dict[int, str],
                 routers: Dict[int, str]) -> None:
        self.host = host
        self.requested_port = port
        self.view = NodeView(node, shards, routers)
        self.registry = CollectorRegistry(auto_describe=False)   # our own: no global state
        self.registry.register(NodeCollector(self.view))
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self.source: Optional[ConsoleSource] = None   # the console's (None: /metrics and /status only)
        self.console: Optional[ConsoleApp] = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not bound"
        return self._server.server_port

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._server = _Server((self.host, self.requested_port), family, self)

    def start(self) -> None:
        assert self._server is not None, "bind first"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="metrics-http", daemon=True)
        if self.source is not None:
            self.source.start()
        self._thread.start()
        host = self.host if ":" not in self.host else f"[{self.host}]"
        log.info("metrics on http://%s:%d/metrics (and /status)", host, self.port)
        if self.console is not None:
            log.info("console on http://%s:%d/", host, self.port)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None:
            server.shutdown()          # ends serve_forever (within its poll interval)
            self._thread.join(5.0)
            self._thread = None
        server.server_close()
        if self.source is not None:
            self.source.close()


def node_metrics(config: Config, runtime_file: Callable[[str], str]) -> NodeMetrics:
    """The bound (not yet serving) metrics port of a node run with ``config``;
    ``runtime_file(name)``: a path in its runtime directory. OSError if the
    port cannot be had."""
    metrics = config.metrics
    shards = {i: runtime_file(f"shard-{i}.ctl") for i in range(config.shards)}
    routers = {i: runtime_file(f"router-{i}.ctl") for i in range(config.routers)}
    node = NodeMetrics(metrics.bind or config.bind, metrics.port, config.node, shards, routers)
    node.bind()
    node.source = ConsoleSource(config, runtime_file)
    node.console = ConsoleApp(node.source, config.node or socket.gethostname())
    return node
