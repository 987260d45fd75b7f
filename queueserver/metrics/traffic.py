"""Client traffic of this process, counted by :class:`~queueserver.net.connection.ClientConnection`.

One module-level list of ints, updated in place: a router process serves
its clients and a shard process the connections handed to it (the direct
path), never both, so the process's counters are its own. Reading them is
the control socket's business (:mod:`queueserver.metrics.control`).
"""
from __future__ import annotations

from typing import Dict, Final

#: Indexes into :data:`COUNTS`.
RECEIVED: Final = 0
SENT: Final = 1
ACCEPTED: Final = 2
OPEN: Final = 3
RELAYS: Final = 4
TLS_MOVES: Final = 5

#: bytes received from clients, bytes of answers written to them, connections
#: accepted (by a router's listener), connections served in this process now,
#: TLS connections this process relays to where they are served (a shard's: see
#: :mod:`queueserver.net.tlsrelay`), TLS connections this process handed on
#: with their TLS (:mod:`queueserver.net.tlscontinued`), since it started.
COUNTS: Final = [0, 0, 0, 0, 0, 0]


def snapshot() -> Dict[str, int]:
    return {"bytes_received": COUNTS[RECEIVED], "bytes_sent": COUNTS[SENT],
            "accepted": COUNTS[ACCEPTED], "connections": COUNTS[OPEN], "tls_relays": COUNTS[RELAYS],
            "tls_moves": COUNTS[TLS_MOVES]}
