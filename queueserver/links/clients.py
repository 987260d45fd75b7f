"""Who a shard's leases went to: one small record per client connection,
which a lease references, so that the console can say who holds a job
(address, protocol, since when) with the job history off too.

A client connection reaches a shard in one of two ways:

* **through a router** (forwarded requests): the router keeps a
  :data:`Description` of each connection it accepted (a list made once, at
  accept) and sends it over a shard's link the first time the connection
  sends that shard a request that needs it, as the control frame
  ``[0, "client", description]``; the requests themselves then carry only
  the connection's id (``origin``), and ``[0, "left", origin]`` says it
  closed. The shard keeps a :class:`ClientRecord` per (link, origin).
* **on the direct path** (:mod:`queueserver.shard.direct`): the description travels with the
  connection's hand-over (:class:`queueserver.net.handoff.Move`), and the
  shard's direct server keeps the record while it serves the connection.

The record outlives the connection while a lease refers to it (a lease of
most protocols survives its client): ``left`` then says since when it is
gone. Records are made per connection, never per request: a lease costs a
dict entry (job id -> record) in the shard (see ``Shard.holders``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

#: A router's description of a client connection, as it crosses a link:
#: ``[origin, protocol, address, since (µs), router key]`` (a msgpack array).
Description = List[Any]

#: How each transport is named in the console.
VIA_ROUTER = "router"
VIA_DIRECT = "direct"
VIA_CONSOLE = "console"


def describe(origin: int, protocol: str, address: str, since: int, router: Union[int, str]) -> Description:
    """A router's description of its connection ``origin`` (see the module's docstring)."""
    return [origin, protocol, address, since, router]


def peer_address(peer: object) -> str:
    """A socket peer as ``host:port`` (``[host]:port`` for IPv6)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer) if peer else ""


class ClientRecord:
    """One client connection as a shard knows it."""

    __slots__ = ("protocol", "address", "since", "router", "origin", "via", "left", "context")

    def __init__(self, protocol: str, address: str, since: int, router: Union[int, str], origin: int,
                 via: str, name: Optional[str] = None) -> None:
        self.protocol = protocol
        self.address = address          # the client's host:port ("" when unknown)
        self.since = since              # when it connected (µs; 0: unknown)
        self.router = router            # the key of the router that accepted it
        self.origin = origin            # its id at that router
        self.via = via                  # VIA_ROUTER, VIA_DIRECT or VIA_CONSOLE
        self.left = 0                   # when the shard heard it closed (µs; 0: still connected)
        #: what the job history names it by: (protocol, "<router>-<origin>") (or the console's user)
        self.context: Tuple[str, str] = (protocol, name if name is not None else f"{router}-{origin}")

    @classmethod
    def from_description(cls, description: Sequence[Any], via: str, router: Union[int, str, None] = None,
                         ) -> "ClientRecord":
        """The record of a router's :data:`Description`; ``router``: the key
        the history names its router by, if not the description's own."""
        origin, protocol, address, since, key = description[:5]
        record = cls(str(protocol), str(address), int(since), key, int(origin), via)
        if router is not None:
            record.context = (record.protocol, f"{router}-{record.origin}")
        return record

    @classmethod
    def console(cls, who: str) -> "ClientRecord":
        """The console acting as ``who`` (a token's name): what the history names it by."""
        return cls("console", "", 0, "console", 0, VIA_CONSOLE, name=who)

    def description(self) -> Description:
        """This record as a router describes a connection (what a hand-over carries back)."""
        return describe(self.origin, self.protocol, self.address, self.since, self.router)

    def view(self) -> Dict[str, Any]:
        """What the console shows of it (msgpack-ready)."""
        return {"protocol": self.protocol, "address": self.address, "since": self.since or None,
                "router": self.router, "connection": self.origin, "via": self.via, "left": self.left or None,
                "name": self.context[1]}

