"""``report.html``: one self-contained page (charts as inline PNG, no external resources).

Spark aggregates the series into at most a few hundred time buckets; the
driver only draws them, with matplotlib's Agg canvas (no display, no
pyplot state).
"""
from __future__ import annotations

import base64
import html
import io
import math
from datetime import datetime, timezone
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from .state import MINUTE_US
from .summary import OUTCOMES, QueueStats, Summary
from .tables import PERCENTILES

BUCKETS = [(1, "minute"), (5, "5 minutes"), (15, "15 minutes"), (60, "hour"), (360, "6 hours"),
           (1440, "day"), (10080, "week")]
MAX_POINTS = 240
TOP_QUEUES = 8
STUCK_ROWS = 100


def bucket_for(first: int, last: int) -> Tuple[int, str]:
    """The smallest bucket (µs, name) that draws ``first..last`` in at most MAX_POINTS points."""
    for minutes, name in BUCKETS:
        if (last - first) // (minutes * MINUTE_US) < MAX_POINTS:
            return minutes * MINUTE_US, name
    minutes, name = BUCKETS[-1]
    return minutes * MINUTE_US, name


def _bucket(name: str, width: int) -> Column:
    return (F.col(name) - F.pmod(name, F.lit(width))).alias("bucket")


def _when(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, timezone.utc)


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    return ('<img alt="chart" src="data:image/png;base64,'
            + base64.b64encode(buf.getvalue()).decode("ascii") + '">')


def _time_axis(ax: Axes, label: bool = True) -> None:
    # matplotlib.dates is not annotated (no stub either): its classes' constructors are untyped
    locator = AutoDateLocator(tz=timezone.utc)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    formatter = ConciseDateFormatter(locator, tz=timezone.utc)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(formatter)
    if label:
        ax.set_xlabel("UTC")
    ax.grid(True, alpha=0.3)


def _buckets(first: int, last: int, width: int) -> List[int]:
    """Every bucket from the one holding ``first`` to the one holding ``last``: a time without
    events is drawn as 0 (counts) or a gap (percentiles), not bridged by a line."""
    return list(range(first - first % width, last - last % width + 1, width))


def _minute_series(minutes: DataFrame, width: int) -> List[Row]:
    """Per queue and bucket: the sums the throughput and failure charts draw."""
    kinds = ("added", "completed", "failed", "dead", "expired")
    return (minutes.groupBy("queue", _bucket("minute", width))
            .agg(*[F.sum(k).alias(k) for k in kinds]).orderBy("bucket").collect())


def _throughput(rows: List[Row], buckets: List[int], label: str) -> str:
    volume: Dict[str, int] = {}
    for r in rows:
        volume[r.queue] = volume.get(r.queue, 0) + r.added + r.completed
    top = sorted(volume, key=lambda q: (-volume[q], q))[:TOP_QUEUES]
    series: Dict[str, Dict[str, Dict[int, int]]] = {"added": {}, "completed": {}}
    for r in rows:
        queue = r.queue if r.queue in top else "(other queues)"
        for kind in series:
            points = series[kind].setdefault(queue, {})
            points[r.bucket] = points.get(r.bucket, 0) + r[kind]
    fig = Figure(figsize=(11, 6.5))
    xs = [_when(b) for b in buckets]
    for ax, kind in zip(fig.subplots(2, 1, sharex=True), series):
        for queue, points in sorted(series[kind].items()):
            ax.plot(xs, [points.get(b, 0) for b in buckets], label=queue)
        ax.set_ylabel(f"{kind} per {label}")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        _time_axis(ax, kind == "completed")
    fig.axes[0].legend(loc="upper left", fontsize="small", ncols=3)
    fig.axes[0].set_title("Throughput per queue")
    return _png(fig)


def _latency(jobs: DataFrame, buckets: List[int], width: int, label: str) -> str:
    rows = (jobs.where(F.col("finished").isNotNull())
            .groupBy(_bucket("finished", width))
            .agg(F.percentile_approx("wait_seconds", list(PERCENTILES)).alias("wait"),
                 F.percentile_approx("run_seconds", list(PERCENTILES)).alias("run"))
            .orderBy("bucket").collect())
    fig = Figure(figsize=(11, 6.5))
    xs = [_when(b) for b in buckets]
    for ax, kind in zip(fig.subplots(2, 1, sharex=True), ("wait", "run")):
        values = {r.bucket: r[kind] for r in rows if r[kind] is not None}
        for i, p in enumerate(PERCENTILES):
            ys = [values[b][i] if b in values and values[b][i] is not None else math.nan
                  for b in buckets]
            ax.plot(xs, ys, marker=".", label=f"p{round(p * 100)}")
        ax.set_ylabel(f"{kind} time (s)")
        ax.legend(loc="upper left", fontsize="small")
        _time_axis(ax, kind == "run")
    fig.axes[0].set_title(f"Wait (added to first lease) and run (last lease to end) times, "
                          f"all queues, jobs finished per {label}")
    return _png(fig)


