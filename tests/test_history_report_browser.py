"""``report.html`` as a user sees it: two workloads through the real pipeline
(history files in the shards' format, ``queueserver history``'s ``run`` on
the test session's Spark), each report opened in Chromium at 1280 and 800 px.

* small: two minutes, a dozen jobs in two queues (the charts have two or
  three buckets: bars, linear);
* large: three hours, thousands of jobs in many queues, one with a very long
  name, steady traffic with an idle stretch and a burst of one minute that is
  a hundred times the usual (steps, a log scale that the subtitle names).

Each page must fit the window (no horizontal scrolling of the page; wide
tables scroll in their own box), load every chart, keep the worst-queues
box inside the window, and ask for nothing but ``file:`` and ``data:``.
Screenshots: ``test-artifacts/screenshots/history-report-{small,large}*.png``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from queueserver.history.app import run

from browser import screenshot

S = 1_000_000
MINUTE = 60 * S
T0 = 1_767_225_600 * S + 10 * 3600 * S + 20 * S     # 2026-01-01 10:00:20 UTC
LONG = ("billing.invoices.eu-west-1.customer-notifications.retry-with-exponential-backoff-"
        "and-jitter.priority-high.version-2026-01-01")
SHARDS = 2


class History:
    """Jobs' events as the shards write them (schema version 2: one JSON array per line)."""

    def __init__(self) -> None:
        self.lines: List[Tuple[int, int, str]] = []   # (time, shard, line)
        self.jobs = 0

    def job(self, queue: str, added: int, *steps: Tuple[float, str]) -> None:
        """A job added at ``added`` µs, then each (seconds after the previous step, event)."""
        self.jobs += 1
        n, shard = self.jobs, self.jobs % SHARDS
        at, attempt = added, 0
        for delay, event in (0.0, "added"), *steps:
            at += round(delay * S)
            attempt += event == "leased"
            conn = f"0-{n % 7}" if event == "leased" else None
            protocol = "workq" if event in ("added", "leased") else None
            self.lines.append((at, shard, json.dumps(
                [2, at, shard, event, protocol, queue, f"00000000-0000-4000-8000-{n:012d}", n,
                 attempt, n % 3, 100 + n % 50, conn], separators=(",", ":"))))

    def write(self, root: Path) -> Path:
        """Every shard's lines in time order, a file per 2,000 lines; returns the history dir."""
        history = root / "history"
        for shard in range(SHARDS):
            lines = sorted((at, line) for at, s, line in self.lines if s == shard)
            folder = history / f"shard-{shard}"
            folder.mkdir(parents=True)
            for k, first in enumerate(range(0, len(lines), 2000)):
                chunk = lines[first:first + 2000]
                (folder / f"history-{chunk[0][0]}-{k + 1:06d}.jsonl").write_text(
                    "".join(line + "\n" for _, line in chunk))
        return history


def done(rng: random.Random, end: str = "completed") -> Tuple[Tuple[float, str], ...]:
    return ((rng.uniform(0.2, 3), "leased"), (rng.uniform(0.5, 8), end))


def small() -> History:
    """About two minutes: 12 jobs in two queues, one failed, one left unfinished."""
    rng, h = random.Random(1), History()
    for i in range(10):
        h.job("emails" if i % 3 else "thumbnails", T0 + i * 11 * S, *done(rng))
    h.job("emails", T0 + 40 * S, *done(rng, "failed"))
    h.job("thumbnails", T0 + 100 * S, (2.0, "leased"))
    return h


