"""Reply statuses shared by the engine, the router link and every codec.

An engine reply is ``[status, value]``: plain data, so it crosses the
router<->shard link as msgpack unchanged. Each codec renders a status in its
own protocol's form (``-TIMEOUT`` for workq, ``:-1`` for takeanumber, ...).
"""
from __future__ import annotations

from typing import Any, Final, List

OK: Final = 0
NOT_FOUND: Final = 1
TIMEOUT: Final = 2          # nothing arrived within the wait (also: "empty" for non-blocking takes)
CLIENT_ERROR: Final = 3
SERVER_ERROR: Final = 4

Reply = List[Any]


class EngineError(Exception):
    """Raised inside the engine; turned into an error reply at its boundary."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def reply(self) -> Reply:
        return [self.status, self.message]


def client_error(message: str) -> EngineError:
    return EngineError(CLIENT_ERROR, message)


def not_found() -> EngineError:
    """A fresh error each time: re-raising one shared instance would chain
    every traceback onto it and grow without bound."""
    return EngineError(NOT_FOUND)


def server_error(message: str) -> EngineError:
    return EngineError(SERVER_ERROR, message)


#: Not an answer for a client: "this shard does not (or no longer) serve that
#: queue or job; ask the one named". ``[MOVED, [slot or None, owner ordinal
#: or None, epoch]]``. Only routers see it; they retry at the owner.
MOVED: Final = 5

#: The client's identity may not do this (the access rules): ``[FORBIDDEN,
#: message]``, rendered as each protocol renders its other errors. Never
#: the engine's: the server's shells answer it before a request runs.
FORBIDDEN: Final = 6
