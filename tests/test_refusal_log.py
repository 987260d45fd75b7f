"""Refusal lines: a burst per kind and interval, then only counted."""
from __future__ import annotations

import logging

import pytest

from queueserver.net import refusals
from queueserver.net.refusals import RefusalLog


def test_a_burst_per_kind_then_counted_then_said(caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(refusals.time, "monotonic", lambda: now[0])
    log = RefusalLog(logging.getLogger("test.refusals"), interval=10.0, burst=2)
    with caplog.at_level(logging.WARNING, "test.refusals"):
        for i in range(5):
            log.note("timeout", f"slow {i}")
        log.note("plain", "plain 0")          # another kind has its own burst
        now[0] += 10.0
        log.note("timeout", "slow 5")
    assert [r.getMessage() for r in caplog.records] == [
        "slow 0", "slow 1", "plain 0", "slow 5 (3 more refused without a line since the last one)"]
