"""``report.html`` as a user sees it: two workloads through the real pipeline
(history files in the shards' format, ``queueserver history``'s ``run``; its
Python engine, which writes what Spark writes: tests/test_history_engines.py),
each report opened in Chromium at 1280 and 800 px.

* small: two minutes, a dozen jobs in two queues (the charts have two or
  three buckets: bars, linear);
* large: three hours, thousands of jobs in many queues, one with a very long
  name, steady traffic with an idle stretch and a burst of one minute that is
  a hundred times the usual (steps, a log scale that the subtitle names).

Each page must fit the window (no horizontal scrolling of the page; wide
tables scroll in their own box), load every chart, keep the worst-queues
box inside the window, and ask for nothing but ``file:`` and ``data:``.
The charts answer the pointer: hovering a bucket shows its values (those
the history holds, counted here), hovering a queue its full name and
counts, and dragging across a time chart zooms every chart of its figure
into that range (the time labels follow), a double-click zooming back out.
Screenshots: ``test-artifacts/screenshots/history-report-{small,large}*.png``.
"""
from __future__ import annotations

import json
import random
import re
from datetime import datetime, timezone
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


HISTORIES = {"small": small(), "large": large()}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Dict[str, Path]:
    made = {}
    for name, history in HISTORIES.items():
        root = tmp_path_factory.mktemp(f"report-{name}")
        out = root / "out"
        summary = run([str(history.write(root))], str(out), stale_after=600, engine="python")
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


def added_per_minute(history: History, queue: str = "") -> Dict[int, int]:
    """Jobs added per UTC minute (µs of its start), of one queue or all, counted from the
    history's own lines."""
    counts: Dict[int, int] = {}
    for at, _, line in history.lines:
        fields = json.loads(line)
        if fields[3] == "added" and queue in ("", fields[5]):
            counts[at - at % MINUTE] = counts.get(at - at % MINUTE, 0) + 1
    return counts


def words(locator) -> str:   # type: ignore[no-untyped-def]
    """A tooltip's text on one line (its values float right of their names)."""
    return " ".join(locator.inner_text().split())


def plot_point(figure, bucket: float, count: int, panel: int = 0, row: int = 0,   # type: ignore[no-untyped-def]
               rows: int = 1) -> Tuple[float, float]:
    """Where bucket ``bucket`` (of ``count`` shown) of row ``row`` (of ``rows``) is on the page:
    the plot area's place in its chart's coordinates, scaled to the chart's box on the page."""
    chart = figure.locator("svg.chart").nth(panel)
    chart.scroll_into_view_if_needed()
    box = chart.bounding_box()
    scale = box["width"] / float(chart.get_attribute("viewBox").split()[2])
    area = chart.locator("svg.area")
    left, top, width, height = (float(area.get_attribute(a)) * scale for a in ("x", "y", "width", "height"))
    return (box["x"] + left + (bucket + 0.5) / count * width,
            box["y"] + top + (row + 0.5) / rows * height)


def test_hovering_a_bucket_shows_its_values(page, reports):
    page.goto(reports["small"].as_uri())
    flow = page.locator("figure", has_text="Jobs added and completed")
    tip = flow.locator(".tip")
    assert tip.is_hidden()
    added = sorted(added_per_minute(HISTORIES["small"]).items())
    first = added[0][0]
    count = (added[-1][0] - first) // MINUTE + 1
    for minute, n in added:
        page.mouse.move(*plot_point(flow, (minute - first) // MINUTE, count))
        assert tip.is_visible()
        when = datetime.fromtimestamp(minute / S, timezone.utc)
        text = words(tip)
        assert f"{when:%b %d %H:%M}\u2013" in text, text
        assert re.search(rf"added {n}\b", text), text
    page.mouse.move(0, 0)
    assert tip.is_hidden()
    # The queues' bars: the busiest queue first, its outcomes and total.
    queues = page.locator("figure", has_text="Jobs per queue, by outcome")
    page.mouse.move(*plot_point(queues, 0, 1, row=0, rows=2))
    text = words(queues.locator(".tip"))
    assert text.startswith("emails") and "completed 6" in text and "failed 1" in text and "all 7" in text, text


def test_dragging_across_a_time_chart_zooms_into_that_range(page, reports):
    page.goto(reports["large"].as_uri())
    flow = page.locator("figure", has_text="Jobs added and completed")
    area = flow.locator("svg.area")
    count = int(area.get_attribute("viewBox").split()[2])
    assert count > 130 and flow.locator(".zoombar .reset").is_hidden()
    before = flow.locator("g.xticks text").all_text_contents()
    x0, y = plot_point(flow, 100, count)
    x1, _ = plot_point(flow, 129, count)
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(x1, y, steps=6)
    page.mouse.up()
    assert area.get_attribute("viewBox").split()[:3] == ["100", "0", "30"]
    assert f"30 of {count} buckets" in flow.locator(".zoombar").inner_text()
    assert flow.locator(".zoombar .reset").is_visible()
    labels = flow.locator("g.xticks text").all_text_contents()
    assert labels[0].startswith("11:40") and not any("10:00" in label for label in labels), labels
    # Hovering after the zoom: the leftmost bucket shown is minute 100 (11:40 UTC), its count
    # the one the history holds.
    added = added_per_minute(HISTORIES["large"])
    page.mouse.move(*plot_point(flow, 0, 30))
    text = words(flow.locator(".tip"))
    assert "11:40\u201311:41" in text, text
    assert re.search(rf"added {added[min(added) + 100 * MINUTE]:,}\b", text), text
    screenshot(page, "history-report-large-zoomed", full_page=False)
    # The wait and run panels share their time axis: one drag zooms both.
    times = page.locator("figure", has_text="Wait and run times")
    page.mouse.move(*plot_point(times, 10, count, panel=1))
    page.mouse.down()
    page.mouse.move(*plot_point(times, 19, count, panel=1), steps=4)
    page.mouse.up()
    assert [times.locator("svg.area").nth(k).get_attribute("viewBox").split()[:3]
            for k in (0, 1)] == [["10", "0", "10"]] * 2
    # A double-click shows all again.
    page.mouse.dblclick(*plot_point(flow, 5, 30))
    assert area.get_attribute("viewBox").split()[:3] == ["0", "0", str(count)]
    assert flow.locator(".zoombar .reset").is_hidden()
    assert flow.locator("g.xticks text").all_text_contents() == before


def test_the_heat_map_names_the_hovered_queue_and_its_count(page, reports):
    page.goto(reports["large"].as_uri())
    heat = page.locator("figure", has_text="Jobs added per queue and minute")
    names = heat.locator("svg.chart text.name").all_text_contents()
    count = int(heat.locator("svg.area").get_attribute("viewBox").split()[2])
    row = names.index("q03.burst")
    page.mouse.move(*plot_point(heat, 120, count, row=row, rows=len(names)))
    text = words(heat.locator(".tip"))
    minute = min(added_per_minute(HISTORIES["large"])) + 120 * MINUTE
    burst = added_per_minute(HISTORIES["large"], "q03.burst")[minute]
    assert text.startswith("q03.burst") and "12:00\u201312:01" in text, text
    assert f"{burst:,} jobs" in text and burst > 1000, text
    # The long name is cut on the chart, whole in the hover.
    long_row = next(i for i, name in enumerate(names) if name.startswith("billing."))
    page.mouse.move(*plot_point(heat, 3, count, row=long_row, rows=len(names)))
    assert words(heat.locator(".tip")).startswith(LONG)
