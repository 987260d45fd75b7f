"""Refusals logged at most once per interval per kind, with how many there
were: a flood of bad clients (half-open handshakes, a port scanner) must not
fill the log, and the first of each kind is still seen at once."""
from __future__ import annotations

import logging
import time
from typing import Dict, Final, Tuple

LOG_INTERVAL: Final = 10.0    # seconds between two lines of one kind


class RefusalLog:
    """``note(kind, message)``: log ``message`` unless one of ``kind`` was
    logged in the last ``interval`` seconds (then only count it)."""

    def __init__(self, log: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self.log = log
        self.interval = interval
        #: kind -> (when its last line was logged, refusals since)
        self._kinds: Dict[str, Tuple[float, int]] = {}

    def note(self, kind: str, message: str) -> None:
        now = time.monotonic()
        logged, since = self._kinds.get(kind, (-self.interval, 0))
        if now - logged >= self.interval:
            self.log.warning("%s (%d refused since the last message)", message, since + 1)
            self._kinds[kind] = (now, 0)
        else:
            self._kinds[kind] = (logged, since + 1)
