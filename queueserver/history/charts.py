"""The report's charts: which kind of chart the data asks for, and drawing it.

Nothing here touches Spark: the report (:mod:`.report`) hands over plain
lists (one value per time bucket, oldest first) and gets back a
:class:`Chart` (title, subtitle, an inline PNG). The choices are pure
functions on those lists, tested on their own (tests/test_history_charts.py):

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
  (:data:`NAME_CHARS`).

The figures are drawn with matplotlib's Agg canvas (no display, no pyplot
state) at a fixed size with a constrained layout, so every label and legend
is inside the image; the image is a PNG in a ``data:`` URI. PNG rather than
inline SVG: its size depends on the pixels, not on the number of buckets
and queues drawn (an SVG of 240 buckets × 9 series is thousands of
elements, with matplotlib's glyphs as paths), it looks the same in every
browser and mail client (no font of the reader's involved), and it scales
down with the page (``max-width: 100%``) at a resolution that stays sharp
on a 2× screen.
"""
from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from statistics import median
from typing import ContextManager, Dict, List, Mapping, Optional, Sequence, Tuple

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LinearSegmentedColormap, LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

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
#: Text a little larger than matplotlib's default (10 pt): the image is shown scaled down.
FONT_SIZE = 11
WIDTH_IN, DPI = 10.0, 144   # 1440 px wide, shown at up to 1100 CSS px: sharp on a 2x screen

COLORS = {"added": "#4c78a8", "leased": "#72b7b2", "completed": "#54a24b", "failed": "#e45756",
          "dead": "#b279a2", "expired": "#f58518", "deleted": "#9d9da1", "taken": "#72b7b2",
          "unfinished": "#eeca3b", "p50": "#4c78a8", "p95": "#f58518", "p99": "#e45756"}
#: Heat map colours: the faintest still told apart from an empty (white) cell.
HEAT = LinearSegmentedColormap.from_list("load", ["#d4eec9", "#7fcdbb", "#2c7fb8", "#0b1f5c"])
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


def _time_axis(ax: Axes, buckets: Buckets, centred: bool) -> None:
    ticks = tick_positions(buckets.count)
    labels = [buckets.label(i, ticks[k - 1] if k else None) for k, i in enumerate(ticks)]
    offset = 0.5 if centred else 0.0
    ax.xaxis.set_major_locator(FixedLocator([i + offset for i in ticks]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, pos: labels[pos] if pos is not None
                                               and pos < len(labels) else ""))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(0, buckets.count)
    ax.set_xlabel(f"UTC, per {buckets.name}", fontsize="small", color="#555")


# ------------------------------------------------------------------ drawing
@dataclass(frozen=True)
class Chart:
    """A drawn chart: what the page shows around it, and the image."""
    title: str
    subtitle: str
    src: str          # data:image/png;base64,...
    alt: str
    plan: Optional[Plan] = None


def _fonts() -> ContextManager[None]:
    """matplotlib's settings while one chart is drawn (its global ones are left alone)."""
    return rc_context({"font.size": FONT_SIZE, "font.family": "DejaVu Sans"})


def _figure(height: float, columns: int = 1) -> Tuple[Figure, List[Axes]]:
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, columns, squeeze=False)[0]
    for ax in axes:
        _style(ax)
    return fig, list(axes)


def _style(ax: Axes) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color("#999")
    ax.tick_params(colors="#444", labelsize="small")
    ax.grid(True, axis="y", color="#e4e4e4", linewidth=0.8)
    ax.set_axisbelow(True)