def large() -> History:
    """Three hours, 40 queues: steady traffic, 20 idle minutes, a burst of 2,500 jobs in one
    minute on one queue, failures, dead and expired jobs, and a queue with a very long name."""
    rng, h = random.Random(2), History()
    queues = [LONG] + [f"q{i:02d}.{rng.choice(['mail', 'img', 'pdf', 'sync'])}" for i in range(39)]
    for minute in range(180):
        if 60 <= minute < 80:
            continue                                     # idle: zeros, not a line across
        for _ in range(rng.randint(8, 20)):
            queue = queues[min(int(rng.expovariate(0.25)), len(queues) - 1)]
            added = T0 + minute * MINUTE + rng.randrange(MINUTE)
            roll = rng.random()
            if roll < 0.04:
                h.job(queue, added, *done(rng, "failed"))
            elif roll < 0.06:
                h.job(queue, added, (1, "leased"), (30, "requeued"), (1, "leased"), (30, "dead"))
            elif roll < 0.08:
                h.job(queue, added, (rng.uniform(20, 90), "expired"))
            else:
                h.job(queue, added, *done(rng))
    for k in range(2500):                                # the burst, worked off within minutes
        h.job("q03.burst", T0 + 120 * MINUTE + k * 20_000, (rng.uniform(0.1, 200), "leased"),
              (rng.uniform(0.05, 0.5), "completed" if k % 50 else "failed"))
    for minute in [m for m in range(0, 180, 3) if not 60 <= m < 80]:   # among the worst queues
        h.job(LONG, T0 + minute * MINUTE + 7 * S, *done(rng, "failed"))
    h.job(LONG, T0 + 100 * MINUTE, (1.0, "leased"))      # stale: the long name in "stuck" too
    return h


@pytest.fixture(scope="module")
def reports(spark, tmp_path_factory) -> Dict[str, Path]:
    made = {}
    for name, history in (("small", small()), ("large", large())):
        root = tmp_path_factory.mktemp(f"report-{name}")
        out = root / "out"
        summary = run([str(history.write(root))], str(out), spark=spark, stale_after=600)
        assert summary.jobs == history.jobs
        made[name] = out / "report.html"
    return made


def check_layout(page, width: int) -> None:   # type: ignore[no-untyped-def]
    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_load_state("load")
    sizes = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1], f"the page is {sizes[0]} px wide in a {sizes[1]} px window"
    images = page.evaluate("""() => [...document.querySelectorAll('img, svg')].map(e => {
        const r = e.getBoundingClientRect();
        return {loaded: e.tagName !== 'IMG' || (e.complete && e.naturalWidth > 0),
                left: r.left, right: r.right, width: r.width, alt: e.getAttribute('alt')};
    })""")
    assert len(images) >= 3
    for image in images:
        assert image["loaded"], image["alt"]
        assert 0 <= image["left"] and image["right"] <= width and image["width"] > 100, image
    spilling = page.evaluate("""() => [...document.querySelectorAll('.card, figure, .worst')]
        .filter(e => e.scrollWidth > e.clientWidth).map(e => e.textContent)""")
    assert spilling == [], "content wider than its box"
    worst = page.locator("#worst-queues").bounding_box()
    assert worst is not None and 0 <= worst["x"] and worst["x"] + worst["width"] <= width
    # Every queue name fits its box: long ones are cut (the page ellipsizes them), not spilled.
    spilled = page.evaluate("""() => [...document.querySelectorAll('#worst-queues .name')]
        .filter(e => e.getBoundingClientRect().right > e.closest('table').getBoundingClientRect().right + 1)
        .map(e => e.title)""")
    assert spilled == []


@pytest.mark.parametrize("size", ["small", "large"])
def test_report_fits_the_window_and_loads_only_itself(page, reports, size):
    requests: List[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(reports[size].as_uri())
    for width in (1280, 800):
        check_layout(page, width)
        screenshot(page, f"history-report-{size}" + ("" if width == 1280 else f"-{width}"))
    assert requests and all(url.startswith(("file:", "data:")) for url in requests), requests
    text = page.locator("main").inner_text()
    subtitles = page.locator("figure .sub").all_inner_texts()
    if size == "small":
        assert "Log scale" not in " ".join(subtitles)
        assert "emails" in page.locator("#worst-queues").inner_text()
    else:
        flow = page.locator("figure", has_text="Jobs added and completed").locator(".sub").inner_text()
        assert "Log scale" in flow
        name = page.locator("#worst-queues .name", has_text="billing.invoices")
        assert name.get_attribute("title") == LONG              # cut on the page, full name kept
        assert name.evaluate("e => e.scrollWidth > e.clientWidth")
        assert LONG in page.content() and "q03.burst" in text
        assert "Busiest minute: Jan 01 12:00 UTC" in text
