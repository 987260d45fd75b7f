"""The error a history run reports as one line: bad input, or a checkpoint that does not fit."""


class HistoryError(Exception):
    """A problem the caller can fix; the message names it and the fix."""