def _failures(rows: List[Row], width: int, label: str) -> str:
    kinds = ("failed", "dead", "expired")
    totals: Dict[int, Dict[str, int]] = {}
    for r in rows:
        bucket = totals.setdefault(r.bucket, dict.fromkeys(kinds, 0))
        for kind in kinds:
            bucket[kind] += r[kind]
    fig = Figure(figsize=(11, 3.5))
    ax = fig.subplots()
    xs = sorted(totals)
    bottom = [0] * len(xs)
    bar_width = width / MINUTE_US / 1440 * 0.9     # in days, as matplotlib's dates count
    days = [_when(x) for x in xs]
    for kind in kinds:
        ys = [totals[x][kind] for x in xs]
        # matplotlib's annotations take no datetimes for x; its date converter does (as for plot)
        ax.bar(days, ys, width=bar_width, bottom=bottom, label=kind, align="edge")  # type: ignore[arg-type]
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_ylabel(f"jobs per {label}")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Failures (failed, dead) and expiries, all queues")
    ax.legend(loc="upper left", fontsize="small")
    _time_axis(ax)
    return _png(fig)


def _seconds(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.3g}"


def _table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _queue_table(queues: List[QueueStats]) -> str:
    head = (["queue", "jobs"] + list(OUTCOMES) + ["unfinished", "stale", "bad share"]
            + [f"{k} p{round(p * 100)} (s)" for k in ("wait", "run") for p in PERCENTILES])
    return _table(head, ([q.queue, f"{q.jobs:,}"] + [f"{q.outcomes[o]:,}" for o in OUTCOMES]
                         + [f"{q.outcomes['unfinished']:,}", f"{q.stale:,}", f"{q.bad_share:.1%}"]
                         + [_seconds(v) for v in q.wait + q.run] for q in queues))


def _stuck_table(stuck: DataFrame, total: int) -> str:
    rows = (stuck.orderBy(F.col("reason"), F.col("age_seconds").desc(), F.col("id"))
            .limit(STUCK_ROWS).collect())
    utc: Callable[[Optional[int]], str] = (
        lambda us: "" if us is None else _when(us).strftime("%Y-%m-%d %H:%M:%S"))  # noqa: E731
    table = _table(["reason", "queue", "id", "protocol", "added (UTC)", "last leased (UTC)",
                    "attempts", "requeues", "age (s)"],
                   ([r.reason, r.queue, r.id, r.protocol or "", utc(r.added), utc(r.last_leased),
                     r.attempts, r.requeues, f"{r.age_seconds:,.0f}"] for r in rows))
    more = (f"<p>The first {STUCK_ROWS} of {total:,}; all are in the <code>stuck</code> table.</p>"
            if total > STUCK_ROWS else "")
    return table + more


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
pre { background: #f7f7f7; padding: 0.8em; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
"""


def render(summary: Summary, jobs: DataFrame, minutes: DataFrame, stuck: DataFrame,
           generated: datetime) -> str:
    """The report page. ``jobs`` is the job view, ``minutes`` the minute view (outcomes
    counted per job) and ``stuck`` the stuck view (times in µs)."""
    parts = [f"<h1>queueserver job history</h1><p>Generated {generated:%Y-%m-%d %H:%M:%S} UTC "
             f"from {html.escape(summary.out)}.</p>",
             f"<pre>{html.escape(summary.format())}</pre>",
             "<h2>Queues</h2>", _queue_table(summary.queues)]
    if summary.first_event is not None and summary.last_event is not None:
        width, label = bucket_for(summary.first_event, summary.last_event)
        series = _minute_series(minutes, width)
        buckets = _buckets(summary.first_event, summary.last_event, width)
        parts += ["<h2>Throughput</h2>", _throughput(series, buckets, label),
                  "<h2>Wait and run times</h2>", _latency(jobs, buckets, width, label),
                  "<h2>Failures and expiries</h2>", _failures(series, width, label)]
    else:
        parts.append("<p>No events yet.</p>")
    parts += [f"<h2>Stuck jobs ({summary.stuck:,})</h2>",
              f"<p>Failed and dead jobs, and jobs unfinished for more than {summary.stale_after:g} s "
              "before the newest event.</p>", _stuck_table(stuck, summary.stuck),
              "<h2>Rejected records</h2>",
              _table(["kind", "records"],
                     [["malformed lines", f"{summary.malformed:,}"]]
                     + [[f"unknown schema version {v}", f"{n:,}"]
                        for v, n in sorted(summary.unknown_versions.items())]
                     + [["files ending in a partial line (waiting)", f"{summary.partial_lines:,}"]])]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>queueserver job history</title><style>{STYLE}</style></head>"
            "<body>" + "\n".join(parts) + "</body></html>\n")