def png(fig: Figure) -> str:
    """The figure as a ``data:`` URI (no metadata: the same input gives the same bytes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, facecolor="white")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def color(name: str, index: int) -> str:
    return COLORS.get(name, FALLBACK[index % len(FALLBACK)])


def _count_axis(ax: Axes, plan: Plan) -> None:
    if plan.log:
        ax.set_yscale("symlog", linthresh=1, linscale=0.6)
        ax.yaxis.set_major_locator(FixedLocator(
            [0] + [10.0 ** k for k in range(0, int(math.log10(plan.top)) + 1)]))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, pos: short_count(v)))
    ax.set_ylim(0, plan.top)


def _scale_note(plan: Plan, what: str) -> str:
    if not plan.log:
        return ""
    return (f"Log scale: the busiest {what} is {plan.spread:,.0f}× the median one, "
            "which a linear scale would flatten to nothing.")


def counts_chart(title: str, buckets: Buckets, series: Mapping[str, Sequence[int]],
                 unit: str, subtitle: str = "", stacked: bool = False) -> Chart:
    """Counts per bucket, one series per name (each ``buckets.count`` long, zeros included):
    bars or steps, linear or symlog (see :func:`plan_counts`). ``stacked``: the series are
    parts of one whole, drawn on top of each other while the scale is linear (on a log scale
    a band's height would mean nothing, so they are drawn side by side there too)."""
    plan = plan_counts({"all": [sum(v) for v in zip(*series.values())]} if stacked else series)
    stack = stacked and not plan.log
    names = list(series)
    with _fonts():
        fig, (ax,) = _figure(3.1)
        base = [0] * buckets.count
        if plan.kind == "bars":
            width = 0.8 if stack else 0.8 / max(1, len(names))
            for k, name in enumerate(names):
                ys = list(series[name])
                xs = [i + 0.1 + (0 if stack else k * width) for i in range(buckets.count)]
                bars = ax.bar(xs, ys, width=width * 0.92, align="edge", bottom=base if stack else 0,
                              color=color(name, k), label=name if any(ys) else None)
                if buckets.count * len(names) <= LABELLED_BARS and not stack:
                    ax.bar_label(bars, labels=[short_count(v) if v else "" for v in ys],
                                 padding=2, fontsize="small", color="#333")
                if stack:
                    base = [b + y for b, y in zip(base, ys)]
            if stack and buckets.count <= LABELLED_BARS:   # the total on top of each stack
                for i, total in enumerate(base):
                    if total:
                        ax.annotate(short_count(total), (i + 0.5, total), xytext=(0, 2),
                                    textcoords="offset points", ha="center", va="bottom",
                                    fontsize="small", color="#333")
        else:
            edges = list(range(buckets.count + 1))
            for k, name in enumerate(names):
                ys = list(series[name])
                label = name if any(ys) else None
                if stack:
                    top = [b + y for b, y in zip(base, ys)]
                    ax.stairs(top, edges, baseline=base, fill=True, color=color(name, k),
                              label=label, linewidth=0)
                    base = top
                else:
                    ax.stairs(ys, edges, baseline=0, color=color(name, k), label=label,
                              linewidth=1.3)
        _count_axis(ax, plan)
        _time_axis(ax, buckets, centred=plan.kind == "bars")
        ax.set_ylabel(f"{unit} per {buckets.name}" + (" (log)" if plan.log else ""),
                      fontsize="small", color="#555")
        if len(names) > 1 or stacked:
            fig.legend(loc="outside upper right", ncols=len(names), frameon=False,
                       fontsize="small")
        src = png(fig)
    words = " ".join(part for part in (subtitle, _scale_note(plan, buckets.name)) if part)
    alt = f"{title}: " + ", ".join(f"{n} {sum(series[n]):,}" for n in names)
    return Chart(title, words, src, alt, plan)


#: Ticks of a log axis of seconds: round durations.
TIME_TICKS = (1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10, 60, 600, 3600, 36000, 86400)


def times_chart(title: str, buckets: Buckets,
                panels: Mapping[str, Mapping[str, Sequence[Optional[float]]]],
                subtitle: str = "", titles: Optional[Mapping[str, str]] = None) -> Chart:
    """Times (seconds) per bucket, one panel per mapping entry (e.g. wait, run), one series per
    percentile: each bucket's value a flat run over its interval, buckets without one left blank
    (with few buckets, a separate run and a dot per bucket; with many, steps). Each panel is
    linear or log on its own (see :func:`plan_times`); ``titles`` names the panels."""
    notes = []
    with _fonts():
        fig, axes = _figure(3.1, len(panels))
        for ax, (panel, series) in zip(axes, panels.items()):
            plan = plan_times(series)
            edges = list(range(buckets.count + 1))
            for k, (name, ys) in enumerate(series.items()):
                values = [math.nan if v is None else v for v in ys]
                # the last (p99) dashed: where it equals p95 both stay visible
                tint, dashes = color(name, k), (0, (3, 2)) if k == len(series) - 1 and k else "solid"
                if plan.kind == "bars":   # few buckets: a separate run and a dot per bucket
                    ax.hlines(values, [i + 0.08 for i in range(buckets.count)],
                              [i + 0.92 for i in range(buckets.count)], label=name, color=tint,
                              linewidth=1.6, linestyle=dashes)
                    ax.plot([i + 0.5 for i in range(buckets.count)], values, linestyle="none",
                            marker="o", markersize=4, color=tint)
                else:
                    ax.stairs(values, edges, baseline=None, label=name, color=tint,
                              linewidth=1.4, linestyle=dashes)
            if plan.log:
                present = [v for ys in series.values() for v in ys if v is not None and v > 0]
                low, high = min(present) / 2, plan.top * 2
                ax.set_yscale("log")
                ax.set_ylim(low, high)
                ax.yaxis.set_major_locator(FixedLocator([t for t in TIME_TICKS if low <= t <= high]))
                ax.yaxis.set_minor_locator(NullLocator())
                notes.append(panel)
            else:
                ax.set_ylim(0, plan.top * 1.12)    # room for the legend too
                ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, pos: short_seconds(v)))
            ax.set_title((titles or {}).get(panel, panel), fontsize="medium", loc="left",
                         color="#333")
            _time_axis(ax, buckets, centred=plan.kind == "bars")
        names = list(next(iter(panels.values()), {}))
        if names:
            fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper right",
                       ncols=len(names), frameon=False, fontsize="small")
        src = png(fig)
    if notes:
        subtitle += (f" Log scale for {' and '.join(notes)} times: the highest is more than "
                     f"{LOG_SPREAD:g}× the median.")
    return Chart(title, subtitle.strip(), src, title)


