"""The console's charts, drawn on the server as inline SVG (no script, no
library) from :class:`~.model.RatePoint` samples, oldest first:

* :func:`rate_chart`: throughput, added per second as filled steps,
  completed and failed as step lines over it (each sample is the rate over
  the interval that ends at its time);
* :func:`depth_chart`: jobs held, the node's by state as stacked areas or a
  queue's as one line through its samples.

Both leave a headroom of at least 15 % above the tallest value, draw
gridlines with their values and a time axis relative to the newest sample
(seconds, minutes, hours or days back, as the range asks); a value that is
not known (None) leaves a gap.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .layout import esc, nice_ceiling
from .model import RatePoint

WIDTH, HEIGHT = 900, 230
LEFT, RIGHT, TOP, BOTTOM = 46, 12, 12, 26
#: (key, label, colour) of what each chart draws.
Series = Tuple[Tuple[str, str, str], ...]
SERIES: Series = (("added", "Added", "#4f46e5"), ("completed", "Completed", "#10b981"),
                  ("failed", "Failed", "#ef4444"))
STATES: Series = (("ready", "Ready", "#3b82f6"), ("scheduled", "Scheduled", "#8b5cf6"),
                  ("leased", "Leased", "#f59e0b"), ("finished", "Finished", "#10b981"))
DEPTH: Series = (("depth", "Jobs", "#3b82f6"),)


def _value(point: RatePoint, key: str) -> Optional[float]:
    value = point.get(key)
    return None if value is None else float(value)   # type: ignore[arg-type]


def _tick(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def ago(seconds: float) -> str:
    """How long before the newest sample, as an axis says it: now, -40s, -12m, -6h, -3d."""
    if seconds < 0.5:
        return "now"
    if seconds >= 2 * 86400:
        return f"-{seconds / 86400:.0f}d"
    if seconds >= 2 * 3600:
        return f"-{seconds / 3600:.0f}h"
    if seconds >= 90:
        return f"-{seconds / 60:.0f}m"
    return f"-{seconds:.0f}s"


def legend(series: Series = SERIES, unit: str = "/s") -> str:
    return "<div class=legend>" + "".join(
        f'<span><span class=dot style="--c:{colour}"></span>{label}{unit}</span>' for _, label, colour in series) \
        + "</div>"


def _path(points: Sequence[Tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(points))


def _runs(points: Sequence[Tuple[float, Optional[float]]]) -> List[List[Tuple[float, float]]]:
    """``(x, y or None)`` as the runs between gaps."""
    runs: List[List[Tuple[float, float]]] = []
    current: List[Tuple[float, float]] = []
    for x, y in points:
        if y is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((x, y))
    if current:
        runs.append(current)
    return runs


class _Frame:
    """A chart's axes over ``points``: where a time and a value go."""

    def __init__(self, points: Sequence[RatePoint], tallest: float, label: str) -> None:
        step = nice_ceiling(max(tallest * 1.15, 1.0) / 4)   # four gridlines, the top one at least 15 % above
        self.top = step * 4
        # The first sample's interval is taken to be as long as the second's.
        self.t0 = points[0]["t"] - (points[1]["t"] - points[0]["t"])
        self.t1 = points[-1]["t"]
        self.span = max(self.t1 - self.t0, 1e-9)
        self.plot_w, self.plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
        self.parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(label)}" '
                      'xmlns="http://www.w3.org/2000/svg" font-family="system-ui,sans-serif" font-size="11">']
        for i in range(5):   # gridlines and their values
            value = self.top * i / 4
            gy = self.y(value)
            self.parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}" '
                              f'stroke="{"#d0d5dd" if i == 0 else "#eef0f4"}"/>')
            self.parts.append(f'<text x="{LEFT - 8}" y="{gy + 4:.1f}" text-anchor="end" fill="#98a2b3">'
                              f'{esc(_tick(value))}</text>')
        for frac in (0.0, 0.25, 0.5, 0.75, 1.0):   # time labels, relative to the newest sample
            t = self.t0 + frac * self.span
            anchor = "start" if frac == 0 else ("end" if frac == 1 else "middle")
            self.parts.append(f'<text x="{self.x(t):.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}" '
                              f'fill="#98a2b3">{ago(self.t1 - t)}</text>')

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / self.span * self.plot_w

    def y(self, v: float) -> float:
        return TOP + self.plot_h - max(v, 0.0) / self.top * self.plot_h

    def note(self, text: str) -> None:
        self.parts.append(f'<text x="{LEFT + self.plot_w / 2:.0f}" y="{TOP + self.plot_h / 2:.0f}" '
                          f'text-anchor="middle" fill="#98a2b3" font-size="13">{esc(text)}</text>')

    def svg(self) -> str:
        return "".join(self.parts) + "</svg>"


