"""What the supervisor tells a router: JSON in its ``--config``
(:func:`queueserver.router.process.main` reads it).

Declared here, beside the router that takes it, so that the supervisor
names the router's types and the router never names the supervisor's.
"""
from __future__ import annotations

from typing import Dict, List, Optional, TypedDict

from ..config import Value


class ClusterPlace(TypedDict):
    """Where a router's node is in its cluster: the cluster file and the node's name."""
    file: str
    node: str


class TLSSettings(TypedDict):
    """The ``[tls]`` section, for the TLS listeners (read again on SIGHUP)."""
    certificate: str
    key: str
    client_ca: Optional[str]
    handshake_timeout: float


class _RouterConfigBase(TypedDict):
    sockets: List[str]                        # the shards' sockets, by index
    listen_fds: Dict[str, int]                # protocol -> listening socket it inherits
    tls_fds: Dict[str, int]                   # protocol -> its TLS listening socket
    options: Dict[str, Dict[str, Value]]      # protocol -> codec options
    limits: Dict[str, int]
    direct_path: bool
    history: bool
    index: int
    routers: int
    ready_file: str
    control: str


class RouterConfig(_RouterConfigBase, total=False):
    """What a router is told, as JSON in its ``--config``: one of ``cluster``
    and ``numbers``; ``access`` with an access file, ``tls`` when any
    listener speaks TLS."""
    cluster: ClusterPlace
    numbers: str
    access: str                               # the access file (absent: everyone may do everything)
    tls: TLSSettings
