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

**HTTPS.** With a TLS context (:meth:`NodeMetrics.use_tls`: the ``[tls]``
files, made by :func:`~queueserver.net.tls.server_context` as the client
ports' is), each accepted connection's handshake runs in its request's own
thread under the handshake timeout, never in the accept loop: a slow or
half-open client holds its thread only, and is closed when the timeout
passes. A plain HTTP request is answered, in plain HTTP, with a 400 saying
the port speaks HTTPS; a failed handshake is closed. Each is one log line,
a burst per kind and interval at most (:class:`~queueserver.net.refusals.RefusalLog`).
SIGHUP makes a new context for new connections (:meth:`NodeMetrics.reload`), and
the console's for asking the other nodes (:mod:`.peers`).

**Identities.** With an access file (:meth:`NodeMetrics.use_access`), a
connection is resolved to an identity when its thread starts (its
certificate's names, then its address: :mod:`.access`); an unknown one is
answered 403 with one line and closed. ``/metrics`` and ``/status`` need
``inspect`` on every queue; the console checks its own pages and actions.
"""
from __future__ import annotations

import json
import logging
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Optional, Tuple
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ..access import AccessError, Permissions
from ..config import Config
from ..engine.ops import INSPECT
from ..metrics.collect import NodeCollector, NodeView
from ..net.refusals import RefusalLog
from ..net.tls import (TLSConfigError, TLSFiles, TLSServing, certificate_names, looks_like_tls, server_context,
                       ssl_reason)
from .access import EVERY_QUEUE, UNKNOWN_CLIENT, HTTPAccess, Refused, require
from .app import ConsoleApp, Response
from .peers import https_files
from .source import ConsoleSource

log = logging.getLogger("queueserver.metrics")

#: Most bytes of a request body (a console form post); more is a 413.
MAX_BODY = 64 * 1024
#: A too-long body up to this size is read (and dropped) before the 413, so a
#: client still sending it reads the answer rather than a reset connection.
DRAIN_BODY = 16 * MAX_BODY


#: What a client that hangs up makes reads and writes raise (reset, broken pipe, a read timed out).
_HANGUPS = (ConnectionError, TimeoutError)
#: The answer to a plain HTTP request on the HTTPS port (in plain HTTP, which its client reads).
_HTTPS_ONLY = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n%s")
#: Refusals of clients that fail TLS on the HTTP port: one line each, a burst per kind and interval.
refusals = RefusalLog(log)


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

    def finish_request(self, request: socket.socket, client_address: object) -> None:   # type: ignore[override]
        """In the request's own thread: the TLS handshake first, if the port
        speaks HTTPS (a client that fails it is closed here), then the requests."""
        serving = self.node.tls
        if serving is None:
            super().finish_request(request, client_address)
            return
        secure = _handshake(request, _address(client_address), serving)
        if secure is None:
            return
        try:
            super().finish_request(secure, client_address)
        finally:
            secure.close()   # the SSL socket owns the descriptor now (the server closes only the raw one)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up (getfqdn): not needed, and slow offline.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


def _handshake(raw: socket.socket, client: str, serving: TLSServing) -> Optional[ssl.SSLSocket]:
    """``raw`` with its TLS handshake done (None: it failed or timed out,
    ``raw`` is closed). Every read waits ``handshake_timeout`` at most."""
    raw.settimeout(serving.handshake_timeout)
    try:
        first = raw.recv(len(b"\x16\x03"), socket.MSG_PEEK)
        if not first:   # connected and went: nothing to refuse
            raw.close()
            return None
        if not looks_like_tls(first):
            _refuse_plain(raw, client)
            return None
        secure = serving.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
    except (TimeoutError, socket.timeout):
        refusals.note("tls-timeout", f"HTTP client {client}: no TLS handshake in {serving.handshake_timeout:g} s: "
                                     f"closed")
        raw.close()
        return None
    except OSError as err:
        log.debug("HTTP client %s went away before its TLS handshake: %s", client, err)
        raw.close()
        return None
    try:
        secure.do_handshake()
    except (TimeoutError, socket.timeout):
        refusals.note("tls-timeout", f"HTTP client {client}: TLS handshake not done in "
                                     f"{serving.handshake_timeout:g} s: closed")
        secure.close()
        return None
    except ssl.SSLError as err:
        refusals.note("tls-handshake", f"HTTP client {client}: TLS handshake failed: {ssl_reason(err)}")
        secure.close()
        return None
    except OSError as err:
        log.debug("HTTP client %s went away during its TLS handshake: %s", client, err)
        secure.close()
        return None
    secure.settimeout(None)   # as a plain connection's requests: no timeout once it speaks
    return secure


def _refuse_plain(raw: socket.socket, client: str) -> None:
    """A plain HTTP request on the HTTPS port: answered in plain HTTP (a 400
    naming the scheme to use), then closed, with one log line."""
    refusals.note("plain-on-tls", f"HTTP client {client}: plain HTTP on the HTTPS port: answered 400")
    try:
        raw.recv(65536)   # the request, read so that closing does not reset the answer away
        body = b"This port speaks HTTPS: ask for https:// rather than http://\n"
        raw.sendall(_HTTPS_ONLY % (len(body), body))
        raw.shutdown(socket.SHUT_WR)
    except OSError as err:
        log.debug("HTTP client %s went away: %s", client, err)
    finally:
        raw.close()


class _Handler(BaseHTTPRequestHandler):
    server_version = "queueserver"
    protocol_version = "HTTP/1.1"
    #: what this connection's identity may do (None: no access file); set in :meth:`setup`
    permissions: Optional[Permissions] = None
    unknown = False   # an access file names no identity of this client

    def setup(self) -> None:
        super().setup()
        assert isinstance(self.server, _Server)
        access = self.server.node.access
        if access is not None:
            names: Tuple[str, ...] = ()
            if isinstance(self.request, ssl.SSLSocket):
                names = certificate_names(self.request.getpeercert())
            self.permissions = access.admit(names, str(self.client_address[0]))
            self.unknown = self.permissions is None

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
            if self.unknown:
                self.close_connection = True
                self._send(403, "text/plain; charset=utf-8", UNKNOWN_CLIENT.encode() + b"\n", head=method == "HEAD")
            elif path in ("/metrics", "/status") and method != "POST" and \
                    not self._may_read(path, method):
                pass   # answered 403
            elif path == "/metrics" and method != "POST":
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
        self._answer(console.handle(method, self.path, headers, body, self.client_address[0], self.permissions),
                     head=method == "HEAD")

    def _may_read(self, path: str, method: str) -> bool:
        """``/metrics`` and ``/status`` need ``inspect`` on every queue; else a 403 is sent."""
        try:
            require(self.permissions, INSPECT, EVERY_QUEUE, f"{method} {path}", _address(self.client_address))
        except Refused as refused:
            if path == "/status":
                self._send(403, "application/json", json.dumps({"error": refused.message}).encode() + b"\n",
                           head=method == "HEAD")
            else:
                self._send(403, "text/plain; charset=utf-8", refused.message.encode() + b"\n",
                           head=method == "HEAD")
            return False
        return True

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
        if self.close_connection:
            self.send_header("Connection", "close")
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
        #: the HTTPS context new connections get (None: plain HTTP); replaced on reload
        self.tls: Optional[TLSServing] = None
        self.tls_files: Optional[TLSFiles] = None
        #: the access rules (None: no access file, every client may do everything)
        self.access: Optional[HTTPAccess] = None
        self.beyond_loopback = False

    def use_tls(self, files: TLSFiles, handshake_timeout: float) -> None:
        """Speak HTTPS with ``files`` (:class:`~queueserver.net.tls.TLSConfigError` if they cannot be used)."""
        self.tls_files = files
        self.tls = TLSServing(server_context(files), handshake_timeout)

    def use_access(self, path: str) -> None:
        """Resolve clients to the identities of the access file at ``path``
        (:class:`~queueserver.access.AccessError` if it cannot be used)."""
        self.access = HTTPAccess(path)

    def reload(self) -> None:
        """SIGHUP: read the TLS files (new connections get the new context;
        open ones keep theirs) and the access file again; one that cannot be
        used leaves what is in use as it is, with one line saying so."""
        if self.tls is not None and self.tls_files is not None:
            try:
                self.tls = self.tls._replace(context=server_context(self.tls_files))
            except TLSConfigError as err:
                log.error("HTTP port: keeping the TLS certificate in use: %s", err)
            else:
                log.info("HTTP port: new HTTPS connections use the certificate %s read again",
                         self.tls_files.certificate)
            if self.source is not None:
                self.source.peers.reload()   # the client certificate this node asks the others with
        if self.access is not None:
            try:
                self.access.reload()
            except AccessError as err:
                log.error("HTTP port: the access rules stay as they were: %s", err)
            else:
                log.info("HTTP port: access rules reloaded from %s", self.access.path)

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
        scheme = "https" if self.tls is not None else "http"
        log.info("metrics on %s://%s:%d/metrics (and /status)", scheme, host, self.port)
        if self.console is not None:
            log.info("console on %s://%s:%d/", scheme, host, self.port)
        if self.beyond_loopback and self.tls is None:
            log.warning("the HTTP port %s:%d is bound beyond loopback in plain HTTP: anyone on the network "
                        "can read its metrics and pages, and console tokens cross the network readable "
                        "(metrics.tls = true, with the [tls] certificate, makes it HTTPS)", host, self.port)

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
    port cannot be had; :class:`~queueserver.net.tls.TLSConfigError` or
    :class:`~queueserver.access.AccessError` if its files cannot be used."""
    metrics = config.metrics
    shards = {i: runtime_file(f"shard-{i}.ctl") for i in range(config.shards)}
    routers = {i: runtime_file(f"router-{i}.ctl") for i in range(config.routers)}
    node = NodeMetrics(config.metrics_bind, metrics.port, config.node, shards, routers)
    node.beyond_loopback = config.metrics_beyond_loopback()
    files = https_files(config)
    if files is not None:
        node.use_tls(files, config.tls_handshake_timeout)
    access = config.access_file()
    if access is not None:
        node.use_access(access)
    node.bind()
    node.source = ConsoleSource(config, runtime_file)
    node.console = ConsoleApp(node.source, config.node or socket.gethostname())
    return node
