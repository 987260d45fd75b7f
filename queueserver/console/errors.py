"""What a console request can fail with, as an HTTP status and one sentence.

The source raises these for the user's mistakes and for shards that cannot
answer; the app turns them into a page (or JSON) with that status, never a
traceback.
"""
from __future__ import annotations


class ConsoleError(Exception):
    """A request the console cannot answer: ``status`` and a message for the user."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ConsoleError):
    """Malformed input: an id that is neither a UUID nor a number, an unknown state, a bad page."""

    status = 400


class Forbidden(ConsoleError):
    """An action without a valid token or CSRF check."""

    status = 403


class NotFound(ConsoleError):
    """No such queue or job (anywhere the console can ask)."""

    status = 404


class Unavailable(ConsoleError):
    """A shard or node that holds the answer did not answer in time."""

    status = 503


#: The error an answer's status stands for (a shard's or another node's); any other status is Unavailable.
BY_STATUS = {error.status: error for error in (BadRequest, Forbidden, NotFound, Unavailable)}