def _too_few(points: Sequence[RatePoint], what: str) -> Optional[str]:
    if len(points) < 2:
        return (f'<div class=empty><b>No {what} samples yet</b>The chart fills in as the node samples its '
                'shards (every few seconds).</div>')
    return None


def rate_chart(points: Sequence[RatePoint]) -> str:
    """Throughput: the SVG of ``points``; a short note when there are fewer than two."""
    few = _too_few(points, "rate")
    if few is not None:
        return few
    tallest = max((v for p in points for k, _, _ in SERIES for v in [_value(p, k)] if v is not None), default=0.0)
    frame = _Frame(points, tallest, "rates per second")
    starts = [frame.x(frame.t0)] + [frame.x(p["t"]) for p in points[:-1]]
    base = frame.y(0)

    def steps(key: str) -> List[List[Tuple[float, float]]]:
        """Each sample level over its interval, as runs between unknown samples."""
        out: List[Tuple[float, Optional[float]]] = []
        for start, p in zip(starts, points):
            value = _value(p, key)
            y = None if value is None else frame.y(value)
            out += [(start, y), (frame.x(p["t"]), y)]
        return _runs(out)

    for run in steps(SERIES[0][0]):   # the area under added, below every line
        area = [(run[0][0], base), *run, (run[-1][0], base)]
        frame.parts.append(f'<path d="{_path(area)} Z" fill="{SERIES[0][2]}" fill-opacity="0.12" stroke="none"/>')
    for key, label, colour in reversed(SERIES):   # added on top
        for run in steps(key):
            frame.parts.append(f'<path d="{_path(run)}" fill="none" stroke="{colour}" stroke-width="2" '
                               f'stroke-linejoin="round"><title>{label} per second</title></path>')
    if tallest == 0:
        frame.note("No jobs added, completed or failed in this time")
    return frame.svg()


def depth_chart(points: Sequence[RatePoint], by_state: bool = True) -> str:
    """Jobs held: the node's by state (stacked areas), or (``by_state``
    False) a queue's as one line; a short note with fewer than two points."""
    few = _too_few(points, "depth")
    if few is not None:
        return few
    series = STATES if by_state else DEPTH
    totals = [sum(v for k, _, _ in series for v in [_value(p, k)] if v is not None) for p in points]
    frame = _Frame(points, max(totals, default=0.0), "jobs held")
    xs = [frame.x(p["t"]) for p in points]
    below: List[Optional[float]] = [0.0] * len(points)   # the stack's top so far
    layers = []
    for key, label, colour in series:
        top: List[Optional[float]] = []
        for b, p in zip(below, points):
            value = _value(p, key)
            top.append(None if value is None or b is None else b + value)
        layers.append((key, label, colour, list(below), top))
        below = top
    for key, label, colour, bottom, top in layers:
        for run in _runs(list(zip(xs, [None if v is None else frame.y(v) for v in top]))):
            xs_run = {x for x, _ in run}
            floor = [(x, frame.y(b or 0.0)) for x, b in zip(xs, bottom) if x in xs_run]
            area = [*run, *reversed(floor)]
            frame.parts.append(f'<path d="{_path(area)} Z" fill="{colour}" fill-opacity="0.18" stroke="none">'
                               f'<title>{label}</title></path>')
            frame.parts.append(f'<path d="{_path(run)}" fill="none" stroke="{colour}" stroke-width="1.6" '
                               f'stroke-linejoin="round"><title>{label}</title></path>')
    if max(totals, default=0.0) == 0:
        frame.note("No jobs held in this time")
    return frame.svg()
