"""How this node's console asks the other nodes' consoles: a job held by
another node (``/api/job?id=...&scope=node``) and the cluster page (each
node's ``/status``).

A cluster's HTTP ports speak alike, so when this node's speaks HTTPS
(:func:`https_files`, the rule the port itself follows) the others are
asked over ``https://`` too, with one client context
(:func:`~queueserver.net.tls.client_context`): this node's ``[tls]``
certificate as its client certificate, so that the other node resolves it
to an identity like any client (it needs ``inspect`` on ``*``), and the
other node's certificate checked against the ``[tls]`` client CA file,
its host name included (the cluster file's ``host``, a DNS or IP
alternative name of the certificate). The context is made once and made
again on SIGHUP with the HTTP port's (:meth:`PeerConsoles.reload`).

A node that cannot be asked (down, a certificate refused either way, a
handshake or an answer not in time, a 403) is "not answering" to the
caller, an :class:`~.errors.Unavailable` (or the node's own error status),
and one log line, a burst per kind and interval at most
(:class:`~queueserver.net.refusals.RefusalLog`): a console page refreshed
every few seconds must not fill the log.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import ssl
import threading
import urllib.error
import urllib.request
from typing import Any, Optional, Tuple

from ..config import DEFAULT_METRICS_PORT, Config
from ..net.refusals import RefusalLog
from ..net.tls import TLSConfigError, TLSFiles, client_context, ssl_reason
from .errors import BY_STATUS, Unavailable

log = logging.getLogger("queueserver.console")

#: Seconds another node's console is given to answer (connect, handshake and answer each).
NODE_TIMEOUT = 2.0


def https_files(config: Config) -> Optional[TLSFiles]:
    """The ``[tls]`` files this node's HTTP port speaks HTTPS with, by
    :meth:`~queueserver.config.Config.metrics_tls` (None: plain HTTP)."""
    if not config.metrics_tls():
        return None
    assert config.tls_certificate is not None and config.tls_key is not None   # Config.check_tls
    return TLSFiles(os.path.abspath(config.tls_certificate), os.path.abspath(config.tls_key),
                    os.path.abspath(config.tls_client_ca) if config.tls_client_ca else None)


class PeerConsoles:
    """Asks the other nodes' consoles, over HTTPS with ``files`` (None: plain
    HTTP). :class:`~queueserver.net.tls.TLSConfigError` if the files cannot be used."""

    def __init__(self, files: Optional[TLSFiles]) -> None:
        self.files = files
        self._context: Optional[ssl.SSLContext] = None if files is None else client_context(files)
        self._refusals = RefusalLog(log)
        self._lock = threading.Lock()   # the log's counts: pool threads note at once

    @property
    def scheme(self) -> str:
        return "http" if self.files is None else "https"

    def url(self, host: str, port: Optional[int]) -> str:
        """The console of the node at ``host`` (the cluster file's), ending in ``/``."""
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{port or DEFAULT_METRICS_PORT}/"

    def reload(self) -> None:
        """SIGHUP: make the client context again from the files (read anew);
        files that cannot be used keep the context in use, in one line."""
        if self.files is None:
            return
        try:
            self._context = client_context(self.files)
        except TLSConfigError as err:
            log.error("console: asking other nodes with the TLS certificate in use: %s", err)

    def get_json(self, node: str, url: str, timeout: float = NODE_TIMEOUT) -> Any:
        """Node ``node``'s JSON answer at ``url``; its error status as the
        :class:`~.errors.ConsoleError`, Unavailable if it did not answer."""
        try:
            with urllib.request.urlopen(url, timeout=timeout, context=self._context) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read()).get("error", str(err))
            except (ValueError, AttributeError, OSError):
                message = str(err)
            if err.code in (401, 403):
                self._note("refused", f"console: node {node} refused this node's question ({url}): {message}")
            raise BY_STATUS.get(err.code, Unavailable)(str(message)) from None
        except (OSError, ValueError, http.client.HTTPException) as err:
            kind, why = _why(err, timeout)
            self._note(kind, f"console: node {node} did not answer {url}: {why}")
            raise Unavailable(f"{url}: {why}") from None

    def _note(self, kind: str, message: str) -> None:
        with self._lock:
            self._refusals.note(kind, message)


def _why(err: BaseException, timeout: float) -> Tuple[str, str]:
    """A failure to ask a node as ``(kind, words)``: its certificate refused
    here, a TLS failure (this node's certificate refused there), no answer in time, else."""
    reason: object = err.reason if isinstance(err, urllib.error.URLError) else err
    if isinstance(reason, ssl.SSLCertVerificationError):
        return "certificate", f"its certificate is refused: {ssl_reason(reason)}"
    if isinstance(reason, ssl.SSLError):
        return "tls", f"TLS failed: {ssl_reason(reason)}"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timeout", f"no answer (or no TLS handshake) in {timeout:g} s"
    return "down", " ".join(str(reason).split()) or type(reason).__name__
