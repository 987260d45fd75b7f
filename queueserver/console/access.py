"""Who a client of the HTTP port is, and what it may read and do there.

With an access file, a connection to the HTTP port is resolved to an
identity once, when it is accepted, the way a client port resolves one
(:meth:`~queueserver.access.AccessControl.admit`: its certificate's names,
then its source network); an unknown client is refused. Each request then
needs a verb: ``inspect`` on every queue (``*``) for ``/metrics``,
``/status`` and the node-wide pages, ``inspect`` on a queue for its pages
and its jobs', ``admin`` on the queue a console action touches (besides the
console's token). A refusal is counted in
``queueserver_access_refusals_total{identity, verb}`` and logged as the
client ports' are (:func:`queueserver.metrics.refusals.refused`).
"""
from __future__ import annotations

import threading
from typing import Final, Optional, Sequence

from ..access import AccessControl, AccessError, Permissions, load
from ..metrics.refusals import CONNECT, UNKNOWN, refused
from ..net.admission import UNKNOWN_CLIENT
from .errors import Forbidden

#: The queue a node-wide page, ``/metrics`` and ``/status`` need their verb on: all of them.
EVERY_QUEUE: Final = "*"


class Refused(Forbidden):
    """A request the client's identity may not make (a 403)."""

    def __init__(self, permissions: Permissions, verb: str, queue: str, of_job: bool = False) -> None:
        message = permissions.message(verb, queue if queue != EVERY_QUEUE else None)
        if of_job:   # the job's queue is not named to one that may not see it
            message = f"Permission denied: {permissions.identity} may not {verb} this job's queue"
        super().__init__(message)
        self.identity = permissions.identity
        self.verb = verb


def may(permissions: Optional[Permissions], verb: str, queue: str) -> bool:
    """Whether ``permissions`` (None: no access file) allow ``verb`` on
    ``queue`` (:data:`EVERY_QUEUE`: on every queue, as a ``*`` pattern does)."""
    if permissions is None:
        return True
    if queue == EVERY_QUEUE:
        return permissions.matchers[verb].everything
    return permissions.may(verb, queue)


def require(permissions: Optional[Permissions], verb: str, queue: str, what: str, client: str,
            of_job: bool = False) -> None:
    """Raise :class:`Refused` (counted and logged) unless ``verb`` on ``queue``
    is allowed. ``what``: the request, for the log line; ``client``: its
    address; ``of_job``: ``queue`` is a job's, not named in the answer."""
    if may(permissions, verb, queue):
        return
    assert permissions is not None   # no access file allows everything
    refusal = Refused(permissions, verb, queue, of_job)
    count(refusal.identity, verb, f"HTTP client {client or '?'}: {what}: "
                                  f"{permissions.message(verb, queue if queue != EVERY_QUEUE else None)}")
    raise refusal


def count(identity: str, verb: str, message: str) -> None:
    """Count and log one refusal (from any request thread)."""
    refused(identity, verb, message)


class HTTPAccess:
    """The access file's rules as the HTTP port enforces them; :meth:`reload` on SIGHUP."""

    def __init__(self, path: str) -> None:
        self.control = AccessControl(load(path))
        self._lock = threading.Lock()   # request threads admit while the main thread reloads

    @property
    def path(self) -> str:
        return self.control.path

    def admit(self, certificate_names: Sequence[str], address: str) -> Optional[Permissions]:
        """The permissions of a new connection (None: unknown, counted and logged)."""
        with self._lock:
            permissions = self.control.admit(certificate_names, address)
        if permissions is None:
            names = ", ".join(certificate_names) or "no certificate"
            count(UNKNOWN, CONNECT, f"HTTP client from {address or 'an unknown address'} ({names}): "
                                    f"no identity of {self.path} is it")
        return permissions

    def reload(self) -> None:
        """Read the access file again (:class:`~queueserver.access.AccessError`:
        it cannot be used, and the rules stay as they were)."""
        rules = load(self.path)
        with self._lock:
            self.control.replace(rules)


__all__ = ["EVERY_QUEUE", "UNKNOWN_CLIENT", "AccessError", "HTTPAccess", "Refused", "count", "may", "require"]
