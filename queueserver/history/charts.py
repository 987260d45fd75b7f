"""The report's charts: which kind of chart the data asks for, and drawing it as SVG.

Nothing here touches Spark: the report (:mod:`.report`) hands over plain
lists (one value per time bucket, oldest first) and gets back a
:class:`Chart` (title, subtitle, and the chart's markup: an inline SVG and
its data as JSON). The choices are pure functions on those lists, tested on
their own (tests/test_history_charts.py):

* **Bars or steps** (:func:`chart_kind`): a count per bucket is a bar when
  there are few buckets (up to :data:`BARS_UP_TO`), a step (each bucket a
  flat run over its whole interval) when there are many. Never a line from
  one bucket's point to the next: two minutes of history would be two
  points and a diagonal that no job followed. Buckets without events are
  zeros, drawn as such (counts) or left blank (times), never bridged.
* **Linear or log** (:func:`needs_log`): when the busiest bucket holds more
  than :data:`LOG_SPREAD` times the median of the non-empty ones (a burst
  against steady traffic), a linear axis flattens the steady part to zero,
  so the axis is logarithmic (symlog for counts, where 0 stays 0; log for
  times, the empty buckets being gaps), and the subtitle says so.
* **Headroom** (:func:`headroom`): the y-limit is the next round number at
  least :data:`HEADROOM` above the tallest bar (linear), or a factor above
  it (log), so that no bar or value label touches the frame.
* **Many queues** (:func:`heatmap_chart`): per queue over time is a heat map,
  a row per queue, so a small queue is not drawn under a big one; its colour
  scale follows the same log rule. Queue names are ellipsized
  (:data:`NAME_CHARS`), the full name in the hover text.

A chart is an inline SVG drawn here, in a fixed coordinate system
(:data:`WIDTH` wide) that scales with the page; its text is the page's
font. The plot area of a time chart is a nested ``<svg>`` whose x axis is
in buckets (``viewBox="0 0 count height"``), so the page's script
(:mod:`.chartscript`) zooms into a range of buckets by changing that
viewBox and relabelling the axis, and reads the hovered bucket's values
from the chart's data (``<script type="application/json">``). Without the
script the charts are whole and static. SVG rather than an image: the
values under the pointer, a zoom that stays sharp, and a few kilobytes per
chart (a series is one path; bars and heat-map cells only where there is
something to draw).

Why one module, though over 600 lines: what a chart is drawn as (its
:class:`Plan`: bars or steps, linear or log, headroom) and its drawing are
read together; the script that zooms it is apart (:mod:`.chartscript`).
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from statistics import median
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

#: Up to this many buckets a count is drawn as bars; more, as steps.
BARS_UP_TO = 40
#: Busiest bucket over the median non-empty one beyond which the axis is logarithmic.
LOG_SPREAD = 20.0
#: The least room above the tallest bar, as a share of it (linear axes).
HEADROOM = 0.1
#: Room above the tallest bar on a log axis: this factor (a third of a decade and more).
LOG_HEADROOM = 2.5
#: Bars get their value written on top when there are at most this many.
LABELLED_BARS = 36
#: Queue names in charts are cut to this many characters (an ellipsis ends them).
NAME_CHARS = 32
#: The SVG's own width: it is scaled to the page's, text with it.
WIDTH = 1000
#: Width of a character of the chart font (12 px), a little over the average: for laying out labels.
CHAR_PX = 7.0

COLORS = {"added": "#4c78a8", "leased": "#72b7b2", "completed": "#54a24b", "failed": "#e45756",
          "dead": "#b279a2", "expired": "#f58518", "deleted": "#9d9da1", "taken": "#72b7b2",
          "unfinished": "#eeca3b", "p50": "#4c78a8", "p95": "#f58518", "p99": "#e45756"}
#: Heat map colours, faint to dark: the faintest still told apart from an empty (white) cell.
HEAT = ("#d4eec9", "#7fcdbb", "#2c7fb8", "#0b1f5c")
FALLBACK = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2",
            "#ff9da6", "#9d755d", "#bab0ac")


# ------------------------------------------------------------------ choices
def chart_kind(buckets: int) -> str:
    """``"bars"`` for few buckets, ``"steps"`` for many."""
    return "bars" if buckets <= BARS_UP_TO else "steps"


def spread(values: Sequence[Optional[float]]) -> float:
    """The largest value over the median of the non-zero ones (1.0 when there are none)."""
    present = [v for v in values if v is not None and not math.isnan(v) and v > 0]
    if not present:
        return 1.0
    return max(present) / median(present)


def needs_log(values: Sequence[Optional[float]]) -> bool:
    """Whether a linear axis would flatten most of ``values`` (see :data:`LOG_SPREAD`)."""
    return spread(values) > LOG_SPREAD


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 × 10^k step multiple at or above ``value``, with steps of
    about a fifth of it: a round number for the top of an axis."""
    if value <= 0:
        return 1.0
    raw = value / 5
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return math.ceil(value / step - 1e-9) * step


