"""Who a new client connection is: the access rules' identity, given once at connect.

The router admits the connections it accepts; a shard admits the TLS
connections routers hand it before their handshake (it terminates them).
Both ask the same question the same way: which identity of the access file
the client is, by its certificate's names or its address. An unknown client
is counted as refused (``/metrics``) and told so in its protocol's form.
"""
from __future__ import annotations

import logging
import socket
from typing import Final, Optional, Protocol, Tuple

from ..access import AccessControl, AccessError, Permissions, load
from ..metrics.refusals import CONNECT, UNKNOWN, refused

log: Final = logging.getLogger("queueserver.access")

#: What an unknown client is told (in its protocol's refusal form) before it is closed.
UNKNOWN_CLIENT: Final = "Unknown client: not allowed to connect"


class Admitted(Protocol):
    """What admission reads of a connection, and what it gives it."""

    protocol: str
    sock: socket.socket
    certificate_names: Tuple[str, ...]
    identity: str
    permissions: Optional[Permissions]


def admit(access: Optional[AccessControl], connection: Admitted) -> Optional[str]:
    """Why ``connection``'s client is not served (None: it is): with access
    rules, its identity, by its certificate's names or its address; an
    unknown one is refused."""
    if access is None:
        return None
    address = peer_host(connection.sock)
    permissions = access.admit(connection.certificate_names, address)
    if permissions is None:
        names = ", ".join(connection.certificate_names) or "no certificate"
        refused(UNKNOWN, CONNECT, f"{connection.protocol} client from {address or 'an unknown address'} "
                                  f"({names}): no identity of {access.path} is it")
        return UNKNOWN_CLIENT
    connection.identity = permissions.identity
    connection.permissions = permissions
    return None


def reload_rules(access: Optional[AccessControl], who: str) -> None:
    """SIGHUP: read the access file again, in one line naming ``who`` reads
    it; a file that cannot be used leaves the rules as they were."""
    if access is None:
        return
    try:
        access.replace(load(access.path))
    except AccessError as err:
        log.error("%s: the access rules stay as they were: %s", who, err)
    else:
        log.info("%s: access rules reloaded from %s", who, access.path)


def peer_host(sock: socket.socket) -> str:
    """The client's IP address ("" if the socket no longer knows it)."""
    try:
        peer = sock.getpeername()
    except OSError:
        return ""
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""