def queues_chart(title: str, rows: Sequence[Tuple[str, Mapping[str, int]]],
                 subtitle: str = "") -> Chart:
    """One horizontal bar per queue (in the order given, first on top), stacked by outcome,
    with its total written after it; long names ellipsized."""
    outcomes: List[str] = []
    for _, counts in rows:
        outcomes += [o for o, n in counts.items() if n and o not in outcomes]
    with _fonts():
        fig, (ax,) = _figure(0.9 + 0.3 * max(1, len(rows)))
        _queue_bars(ax, rows, outcomes)
        if outcomes:
            fig.legend(loc="outside upper right", ncols=min(len(outcomes), 7), frameon=False,
                       fontsize="small")
        src = png(fig)
    alt = f"{title}: " + ", ".join(f"{name} {sum(c.values()):,}" for name, c in rows)
    return Chart(title, subtitle, src, alt)


def _queue_bars(ax: Axes, rows: Sequence[Tuple[str, Mapping[str, int]]],
                outcomes: Sequence[str]) -> None:
    names = [ellipsize(name) for name, _ in rows]
    ys = list(range(len(rows)))[::-1]
    left = [0] * len(rows)
    for k, outcome in enumerate(outcomes):
        widths = [counts.get(outcome, 0) for _, counts in rows]
        ax.barh(ys, widths, left=left, height=0.68, color=color(outcome, k), label=outcome)
        left = [a + b for a, b in zip(left, widths)]
    peak = max(left, default=0)
    for y, total in zip(ys, left):
        ax.annotate(f"{total:,}", (total, y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize="x-small", color="#333")
    ax.set_yticks(ys, names)
    ax.set_xlim(0, headroom(peak * 1.08))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, pos: short_count(v)))
    ax.grid(False, axis="y")
    ax.grid(True, axis="x", color="#e4e4e4", linewidth=0.8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("jobs", fontsize="small", color="#555")


def heatmap_chart(title: str, buckets: Buckets, rows: Sequence[Tuple[str, Sequence[int]]],
                  unit: str, subtitle: str = "") -> Chart:
    """One row per queue (in the order given, first on top), one cell per bucket, its colour the
    count; an empty cell stays white. Queues of very different sizes share one chart without
    the small ones vanishing: each is a row of its own, and the colour scale is logarithmic
    when the busiest cell is more than :data:`LOG_SPREAD` times the median non-empty one."""
    values = [v for _, ys in rows for v in ys]
    log = needs_log(values)
    peak = max(values, default=0)
    with _fonts():
        fig, (ax,) = _figure(max(2.0, 1.0 + 0.28 * len(rows)))
        grid = [[math.nan if not v else float(v) for v in ys] for _, ys in rows]
        norm = LogNorm(vmin=1, vmax=max(peak, 2)) if log else Normalize(vmin=0, vmax=max(peak, 1))
        mesh = ax.pcolormesh(list(range(buckets.count + 1)), list(range(max(1, len(rows)) + 1)),
                             grid[::-1] if grid else [[math.nan] * buckets.count],
                             cmap=HEAT, norm=norm, shading="flat")
        ax.set_yticks([i + 0.5 for i in range(len(rows))][::-1],
                      [ellipsize(name) for name, _ in rows])
        ax.tick_params(axis="y", length=0)
        ax.grid(False)
        for side in ("left", "bottom"):
            ax.spines[side].set_visible(False)
        _time_axis(ax, buckets, centred=chart_kind(buckets.count) == "bars")
        bar = fig.colorbar(mesh, ax=ax, pad=0.01, fraction=0.03, aspect=15)
        bar.ax.set_title(unit, fontsize="x-small", color="#555", loc="left")
        if log:
            bar.ax.yaxis.set_major_locator(FixedLocator(
                [10.0 ** k for k in range(0, int(math.log10(max(peak, 2))) + 1)]))
            bar.ax.yaxis.set_minor_locator(NullLocator())
        else:
            bar.ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, pos: short_count(v)))
        bar.ax.tick_params(labelsize="x-small")
        bar.outline.set_visible(False)
        src = png(fig)
    note = (f" Log colour scale: the busiest cell is {spread(values):,.0f}× the median one."
            if log else "")
    alt = f"{title}: " + ", ".join(f"{name} {sum(ys):,}" for name, ys in rows)
    return Chart(title, (subtitle + note).strip(), src, alt)


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