def headroom(peak: float, log: bool = False, integers: bool = True) -> float:
    """The top of a y axis whose tallest bar (or highest value) is ``peak``: strictly above it,
    by at least :data:`HEADROOM` of it (a round number) or, on a log axis, :data:`LOG_HEADROOM`×."""
    if peak <= 0 or math.isnan(peak):
        return 1.0
    if log:
        return peak * LOG_HEADROOM
    top = nice_ceiling(peak * (1 + HEADROOM))
    return max(top, math.floor(peak) + 1.0) if integers else top


@dataclass(frozen=True)
class Plan:
    """How a set of series is drawn: ``kind`` (bars or steps), log axis or not, the y-limit."""
    kind: str
    log: bool
    top: float
    spread: float


def plan_counts(series: Mapping[str, Sequence[float]]) -> Plan:
    """The chart of counts per bucket (every series as long as the time axis)."""
    values = [v for ys in series.values() for v in ys]
    buckets = max((len(ys) for ys in series.values()), default=0)
    log = needs_log(values)
    return Plan(chart_kind(buckets), log, headroom(max(values, default=0), log), spread(values))


def plan_times(series: Mapping[str, Sequence[Optional[float]]]) -> Plan:
    """The chart of times (seconds) per bucket: None where a bucket has none."""
    values = [v for ys in series.values() for v in ys if v is not None and not math.isnan(v)]
    buckets = max((len(ys) for ys in series.values()), default=0)
    log = needs_log(values)
    return Plan(chart_kind(buckets), log, headroom(max(values, default=0), log, integers=False),
                spread(values))


def ellipsize(text: str, limit: int = NAME_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the last an ellipsis, when it is longer."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def short_count(value: float) -> str:
    """1,234 → ``1.2k``, 2,000,000 → ``2M``: tick labels and bar values that stay narrow."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}" if value != int(value) else f"{int(value)}"


def short_seconds(value: float) -> str:
    """A time in s as ``850 µs``, ``12 ms``, ``3.5 s``, ``4 min``, ``2.1 h``."""
    if value <= 0:
        return "0"
    for size, unit in ((3600, "h"), (60, "min"), (1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value / 1e-6:.2g} µs"


# ------------------------------------------------------------------ time axis
@dataclass(frozen=True)
class Buckets:
    """The time axis: ``count`` buckets of ``width`` µs from ``first`` (µs, UTC); ``name`` is a
    bucket's width in words (``minute``, ``5 minutes``, ...)."""
    first: int
    width: int
    count: int
    name: str

    def starts(self) -> List[int]:
        return [self.first + i * self.width for i in range(self.count)]

    def label(self, i: int, previous: Optional[int] = None) -> str:
        """Bucket i's start; the date too on the first label and when the day changes."""
        when = _utc(self.first + i * self.width)
        if self.width >= 86_400_000_000:
            return f"{when:%b %d}"
        day_changed = previous is None or _utc(self.first + previous * self.width).date() != when.date()
        return f"{when:%H:%M}\n{when:%b %d}" if day_changed else f"{when:%H:%M}"


def _utc(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, timezone.utc)


def tick_positions(count: int, most: int = 9) -> List[int]:
    """Which buckets get a tick label: all of them when few, else every n-th on a round step."""
    if count <= most:
        return list(range(count))
    steps = (1, 2, 3, 5, 6, 10, 12, 15, 20, 30, 60, 120, 240, 360, 720, 1440)
    step = next((s for s in steps if math.ceil(count / s) <= most), math.ceil(count / most))
    return list(range(0, count, step))


def totals(rows: Sequence[Tuple[int, Mapping[str, int]]], buckets: Buckets,
           kinds: Sequence[str]) -> Dict[str, List[int]]:
    """``(bucket start µs, counts)`` rows (several per bucket allowed) summed into one list per
    kind over every bucket of the axis, zeros where nothing happened."""
    index = {start: i for i, start in enumerate(buckets.starts())}
    out = {kind: [0] * buckets.count for kind in kinds}
    for start, counts in rows:
        i = index.get(start)
        if i is not None:
            for kind in kinds:
                out[kind][i] += counts.get(kind, 0)
    return out


def color(name: str, index: int) -> str:
    return COLORS.get(name, FALLBACK[index % len(FALLBACK)])


# ------------------------------------------------------------------ drawing
@dataclass(frozen=True)
class Chart:
    """A drawn chart: what the page shows around it, and the chart itself (``markup``: one
    or more ``<svg class="chart">``, each followed by its data)."""
    title: str
    subtitle: str
    markup: str
    alt: str
    plan: Optional[Plan] = None


@dataclass(frozen=True)
class Box:
    """The plot area within the SVG (px of the SVG's own coordinates)."""
    left: float
    top: float
    width: float
    height: float


@dataclass(frozen=True)
class Scale:
    """A y axis: where a value goes (px from the plot's top), the ticks and their labels."""
    to_px: Callable[[float], float]
    ticks: List[float]
    label: Callable[[float], str]


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def nice_step(top: float, most: int = 6) -> float:
    """The round step (1, 2, 2.5 or 5 × 10^k) that splits 0..top into at most ``most`` parts."""
    if top <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(top / most))
    return next(m * power for m in (1, 2, 2.5, 5, 10, 20) if top / (m * power) <= most)


