"""The client ports, bound before anything slow.

A client that connects while the server starts (imports, shard processes,
replaying the logs) must wait in the listening socket's backlog, not be
refused: ``queueserver serve`` binds these sockets first, right after
reading its configuration (with only the standard library loaded), and the
routers accept from them once they serve. Nothing heavy is imported here.
"""
from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from .config import Config

BACKLOG = 1024   # connections the kernel holds while the routers start (capped by somaxconn)


class BindError(Exception):
    """A port cannot be had; ``str()`` is one line naming each and its fix."""


TLS_SUFFIX = "_tls"   # a TLS listener's name: its protocol's, then this


def tls_protocol(name: str) -> Optional[str]:
    """The protocol a listener named ``name`` serves over TLS (None: a plain one)."""
    return name[:-len(TLS_SUFFIX)] if name.endswith(TLS_SUFFIX) else None


def bind_listeners(config: "Config") -> Dict[str, socket.socket]:
    """A listening socket for every enabled protocol's port (``workq``) and
    TLS port (``workq_tls``), inheritable by the routers; every port that
    cannot be had is named in one :class:`BindError` (and none is kept)."""
    listeners: Dict[str, socket.socket] = {}
    failures: List[Tuple[str, str, int, OSError]] = []
    flags: Dict[str, str] = {}
    for protocol, listener in config.listeners.items():
        host = listener.bind or config.bind
        for name, port, tls in listener.ports(protocol):
            flags[name] = f"--{protocol}-tls-port" if tls and listener.tls == "both" else f"--{protocol}-port"
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(BACKLOG)
            except OSError as err:
                sock.close()
                failures.append((name, host, port, err))
                continue
            sock.set_inheritable(True)
            listeners[name] = sock
    if failures:
        for sock in listeners.values():
            sock.close()
        raise BindError(bind_failures(failures, flags))
    return listeners


def reason(err: OSError) -> str:
    """An OS error as words (no errno number, no path)."""
    return (err.strerror or str(err)).lower()


def bind_failure(protocol: str, host: str, port: int, err: OSError) -> str:
    """Why ``protocol`` cannot listen on ``host:port``, and which setting to change."""
    return bind_failures([(protocol, host, port, err)])


def bind_failures(failures: List[Tuple[str, str, int, OSError]], flags: Optional[Dict[str, str]] = None) -> str:
    """One line for every port that cannot be had: grouped by reason, each
    group naming its protocols' addresses and the settings to change
    (``flags``: a listener's flag when not ``--<name>-port``)."""
    by_reason: Dict[Tuple[int, str], List[Tuple[str, str, int]]] = {}
    for protocol, host, port, err in failures:
        by_reason.setdefault((err.errno or 0, reason(err)), []).append((protocol, host, port))
    parts = []
    for (code, why), group in by_reason.items():
        where = ", ".join(f"{protocol} on {host}:{port}" for protocol, host, port in group)
        named = ", ".join((flags or {}).get(protocol, f"--{protocol}-port") for protocol, _, _ in group)
        several = len(group) > 1
        if code == errno.EADDRINUSE:
            advice = (f"address already in use (another server running? pick "
                      f"{'other ports with' if several else 'another port with'} {named})")
        elif code == errno.EADDRNOTAVAIL:
            advice = f"{group[0][1]} is not an address of this machine (pick another with --bind)"
        elif code == errno.EACCES:
            advice = (f"permission denied (ports below 1024 need privileges; pick "
                      f"{'other ports with' if several else 'another port with'} {named})")
        else:
            advice = why
        parts.append(f"cannot listen for {where}: {advice}")
    return "; ".join(parts)
