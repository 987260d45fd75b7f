"""Refusals logged at most ``burst`` lines per interval per kind, with how
many went unlogged: a flood of bad clients (half-open handshakes, a port
scanner) must not fill the log, and the first refusals of each kind are
still seen at once, one line each."""
from __future__ import annotations

import logging
import time
from typing import Dict, Final, List

LOG_INTERVAL: Final = 10.0    # seconds of one window
BURST: Final = 5              # lines of one kind per window


class RefusalLog:
    """``note(kind, message)``: log ``message`` unless ``burst`` lines of
    ``kind`` were logged in this ``interval`` (then only count it, and say
    how many were not logged in the next line)."""

    def __init__(self, log: logging.Logger, interval: float = LOG_INTERVAL, burst: int = BURST) -> None:
        self.log = log
        self.interval = interval
        self.burst = burst
        #: kind -> [when its window began, lines logged in it, refusals not logged]
        self._kinds: Dict[str, List[float]] = {}

    def note(self, kind: str, message: str) -> None:
        now = time.monotonic()
        state = self._kinds.get(kind)
        if state is None:
            state = self._kinds[kind] = [now, 0.0, 0.0]
        elif now - state[0] >= self.interval:
            state[0], state[1] = now, 0.0
        if state[1] >= self.burst:
            state[2] += 1
            return
        state[1] += 1
        unlogged = int(state[2])
        state[2] = 0.0
        if unlogged:
            self.log.warning("%s (%d more refused without a line since the last one)", message, unlogged)
        else:
            self.log.warning("%s", message)