def linear_scale(top: float, height: float, label: Callable[[float], str],
                 integers: bool = True) -> Scale:
    step = nice_step(top)
    if integers:
        step = max(1.0, math.ceil(step))
    ticks = [k * step for k in range(int(top / step + 1e-9) + 1)]
    return Scale(lambda v: height * (1 - v / top), ticks, label)


#: symlog's linear part, 0..1, takes this share of a decade (matplotlib's linscale 0.6, base 10).
SYMLOG_LINEAR = 0.6 / 0.9


def _symlog(value: float) -> float:
    return value * SYMLOG_LINEAR if value <= 1 else SYMLOG_LINEAR + math.log10(value)


def symlog_scale(top: float, height: float) -> Scale:
    """Counts on a log axis where 0 stays 0: linear from 0 to 1, logarithmic above."""
    span = _symlog(top)
    ticks = [0.0] + [10.0 ** k for k in range(0, int(math.log10(top)) + 1)]
    return Scale(lambda v: height * (1 - _symlog(max(v, 0.0)) / span), ticks, short_count)


#: Ticks of a log axis of seconds: round durations.
TIME_TICKS = (1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10, 60, 600, 3600, 36000, 86400)


def log_scale(low: float, high: float, height: float) -> Scale:
    lo, hi = math.log10(low), math.log10(high)
    return Scale(lambda v: height * (1 - (math.log10(v) - lo) / (hi - lo)),
                 [t for t in TIME_TICKS if low <= t <= high], short_seconds)


def _attrs(**values: object) -> str:
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{html.escape(str(v))}"'
                   for k, v in values.items() if v is not None)


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "",
          **extra: object) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        body = html.escape(text)
    else:
        body = "".join(f'<tspan x="{_num(x)}" dy="{0 if i == 0 else "1.15em"}">{html.escape(line)}</tspan>'
                       for i, line in enumerate(lines))
    return (f'<text{_attrs(x=_num(x), y=_num(y), text_anchor=anchor, class_=cls or None, **extra)}>'
            f"{body}</text>")


