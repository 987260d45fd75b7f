"""The rate chart, drawn on the server as inline SVG (no script, no library):
added per second as filled steps, completed and failed as step lines over
it, a headroom of at least 15 % above the tallest sample, gridlines with
their values, and the time axis relative to the newest sample."""
from __future__ import annotations

from typing import List, Sequence, Tuple

from .layout import esc, nice_ceiling
from .model import RatePoint

WIDTH, HEIGHT = 900, 230
LEFT, RIGHT, TOP, BOTTOM = 46, 12, 12, 26
SERIES: Tuple[Tuple[str, str, str], ...] = (("added", "Added", "#4f46e5"),
                                            ("completed", "Completed", "#10b981"),
                                            ("failed", "Failed", "#ef4444"))


def _steps(starts: Sequence[float], points: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """A step path: each sample (x at its interval's end, y) level over its
    interval, from ``starts[i]`` (the x its interval begins at) to its x."""
    out: List[Tuple[float, float]] = []
    for start, (x, y) in zip(starts, points):
        out.append((start, y))
        out.append((x, y))
    return out


def _path(points: Sequence[Tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(points))


def _value(point: RatePoint, key: str) -> float:
    return float(point["added"] if key == "added" else point["completed"] if key == "completed"
                 else point["failed"])


def _tick(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def legend() -> str:
    return "<div class=legend>" + "".join(
        f'<span><span class=dot style="--c:{colour}"></span>{label}/s</span>' for _, label, colour in SERIES) \
        + "</div>"


def rate_chart(points: Sequence[RatePoint]) -> str:
    """The SVG of ``points`` (oldest first); a short note when there are fewer than two."""
    if len(points) < 2:
        return ('<div class=empty><b>No rate samples yet</b>The chart fills in as the node samples its '
                'shards (every few seconds).</div>')
    tallest = max(max(p["added"], p["completed"], p["failed"]) for p in points)
    step = nice_ceiling(max(tallest * 1.15, 1.0) / 4)   # four gridlines, the top one at least 15 % above
    top = step * 4
    # Each sample is the rate over the interval that ends at its time: the
    # first one's interval is taken to be as long as the second's.
    t0 = points[0]["t"] - (points[1]["t"] - points[0]["t"])
    t1 = points[-1]["t"]
    span = max(t1 - t0, 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - max(v, 0.0) / top * plot_h

    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="rates per second" '
             'xmlns="http://www.w3.org/2000/svg" font-family="system-ui,sans-serif" font-size="11">']
    for i in range(5):   # gridlines and their values
        value = top * i / 4
        gy = y(value)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}" '
                     f'stroke="{"#d0d5dd" if i == 0 else "#eef0f4"}"/>')
        parts.append(f'<text x="{LEFT - 8}" y="{gy + 4:.1f}" text-anchor="end" fill="#98a2b3">'
                     f'{esc(_tick(value))}</text>')
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):   # time labels, relative to the newest sample
        t = t0 + frac * span
        ago = t1 - t
        label = "now" if ago < 0.5 else (f"-{ago / 60:.0f}m" if ago >= 90 else f"-{ago:.0f}s")
        anchor = "start" if frac == 0 else ("end" if frac == 1 else "middle")
        parts.append(f'<text x="{x(t):.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}" fill="#98a2b3">'
                     f'{label}</text>')
    base = y(0)
    lines = {}
    for key, _, _ in SERIES:
        starts = [x(t0)] + [x(p["t"]) for p in points[:-1]]
        lines[key] = _steps(starts, [(x(p["t"]), y(_value(p, key))) for p in points])
    added = lines["added"]
    area = [(added[0][0], base), *added, (added[-1][0], base)]
    parts.append(f'<path d="{_path(area)} Z" fill="{SERIES[0][2]}" fill-opacity="0.12" stroke="none"/>')
    for key, label, colour in reversed(SERIES):   # added on top
        parts.append(f'<path d="{_path(lines[key])}" fill="none" stroke="{colour}" stroke-width="2" '
                     f'stroke-linejoin="round"><title>{label} per second</title></path>')
    if tallest == 0:
        parts.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" text-anchor="middle" '
                     'fill="#98a2b3" font-size="13">No jobs added, completed or failed in this time</text>')
    parts.append("</svg>")
    return "".join(parts)
