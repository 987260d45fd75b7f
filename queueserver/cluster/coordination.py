"""The cluster's coordination on etcd: who is alive, said with leases.

Why etcd: which node is alive (and, built on it, which shard is primary and
which slot map is current) must be agreed by a proven consensus, not by one
of our own; etcd is that, packaged by Debian, with leases (a key lives only
while its owner keeps refreshing it) and compare-and-swap transactions on
revisions. We talk to its v3 JSON gateway through ``etcd3gw`` (maintained by
OpenStack; plain HTTP through ``requests``, so it runs in the supervisor's
threads, where a gRPC client's own threads and C core would not mix with the
shards' gevent and would bring a heavy dependency for a few calls a second).

Keys, under the cluster file's ``[etcd] prefix``::

    <prefix>/nodes/<name>   {"host", "pid", "started", "metrics_port", "shards"}
                            (JSON), attached to the node's lease: gone within
                            ``lease_ttl`` seconds of the node's death

A node's :class:`Membership` registers it and refreshes its lease every
quarter of the TTL from a daemon thread; a refresh that finds the lease gone
(etcd restarted, or the node was cut off longer than the TTL) registers
again with a new lease, and each change of state is one log line.
:func:`live_nodes` is what ``queueserver cluster status`` reads.

Endpoints are tried in the order the file gives them; the first that
answers is kept until it fails. With ``[etcd] user`` and ``password_file``
each endpoint is logged in to on first use, and again when etcd no longer
takes its token (:mod:`.etcdlogin`).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union
from urllib.parse import urlsplit

import etcd3gw
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.lease import Lease
from etcd3gw.utils import _encode
from requests.exceptions import RequestException

from ..net import faults
from .clusterfile import ClusterError, EtcdSpec
from .etcdlogin import LoginRefused, etcd_answer, load_password, log_in, token_refused

log = logging.getLogger("queueserver.cluster")

#: Seconds one etcd request may take before the next endpoint is tried.
REQUEST_TIMEOUT = 2.0

Result = TypeVar("Result")


class CoordinationError(Exception):
    """No etcd endpoint answered (each one's failure in the message)."""


class AuthenticationError(CoordinationError):
    """etcd refused the cluster file's user and password, or the password
    file cannot be read: a mistake to correct, not an outage to wait out."""


class Etcd:
    """The cluster file's etcd endpoints as one client: a call goes to the
    endpoint that answered last, and on a failure to the next ones."""

    def __init__(self, spec: EtcdSpec) -> None:
        self.spec = spec
        self._clients: List[etcd3gw.Etcd3Client] = []
        for endpoint in spec.endpoints:
            url = urlsplit(endpoint)
            self._clients.append(etcd3gw.Etcd3Client(
                host=url.hostname or "127.0.0.1", port=url.port or 2379, protocol=url.scheme or "http",
                ca_cert=spec.ca, cert_key=spec.key, cert_cert=spec.cert, timeout=REQUEST_TIMEOUT,
                api_path="/v3/"))
        self._current = 0
        self._lock = threading.Lock()
        #: per endpoint: whether it was logged in to (a token in its session's
        #: headers, or none where etcd has authentication off)
        self._logged_in = [False] * len(self._clients)
        self._login_lock = threading.Lock()

    def call(self, what: Callable[[etcd3gw.Etcd3Client], Result]) -> Result:
        """``what(client)`` on the first endpoint that answers; CoordinationError if none does."""
        if faults.cut_off():
            raise CoordinationError("no etcd endpoint answered (cut off by fault injection)")
        failures = []
        with self._lock:
            start = self._current
        for step in range(len(self._clients)):
            i = (start + step) % len(self._clients)
            try:
                result = self._on(i, what)
            except RequestException as err:
                failures.append(f"{self.spec.endpoints[i]}: {type(err).__name__}: {str(err)[:200]}")
                continue
            except Etcd3Exception as err:
                hint = " (its authentication is on: set [etcd] user and password_file)" \
                    if self.spec.user is None and token_refused(err) else ""
                failures.append(f"{self.spec.endpoints[i]}: {etcd_answer(err)[1]}{hint}")
                continue
            with self._lock:
                self._current = i
            return result
        raise CoordinationError("no etcd endpoint answered (" + "; ".join(failures) + ")")

    def log_in(self) -> None:
        """Log in to the first endpoint that answers (a check of the
        credentials): AuthenticationError if etcd refuses them,
        CoordinationError if no endpoint answers."""
        self.call(lambda client: None)

    def _on(self, i: int, what: Callable[[etcd3gw.Etcd3Client], Result]) -> Result:
        """``what`` on endpoint ``i``: logged in first when the file names a
        user, and once more (then repeated) when etcd no longer takes the token."""
        client = self._clients[i]
        if self.spec.user is None:
            return what(client)
        token = client.session.headers.get("Authorization")
        if not self._logged_in[i]:
            self._log_in(i, token)
        else:
            try:
                return what(client)
            except Etcd3Exception as err:
                if not token_refused(err):
                    raise
            self._log_in(i, token)
        return what(client)

    def _log_in(self, i: int, stale: Union[str, bytes, None]) -> None:
        """A fresh token for endpoint ``i``, unless another thread got one
        since ``stale`` was the token in use."""
        client, user = self._clients[i], self.spec.user
        assert user is not None and self.spec.password_file is not None
        with self._login_lock:
            if self._logged_in[i] and client.session.headers.get("Authorization") != stale:
                return
            endpoint = self.spec.endpoints[i]
            try:
                token = log_in(client, user, load_password(self.spec.password_file))
            except ClusterError as err:
                raise AuthenticationError(str(err)) from None
            except LoginRefused as err:
                raise AuthenticationError(f"etcd at {endpoint}: authentication failed for user "
                                          f"{user!r}: {err}") from None
            if token is None:
                client.session.headers.pop("Authorization", None)
                log.warning("etcd at %s has authentication off: [etcd] user %r is not used", endpoint, user)
            else:
                client.session.headers["Authorization"] = token
            self._logged_in[i] = True

    def key(self, *parts: str) -> str:
        return "/".join([self.spec.prefix.rstrip("/"), *parts])

    def close(self) -> None:
        for client in self._clients:
            client.session.close()


def transact(etcd: Etcd, compare: List[Dict[str, Any]], writes: List[Dict[str, Any]]) -> Optional[int]:
    """``writes`` (see :func:`put_request`) in one transaction if every
    ``compare`` holds: the revision it made, None if a compare failed."""
    txn = {"compare": compare, "success": writes, "failure": []}
    answer = etcd.call(lambda client: client.transaction(txn))
    if not answer.get("succeeded", False):
        return None
    return int(answer["header"]["revision"])


def created_at(key: str, revision: int) -> Dict[str, Any]:
    """A transaction's compare: ``key`` was created at ``revision`` (0: it does not exist)."""
    return {"key": _encode(key), "result": "EQUAL", "target": "CREATE", "create_revision": str(revision)}


def put_request(key: str, value: str, lease: Optional[int] = None) -> Dict[str, Any]:
    """A transaction's write of ``value`` at ``key`` (attached to ``lease``, if given)."""
    put: Dict[str, Any] = {"key": _encode(key), "value": _encode(value)}
    if lease is not None:
        put["lease"] = str(lease)
    return {"request_put": put}


def compare_and_put(etcd: Etcd, key: str, revision: int, value: str) -> bool:
    """Write ``value`` at ``key`` if the key is still at modification
    ``revision`` (0: still absent), in one transaction; whether it was written."""
    compare = (created_at(key, 0) if revision == 0 else
               {"key": _encode(key), "result": "EQUAL", "target": "MOD", "mod_revision": str(revision)})
    return transact(etcd, [compare], [put_request(key, value)]) is not None


def read_with_revision(etcd: Etcd, key: str) -> Tuple[Optional[bytes], int]:
    """``key``'s value and modification revision; (None, 0) when absent."""
    found = etcd.call(lambda client: client.get(key, metadata=True))
    if not found:
        return None, 0
    value, meta = found[0]
    return value, int(meta["mod_revision"])


def live_nodes(etcd: Etcd) -> Dict[str, Dict[str, Any]]:
    """The nodes whose lease is alive now: name -> what they registered."""
    prefix = etcd.key("nodes", "")
    found = etcd.call(lambda client: client.get_prefix(prefix))
    nodes: Dict[str, Dict[str, Any]] = {}
    for value, meta in found:
        name = meta["key"].decode()[len(prefix):]
        try:
            info = json.loads(value)
        except ValueError:
            info = {}
        nodes[name] = info if isinstance(info, dict) else {}
    return nodes


class Membership:
    """This node's registration: ``<prefix>/nodes/<name>`` on a lease kept alive."""

    def __init__(self, etcd: Etcd, name: str, info: Dict[str, Any]) -> None:
        self.etcd = etcd
        self.name = name
        self.info = dict(info, pid=os.getpid(), started=time.time())
        self._lease: Optional[Lease] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.registered = threading.Event()   # set while the key is known to be in etcd
        self._last_ok = time.monotonic()      # the last registration or refresh that etcd took

    def start(self) -> None:
        """Register at once if etcd answers (else keep trying from the thread)."""
        try:
            self._register()
        except CoordinationError as err:
            log.warning("etcd: node %s not registered yet: %s; retrying", self.name, err)
        self._thread = threading.Thread(target=self._keep_alive, name="etcd-lease", daemon=True)
        self._thread.start()

    def _register(self) -> None:
        ttl = self.etcd.spec.lease_ttl
        lease = self.etcd.call(lambda client: client.lease(ttl=ttl))
        body = json.dumps(self.info, sort_keys=True)
        key = self.etcd.key("nodes", self.name)
        self.etcd.call(lambda client: client.put(key, body, lease=lease))
        self._lease = lease
        self._last_ok = time.monotonic()
        self.registered.set()
        log.info("etcd: node %s registered (lease of %d s)", self.name, ttl)

    def _keep_alive(self) -> None:
        period = max(0.2, self.etcd.spec.lease_ttl / 4)
        while not self._stop.wait(period):
            try:
                lease = self._lease
                if lease is not None and self.etcd.call(lambda client: _refresh(client, lease)) > 0:
                    self._last_ok = time.monotonic()
                else:
                    if lease is not None:
                        log.warning("etcd: node %s's lease had lapsed; registering again", self.name)
                        self.registered.clear()
                    self._register()
            except CoordinationError as err:
                if self.registered.is_set():
                    log.warning("etcd: node %s cannot refresh its lease: %s", self.name, err)
                    self.registered.clear()

    def silent_for(self) -> float:
        """Seconds since etcd last took this node's registration or refresh:
        past the lease's TTL, others may see this node as dead."""
        return time.monotonic() - self._last_ok

    def stop(self) -> None:
        """Stop refreshing and revoke the lease: the node is gone from etcd at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(REQUEST_TIMEOUT * 2)
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                self.etcd.call(lambda client: _revoke(client, lease))
            except CoordinationError as err:
                log.warning("etcd: could not revoke node %s's lease (it lapses by itself): %s",
                            self.name, err)
        self.registered.clear()


class HeldLease:
    """A lease this process keeps alive from a daemon thread while it acts:
    the keys it puts on it say "this one is at work", and vanish within the
    TTL once it dies, whatever killed it. Unlike a :class:`Membership`, a
    lapsed lease is not taken again (what was attached to it is gone, and
    others may have acted on that): :attr:`lost` is set instead."""

    def __init__(self, etcd: Etcd) -> None:
        self.etcd = etcd
        ttl = etcd.spec.lease_ttl
        self.lease = etcd.call(lambda client: client.lease(ttl=ttl))
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, name="etcd-held-lease", daemon=True)
        self._thread.start()

    @property
    def id(self) -> int:
        return int(self.lease.id)

    def _keep_alive(self) -> None:
        period = max(0.2, self.etcd.spec.lease_ttl / 4)
        last_ok = time.monotonic()
        while not self._stop.wait(period):
            try:
                if self.etcd.call(lambda client: _refresh(client, self.lease)) <= 0:
                    self.lost.set()
                    return
                last_ok = time.monotonic()
            except CoordinationError as err:
                if time.monotonic() - last_ok > self.etcd.spec.lease_ttl:
                    log.warning("etcd: lease %x cannot be refreshed (%s): it has lapsed", self.id, err)
                    self.lost.set()
                    return

    def revoke(self) -> None:
        """Stop refreshing and revoke: what is attached to the lease goes at once."""
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT * 2)
        try:
            self.etcd.call(lambda client: _revoke(client, self.lease))
        except CoordinationError as err:
            log.warning("etcd: could not revoke lease %x (it lapses by itself): %s", self.id, err)


def _refresh(client: etcd3gw.Etcd3Client, lease: Lease) -> int:
    """The lease's new TTL through ``client`` (-1 or 0 when it has lapsed)."""
    return Lease(lease.id, client).refresh()


def _revoke(client: etcd3gw.Etcd3Client, lease: Lease) -> bool:
    return Lease(lease.id, client).revoke()