def _data(payload: Mapping[str, Any]) -> str:
    """A chart's data for the page's script; ``</`` escaped so no value can end the element."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" class="chart-data">{text}</script>'


def _legend(names: Sequence[Tuple[str, str]], right: float, y: float) -> str:
    """Coloured squares and names, right-aligned ending at ``right``."""
    parts, x = [], right
    for name, tint in reversed(names):
        x -= len(name) * CHAR_PX
        parts.append(_text(x, y, name, "start", "legend"))
        parts.append(f'<rect{_attrs(x=_num(x - 15), y=_num(y - 10), width=10, height=10, fill=tint)}></rect>')
        x -= 15 + 18
    return "".join(parts)


def _y_axis(scale: Scale, box: Box, title: str) -> str:
    parts = []
    for tick in scale.ticks:
        y = box.top + scale.to_px(tick)
        parts.append(f'<line class="grid"{_attrs(x1=_num(box.left), x2=_num(box.left + box.width), y1=_num(y), y2=_num(y))}></line>')
        parts.append(_text(box.left - 6, y + 4, scale.label(tick), "end", "tick"))
    x, y = 14, box.top + box.height / 2
    parts.append(_text(x, y, title, "middle", "axis", transform=f"rotate(-90 {x} {_num(y)})"))
    return "".join(parts)


def _x_ticks(buckets: Buckets, box: Box, centred: bool) -> str:
    """The time axis' labels (the page's script redraws them for a zoomed range)."""
    ticks = tick_positions(buckets.count)
    offset = 0.5 if centred else 0.0
    parts = []
    for k, i in enumerate(ticks):
        x = box.left + (i + offset) * box.width / buckets.count
        parts.append(_text(x, box.top + box.height + 16, buckets.label(i, ticks[k - 1] if k else None),
                           "middle", "tick xt"))
    return f'<g class="xticks">{"".join(parts)}</g>'


def _time_payload(buckets: Buckets, centred: bool, fmt: str) -> Dict[str, Any]:
    return {"axis": "time", "first": buckets.first // 1000, "width": buckets.width // 1000,
            "count": buckets.count, "centred": centred, "format": fmt, "bucket": buckets.name}


def _svg(height: float, alt: str, inner: str, data: Mapping[str, Any], box: Box, plot: str,
         plot_width: float, outer_after: str = "") -> str:
    """The chart's ``<svg>``: axes and legend, the plot area as a nested ``<svg>`` whose own
    coordinates are ``plot_width`` wide (buckets, for a time chart), and the data after it."""
    area = (f'<svg class="area" x="{_num(box.left)}" y="{_num(box.top)}" width="{_num(box.width)}" '
            f'height="{_num(box.height)}" viewBox="0 0 {_num(plot_width)} {_num(box.height)}" '
            f'preserveAspectRatio="none"><rect class="bg" x="0" y="0" width="{_num(plot_width)}" '
            f'height="{_num(box.height)}"></rect>{plot}'
            f'<rect class="hover" x="0" y="0" width="0" height="{_num(box.height)}"></rect>'
            f'<rect class="select" x="0" y="0" width="0" height="{_num(box.height)}"></rect></svg>')
    return (f'<svg class="chart" viewBox="0 0 {WIDTH} {_num(height)}" role="img" '
            f'aria-label="{html.escape(alt)}">{inner}{area}{outer_after}</svg>{_data(data)}')


def _scale_note(plan: Plan, what: str) -> str:
    if not plan.log:
        return ""
    return (f"Log scale: the busiest {what} is {plan.spread:,.0f}× the median one, "
            "which a linear scale would flatten to nothing.")


COUNTS_HEIGHT = 300


def _time_box(height: float) -> Box:
    return Box(68, 30, WIDTH - 68 - 16, height - 30 - 50)


def counts_chart(title: str, buckets: Buckets, series: Mapping[str, Sequence[int]],
                 unit: str, subtitle: str = "", stacked: bool = False) -> Chart:
    """Counts per bucket, one series per name (each ``buckets.count`` long, zeros included):
    bars or steps, linear or symlog (see :func:`plan_counts`). ``stacked``: the series are
    parts of one whole, drawn on top of each other while the scale is linear (on a log scale
    a band's height would mean nothing, so they are drawn side by side there too)."""
    plan = plan_counts({"all": [sum(v) for v in zip(*series.values())]} if stacked else series)
    stack = stacked and not plan.log
    names = list(series)
    box = _time_box(COUNTS_HEIGHT)
    scale = (symlog_scale(plan.top, box.height) if plan.log
             else linear_scale(plan.top, box.height, short_count))
    y = scale.to_px
    plot: List[str] = []
    labels: List[str] = []
    base = [0] * buckets.count
    if plan.kind == "bars":
        width = 0.8 if stack else 0.8 / max(1, len(names))
        for k, name in enumerate(names):
            ys = list(series[name])
            rects = []
            for i, v in enumerate(ys):
                if not v:
                    continue
                x = i + 0.1 + (0 if stack else k * width)
                bottom = base[i] if stack else 0
                top_px, bottom_px = y(bottom + v), y(bottom)
                rects.append(f'<rect x="{_num(x)}" y="{_num(top_px)}" width="{_num(width * 0.92)}" '
                             f'height="{_num(bottom_px - top_px)}"></rect>')
                if not stack and buckets.count * len(names) <= LABELLED_BARS:
                    labels.append(_bar_label(box, buckets.count, x + width * 0.46, top_px, v))
            plot.append(f'<g fill="{color(name, k)}">{"".join(rects)}</g>')
            if stack:
                base = [b + v for b, v in zip(base, ys)]
        if stack and buckets.count <= LABELLED_BARS:   # the total on top of each stack
            labels += [_bar_label(box, buckets.count, i + 0.5, y(total), total)
                       for i, total in enumerate(base) if total]
    else:
        for k, name in enumerate(names):
            ys = list(series[name])
            if stack:
                top = [b + v for b, v in zip(base, ys)]
                plot.append(f'<path class="band" fill="{color(name, k)}" d="{_band(top, base, y)}"></path>')
                base = top
            else:
                plot.append(f'<path class="line" stroke="{color(name, k)}" d="{_steps(ys, y)}"></path>')
    inner = _y_axis(scale, box, f"{unit} per {buckets.name}" + (" (log)" if plan.log else ""))
    inner += _x_ticks(buckets, box, plan.kind == "bars")
    inner += _text(box.left + box.width, COUNTS_HEIGHT - 6, f"UTC, per {buckets.name}", "end", "axis")
    if len(names) > 1 or stacked:
        inner += _legend([(n, color(n, k)) for k, n in enumerate(names)], WIDTH - 16, 16)
    data = {**_time_payload(buckets, plan.kind == "bars", "count"), "unit": unit,
            "series": [{"name": n, "color": color(n, k), "values": list(series[n])}
                       for k, n in enumerate(names)]}
    words = " ".join(part for part in (subtitle, _scale_note(plan, buckets.name)) if part)
    alt = f"{title}: " + ", ".join(f"{n} {sum(series[n]):,}" for n in names)
    markup = _svg(COUNTS_HEIGHT, alt, inner, data, box, "".join(plot), buckets.count,
                  f'<g class="labels">{"".join(labels)}</g>')
    return Chart(title, words, markup, alt, plan)


def _bar_label(box: Box, count: int, bucket_x: float, top_px: float, value: float) -> str:
    """A bar's value over it, placed in the outer SVG (text in the stretched plot would be
    distorted); ``data-bx`` is its place in buckets, for the script to move it when zoomed."""
    x = box.left + bucket_x * box.width / count
    return _text(x, box.top + top_px - 4, short_count(value), "middle", "value", data_bx=_num(bucket_x))


def _steps(values: Sequence[Optional[float]], y: Callable[[float], float]) -> str:
    """A step path in bucket coordinates: each value flat over its bucket; a None is a gap."""
    parts: List[str] = []
    drawing = False
    for i, v in enumerate(values):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            drawing = False
            continue
        py = _num(y(v))
        parts.append(f"L{i},{py}H{i + 1}" if drawing else f"M{i},{py}H{i + 1}")
        drawing = True
    return "".join(parts)


def _band(top: Sequence[float], base: Sequence[float], y: Callable[[float], float]) -> str:
    """A filled step band between ``base`` and ``top``, in bucket coordinates."""
    upper = "".join(f"L{i},{_num(y(v))}H{i + 1}" for i, v in enumerate(top))
    lower = "".join(f"L{i + 1},{_num(y(v))}H{i}" for i, v in reversed(list(enumerate(base))))
    return "M0," + _num(y(base[0] if base else 0)) + upper + lower + "Z"


TIMES_HEIGHT = 280


def times_chart(title: str, buckets: Buckets,
                panels: Mapping[str, Mapping[str, Sequence[Optional[float]]]],
                subtitle: str = "", titles: Optional[Mapping[str, str]] = None) -> Chart:
    """Times (seconds) per bucket, one panel per mapping entry (e.g. wait, run), one series per
    percentile: each bucket's value a flat run over its interval, buckets without one left blank
    (with few buckets, a separate run per bucket; with many, steps). Each panel is linear or log
    on its own (see :func:`plan_times`); ``titles`` names the panels. The panels share the time
    axis: zooming one zooms them all."""
    notes, markup = [], []
    for panel, series in panels.items():
        plan = plan_times(series)
        box = _time_box(TIMES_HEIGHT)
        present = [v for ys in series.values() for v in ys if v is not None and v > 0]
        if plan.log and present:
            scale = log_scale(min(present) / 2, plan.top * 2, box.height)
            notes.append(panel)
        else:
            scale = linear_scale(plan.top * 1.12, box.height, short_seconds, integers=False)
        plot = []
        names = list(series)
        for k, (name, ys) in enumerate(series.items()):
            dashed = k == len(names) - 1 and k > 0    # the last (p99) dashed: where it equals p95 both show
            cls = "line dashed" if dashed else "line"
            if plan.kind == "bars":   # few buckets: a separate run per bucket, never joined
                d = "".join(f"M{i + 0.08},{_num(scale.to_px(v))}H{i + 0.92}"
                            for i, v in enumerate(ys) if v is not None)
                cls += " runs"
            else:
                d = _steps(ys, scale.to_px)
            plot.append(f'<path class="{cls}" stroke="{color(name, k)}" d="{d}"></path>')
        inner = _y_axis(scale, box, "seconds" + (" (log)" if plan.log else ""))
        inner += _x_ticks(buckets, box, plan.kind == "bars")
        inner += _text(box.left, 18, (titles or {}).get(panel, panel), "start", "panel-title")
        inner += _legend([(n, color(n, k)) for k, n in enumerate(names)], WIDTH - 16, 16)
        data = {**_time_payload(buckets, plan.kind == "bars", "seconds"), "panel": panel,
                "series": [{"name": n, "color": color(n, k), "values": list(series[n])}
                           for k, n in enumerate(names)]}
        alt = f"{title}, {(titles or {}).get(panel, panel)}"
        markup.append(_svg(TIMES_HEIGHT, alt, inner, data, box, "".join(plot), buckets.count))
    if notes:
        subtitle += (f" Log scale for {' and '.join(notes)} times: the highest is more than "
                     f"{LOG_SPREAD:g}× the median.")
    return Chart(title, subtitle.strip(), "".join(markup), title)


ROW_PX = 26


def _name_margin(names: Sequence[str]) -> float:
    return min(NAME_CHARS, max((len(ellipsize(n)) for n in names), default=4)) * CHAR_PX + 16


def queues_chart(title: str, rows: Sequence[Tuple[str, Mapping[str, int]]],
                 subtitle: str = "") -> Chart:
    """One horizontal bar per queue (in the order given, first on top), stacked by outcome,
    with its total written after it; long names ellipsized (in full when hovered)."""
    outcomes: List[str] = []
    for _, counts in rows:
        outcomes += [o for o, n in counts.items() if n and o not in outcomes]
    left = _name_margin([name for name, _ in rows])
    height = 30 + 36 + ROW_PX * max(1, len(rows))
    box = Box(left, 30, WIDTH - left - 70, ROW_PX * max(1, len(rows)))
    totals_ = [sum(counts.values()) for _, counts in rows]
    top = headroom(max(totals_, default=0))
    ticks = linear_scale(top, box.width, short_count).ticks

    def x_of(value: float) -> float:
        return box.width * value / top
    plot, inner = [], []
    for r, (name, counts) in enumerate(rows):
        y, start = r * ROW_PX + 4, 0
        for k, outcome in enumerate(outcomes):
            n = counts.get(outcome, 0)
            if n:
                plot.append(f'<rect x="{_num(x_of(start))}" y="{y}" width="{_num(x_of(start + n) - x_of(start))}" '
                            f'height="{ROW_PX - 8}" fill="{color(outcome, k)}"></rect>')
                start += n
        inner.append(_text(left - 8, box.top + y + ROW_PX / 2 + 1, ellipsize(name), "end", "name"))
        inner.append(_text(box.left + x_of(start) + 4, box.top + y + ROW_PX / 2 + 1, f"{start:,}",
                           "start", "value"))
    for tick in ticks:
        x = box.left + x_of(tick)
        inner.append(f'<line class="grid"{_attrs(x1=_num(x), x2=_num(x), y1=_num(box.top), y2=_num(box.top + box.height))}></line>')
        inner.append(_text(x, box.top + box.height + 16, short_count(tick), "middle", "tick"))
    inner.append(_text(box.left + box.width, height - 6, "jobs", "end", "axis"))
    if outcomes:
        inner.append(_legend([(o, color(o, k)) for k, o in enumerate(outcomes)], WIDTH - 16, 16))
    alt = f"{title}: " + ", ".join(f"{name} {sum(c.values()):,}" for name, c in rows)
    data = {"axis": "rows", "format": "count", "unit": "jobs",
            "rows": [{"name": name, "counts": {o: counts.get(o, 0) for o in outcomes}}
                     for name, counts in rows]}
    markup = _svg(height, alt, "".join(inner), data, box, "".join(plot), box.width)
    return Chart(title, subtitle, markup, alt)


def heat_color(value: float, peak: float, log: bool) -> str:
    """The cell colour of ``value`` on a scale whose darkest is ``peak`` (log or linear)."""
    if log:
        share = math.log10(max(value, 1)) / math.log10(max(peak, 2))
    else:
        share = value / max(peak, 1)
    share = min(1.0, max(0.0, share)) * (len(HEAT) - 1)
    k = min(int(share), len(HEAT) - 2)
    a, b = HEAT[k], HEAT[k + 1]
    t = share - k
    mix = [round(int(a[i:i + 2], 16) * (1 - t) + int(b[i:i + 2], 16) * t) for i in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def heatmap_chart(title: str, buckets: Buckets, rows: Sequence[Tuple[str, Sequence[int]]],
                  unit: str, subtitle: str = "") -> Chart:
    """One row per queue (in the order given, first on top), one cell per bucket, its colour the
    count; an empty cell stays white. Queues of very different sizes share one chart without
    the small ones vanishing: each is a row of its own, and the colour scale is logarithmic
    when the busiest cell is more than :data:`LOG_SPREAD` times the median non-empty one."""
    values = [v for _, ys in rows for v in ys]
    log = needs_log(values)
    peak = max(values, default=0)
    left = _name_margin([name for name, _ in rows])
    height = 30 + 50 + ROW_PX * max(1, len(rows))
    box = Box(left, 30, WIDTH - left - 16, ROW_PX * max(1, len(rows)))
    cells = []
    for r, (_, ys) in enumerate(rows):
        for i, v in enumerate(ys):
            if v:
                cells.append(f'<rect x="{i}" y="{r * ROW_PX}" width="1" height="{ROW_PX}" '
                             f'fill="{heat_color(v, peak, log)}"></rect>')
    inner = [_text(left - 8, box.top + r * ROW_PX + ROW_PX / 2 + 4, ellipsize(name), "end", "name")
             for r, (name, _) in enumerate(rows)]
    inner.append(_x_ticks(buckets, box, chart_kind(buckets.count) == "bars"))
    inner.append(_text(box.left + box.width, height - 6, f"UTC, per {buckets.name}", "end", "axis"))
    steps = [0.0, 0.25, 0.5, 0.75, 1.0]
    scale_marks = [(10 ** (s * math.log10(max(peak, 2))) if log else s * max(peak, 1)) for s in steps]
    x = WIDTH - 16 - 5 * 26
    inner.append(_text(x - 6, 18, f"{unit}{' (log)' if log else ''}", "end", "legend"))
    for k, mark in enumerate(scale_marks):
        inner.append(f'<rect x="{x + k * 26}" y="8" width="26" height="12" '
                     f'fill="{heat_color(mark, peak, log)}"></rect>')
    inner.append(_text(x, 30 - 1, "1" if log else "0", "middle", "tick"))
    inner.append(_text(x + 5 * 26, 30 - 1, short_count(max(peak, 1)), "middle", "tick"))
    note = (f" Log colour scale: the busiest cell is {spread(values):,.0f}× the median one."
            if log else "")
    alt = f"{title}: " + ", ".join(f"{name} {sum(ys):,}" for name, ys in rows)
    data = {**_time_payload(buckets, chart_kind(buckets.count) == "bars", "count"), "kind": "heat",
            "unit": unit, "rows": [{"name": name, "values": list(ys)} for name, ys in rows]}
    markup = _svg(height, alt, "".join(inner), data, box, "".join(cells), buckets.count)
    return Chart(title, (subtitle + note).strip(), markup, alt)
