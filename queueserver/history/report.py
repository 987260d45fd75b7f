"""``report.html``: one self-contained page, no external resource of any kind.

The page reads from the top down: a headline (how many jobs, how they
ended, over what time, and the queues that need a look), then the charts
(:mod:`.charts` chooses and draws them as inline SVG; :mod:`.chartscript`
shows the values under the pointer and zooms into a time range), then the
tables, and last how long the run took and where the time went. Styles
and the script are in the page. Long names never widen it: queue names
are ellipsized (the full name in a ``title``), wide tables scroll inside
their own box, and free text wraps.

The engine (Spark or Python, :mod:`.frame`) aggregates the series into at
most :data:`MAX_POINTS` time buckets; this module only draws them.
"""
from __future__ import annotations

import html
import statistics
from datetime import datetime, timezone
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import charts
from .chartscript import SCRIPT, STYLE as CHART_STYLE
from .charts import Buckets, Chart
from .frame import Frame, Row, col, desc, floor_to, percentiles, sum_
from .state import MINUTE_US
from .summary import OUTCOMES, QueueStats, Summary
from .tables import LEASED, PERCENTILES, READY
from .timing import Timing

BUCKETS = [(1, "minute"), (5, "5 minutes"), (15, "15 minutes"), (60, "hour"), (360, "6 hours"),
           (1440, "day"), (10080, "week")]
MAX_POINTS = 240
TOP_QUEUES = 12
WORST_QUEUES = 5
LISTED_ROWS = 100
FLOW = ("added", "completed")
BAD = ("failed", "dead", "expired")
TIMES = {"wait": "wait: added to first lease", "run": "run: last lease to end"}


def bucket_for(first: int, last: int) -> Tuple[int, str]:
    """The smallest bucket (µs, name) that draws ``first..last`` in at most MAX_POINTS points."""
    for minutes, name in BUCKETS:
        if (last - first) // (minutes * MINUTE_US) < MAX_POINTS:
            return minutes * MINUTE_US, name
    minutes, name = BUCKETS[-1]
    return minutes * MINUTE_US, name


def time_axis(first: int, last: int) -> Buckets:
    """Every bucket from the one holding ``first`` to the one holding ``last``."""
    width, name = bucket_for(first, last)
    start = first - first % width
    return Buckets(start, width, (last - last % width - start) // width + 1, name)


def _when(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, timezone.utc)


def _minute_series(minutes: Frame, width: int) -> List[Row]:
    """Per queue and bucket: the sums the throughput, failure and queue charts draw."""
    return (minutes.group_by("queue", floor_to(col("minute"), width).alias("bucket"))
            .agg(*[sum_(col(k)).alias(k) for k in FLOW + BAD]).order_by("bucket", "queue").collect())


def _percentile_series(jobs: Frame, width: int) -> List[Row]:
    return (jobs.where(col("finished").is_not_null())
            .group_by(floor_to(col("finished"), width).alias("bucket"))
            .agg(percentiles(col("wait_seconds"), PERCENTILES).alias("wait"),
                 percentiles(col("run_seconds"), PERCENTILES).alias("run"))
            .order_by("bucket").collect())


# ------------------------------------------------------------------ charts
def flow_chart(rows: Sequence[Tuple[int, Mapping[str, int]]], buckets: Buckets) -> Chart:
    series = charts.totals(rows, buckets, FLOW)
    kind = "bar" if charts.chart_kind(buckets.count) == "bars" else "step"
    return charts.counts_chart(
        f"Jobs added and completed per {buckets.name}", buckets, series, "jobs",
        f"All queues; each {kind} is one {buckets.name}, and one without jobs is a zero.")


def failure_chart(rows: Sequence[Tuple[int, Mapping[str, int]]], buckets: Buckets) -> Chart:
    series = charts.totals(rows, buckets, BAD)
    return charts.counts_chart(
        f"Failures and expiries per {buckets.name}", buckets, series, "jobs",
        "All queues: jobs that failed for good, ran out of attempts (dead) or outlived "
        "their TTL (expired), counted when they ended.", stacked=True)


def times_chart(rows: Sequence[Row], buckets: Buckets) -> Chart:
    index = {start: i for i, start in enumerate(buckets.starts())}
    panels: Dict[str, Dict[str, List[Optional[float]]]] = {}
    for kind in TIMES:
        series: Dict[str, List[Optional[float]]] = {
            f"p{round(p * 100)}": [None] * buckets.count for p in PERCENTILES}
        for r in rows:
            i = index.get(r["bucket"])
            if i is None or r[kind] is None:
                continue
            for (name, ys), value in zip(series.items(), r[kind]):
                ys[i] = value
        panels[kind] = series
    return charts.times_chart(
        "Wait and run times", buckets, panels,
        f"p50, p95 and p99 of the jobs that finished in each {buckets.name}, all queues; "
        f"a {buckets.name} in which none finished is left blank.", titles=TIMES)


def queue_chart(queues: Sequence[QueueStats]) -> Chart:
    ranked = sorted(queues, key=lambda q: (-q.jobs, q.queue))
    kinds = OUTCOMES + ("unfinished",)
    rows: List[Tuple[str, Mapping[str, int]]] = [
        (q.queue, {k: q.outcomes[k] for k in kinds}) for q in ranked[:TOP_QUEUES]]
    rest = ranked[TOP_QUEUES:]
    if rest:
        rows.append((f"({len(rest):,} other queues)",
                     {k: sum(q.outcomes[k] for q in rest) for k in kinds}))
    return charts.queues_chart(
        "Jobs per queue, by outcome", rows,
        f"The {min(TOP_QUEUES, len(ranked))} busiest of {len(ranked):,} queues"
        + (", the others together" if rest else "") + "; every queue is in the table below.")


def queue_time_chart(rows: Sequence[Row], buckets: Buckets) -> Chart:
    """Jobs added per queue and bucket, the busiest queues (by jobs added) only."""
    index = {start: i for i, start in enumerate(buckets.starts())}
    added: Dict[str, List[int]] = {}
    for r in rows:
        i = index.get(r["bucket"])
        if i is not None and r["added"]:
            added.setdefault(r["queue"], [0] * buckets.count)[i] += r["added"]
    ranked = sorted(added, key=lambda q: (-sum(added[q]), q))
    shown = [(q, added[q]) for q in ranked[:TOP_QUEUES]]
    return charts.heatmap_chart(
        f"Jobs added per queue and {buckets.name}", buckets, shown, "jobs",
        f"The {len(shown)} queues with the most jobs added"
        + (f" (of {len(ranked):,})" if len(ranked) > len(shown) else "")
        + f"; a white cell is a {buckets.name} without any.")


def _figure(chart: Chart) -> str:
    sub = f'<p class="sub">{html.escape(chart.subtitle)}</p>' if chart.subtitle else ""
    return (f'<figure class="panel chart"><figcaption><h3>{html.escape(chart.title)}</h3>{sub}'
            f'</figcaption><div class="plot">{chart.markup}<div class="tip" hidden></div></div></figure>')


# ------------------------------------------------------------------ text and tables
def _seconds(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.3g}"


def _name(text: str) -> str:
    """A queue name in a table cell: one line, ellipsized by the page when too long."""
    escaped = html.escape(text)
    return f'<span class="name" title="{escaped}">{escaped}</span>'


def _table(head: Sequence[str], rows: Iterable[Sequence[object]], names: Sequence[int] = (),
           text: Sequence[int] = (0,), box: str = "scroll") -> str:
    """A table in its own scrolling box; columns ``names`` hold queue names, ``text`` and
    ``names`` are aligned left (the others are numbers: right)."""
    left = set(names) | set(text)

    def tag(i: int) -> str:
        return ' class="l"' if i in left else ""

    cells = "".join(f"<th{tag(i)}>{html.escape(h)}</th>" for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(
        f"<td{tag(i)}>{_name(str(c)) if i in names else html.escape(str(c))}</td>"
        for i, c in enumerate(row)) + "</tr>" for row in rows)
    return (f'<div class="{box}"><table><thead><tr>{cells}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _queue_table(queues: List[QueueStats]) -> str:
    head = (["queue", "jobs"] + list(OUTCOMES) + ["unfinished", "stuck", "bad share"]
            + [f"{k} p{round(p * 100)} (s)" for k in ("wait", "run") for p in PERCENTILES])
    return _table(head, ([q.queue, f"{q.jobs:,}"] + [f"{q.outcomes[o]:,}" for o in OUTCOMES]
                         + [f"{q.outcomes['unfinished']:,}", f"{q.stuck:,}", f"{q.bad_share:.1%}"]
                         + [_seconds(v) for v in q.wait + q.run]
                         for q in sorted(queues, key=lambda q: (-q.jobs, q.queue))), names=[0],
                  box="scroll tall")


def _utc_cell(us: Optional[int]) -> str:
    return "" if us is None else _when(us).strftime("%Y-%m-%d %H:%M:%S")


def _more(total: int, table: str) -> str:
    return (f"<p>The first {LISTED_ROWS} of {total:,}; all are in the <code>{table}</code> table.</p>"
            if total > LISTED_ROWS else "")


def _stuck_table(stuck: Frame, total: int) -> str:
    """The stuck jobs longest unfinished first: their engine state (ready, leased) and age."""
    rows = stuck.order_by(desc("age_seconds"), "id").limit(LISTED_ROWS).collect()
    table = _table(["state", "queue", "id", "protocol", "added (UTC)", "last leased (UTC)",
                    "attempts", "requeues", "age (s)"],
                   ([r["state"], r["queue"], r["id"], r["protocol"] or "", _utc_cell(r["added"]),
                     _utc_cell(r["last_leased"]), r["attempts"], r["requeues"],
                     f"{r['age_seconds']:,.0f}"] for r in rows), names=[1],
                   text=[0, 2, 3], box="scroll tall")
    return table + _more(total, "stuck")


def _failed_table(failed: Frame, total: int) -> str:
    """The failed jobs, latest first: failed by their worker, or dead (out of attempts)."""
    rows = failed.order_by(desc("finished"), "id").limit(LISTED_ROWS).collect()
    table = _table(["outcome", "queue", "id", "protocol", "added (UTC)", "finished (UTC)",
                    "attempts", "requeues", "retries"],
                   ([r["outcome"], r["queue"], r["id"], r["protocol"] or "", _utc_cell(r["added"]),
                     _utc_cell(r["finished"]), r["attempts"], r["requeues"], r["retries"]]
                    for r in rows), names=[1], text=[0, 2, 3], box="scroll tall")
    return table + _more(total, "failed")


def _timing_table(timing: Timing) -> str:
    """Where the run's time went, stage by stage, until this page was written."""
    total = timing.total
    return _table(["stage", "seconds", "share"],
                  ([name, f"{took:.2f}", f"{took / total:.0%}" if total else ""]
                   for name, took in timing.breakdown() + [("total so far", total)]))


def duration(seconds: float) -> str:
    """A span in words: ``45 s``, ``2 min 5 s``, ``3 h 10 min``, ``2 d 4 h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    if s < 86400:
        return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")
    return f"{s // 86400} d" + (f" {s % 86400 // 3600} h" if s % 86400 // 3600 else "")


def _card(label: str, value: int, kind: str = "", of: int = 0) -> str:
    part = value / of if of else 0.0
    share = (f'<small>{"<1%" if part < 0.01 else f"{part:.0%}"} of jobs</small>'
             if value and of else "")
    return (f'<div class="card {kind}"><b>{value:,}</b><span>{html.escape(label)}</span>'
            f'{share}</div>')


def busiest(rows: Sequence[Tuple[int, Mapping[str, int]]], buckets: Buckets) -> str:
    """The bucket with the most jobs added, in words (empty when none were)."""
    added = charts.totals(rows, buckets, ("added",))["added"]
    if not any(added):
        return ""
    i = max(range(buckets.count), key=lambda k: (added[k], -k))
    when = _when(buckets.first + i * buckets.width)
    typical = statistics.median([n for n in added if n])
    return (f"Busiest {buckets.name}: {when:%b %d %H:%M} UTC, {added[i]:,} jobs added "
            f"(a typical one: {typical:,.0f}).")


def _headline(summary: Summary, generated: datetime, busy: str = "") -> str:
    outcomes = summary.outcomes
    if summary.first_event is not None and summary.last_event is not None:
        first, last = _when(summary.first_event), _when(summary.last_event)
        same_day = first.date() == last.date()
        span = (f"{first:%Y-%m-%d %H:%M:%S} to {last:%H:%M:%S}" if same_day
                else f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M}") + \
            f" UTC ({duration((summary.last_event - summary.first_event) / 1e6)})"
    else:
        span = "no events yet"
    jobs = summary.jobs
    cards = [_card("jobs", jobs, "total"), _card("queues", len(summary.queues), "total")]
    cards += [_card(o, outcomes[o], o, jobs) for o in OUTCOMES + ("unfinished",)
              if outcomes[o] or o in ("completed", "failed", "unfinished")]
    cards.append(_card("stuck", summary.stuck, "stuck"))
    worst = summary.worst(WORST_QUEUES)
    if worst:
        rows = "".join(
            f"<tr><td>{_name(q.queue)}</td><td>{q.bad_share:.1%}</td><td>{q.stuck:,}</td>"
            f"<td>{'' if q.wait[1] is None else charts.short_seconds(q.wait[1])}</td></tr>"
            for q in worst)
        attention = ('<div class="worst" id="worst-queues"><h2>Worst queues</h2>'
                     '<table class="fixed"><colgroup><col class="q"><col><col><col></colgroup>'
                     "<thead><tr><th>queue</th><th>bad</th><th>stuck</th>"
                     f"<th>wait p95</th></tr></thead><tbody>{rows}</tbody></table>"
                     '<p class="foot">bad: failed, dead or expired, of the finished jobs; stuck: '
                     f"unfinished for more than {summary.stale_after:g} s.</p></div>")
    else:
        attention = ('<div class="worst" id="worst-queues"><h2>Worst queues</h2>'
                     "<p>None: no queue has a failed, dead, expired or stuck job.</p></div>")
    return ('<header><h1>Job history</h1>'
            f'<p class="span">{html.escape(span)}</p>'
            + (f'<p class="busy">{html.escape(busy)}</p>' if busy else "") +
            f'<p class="meta">Generated {generated:%Y-%m-%d %H:%M:%S} UTC from '
            f'<code>{html.escape(summary.out)}</code></p></header>'
            f'<section class="headline"><div class="cards">{"".join(cards)}</div>{attention}'
            "</section>")


STYLE = """
:root { --ink: #1d2733; --muted: #5d6b7b; --line: #e2e7ee; --bg: #f4f6f9; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 24px 56px; }
h1 { font-size: 1.75em; margin: 0; letter-spacing: -0.01em; }
h2 { font-size: 1.2em; margin: 2em 0 0.6em; }
h3 { font-size: 1.02em; margin: 0; }
header .span { font-size: 1.1em; margin: 0.2em 0 0; }
header .busy { margin: 0.2em 0 0; }
.meta, .sub, .note { color: var(--muted); }
.meta { font-size: 0.85em; margin: 0.3em 0 0; overflow-wrap: anywhere; }
.sub { font-size: 0.88em; margin: 0.2em 0 0.6em; }
code { font-size: 0.92em; }
.headline { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 18px;
            margin-top: 20px; align-items: start; }
@media (max-width: 900px) { .headline { grid-template-columns: minmax(0, 1fr); } }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(112px, 1fr)); gap: 10px; }
.card { background: #fff; border: 1px solid var(--line); border-top: 4px solid #9aa5b1;
        border-radius: 8px; padding: 8px 12px 10px; min-width: 0; }
.card b { display: block; font-size: 1.5em; font-weight: 650; font-variant-numeric: tabular-nums;
          overflow-wrap: anywhere; }
.card span { color: var(--muted); font-size: 0.85em; }
.card small { display: block; color: var(--muted); font-size: 0.8em; }
.card.total { border-top-color: #1d2733; } .card.completed { border-top-color: #54a24b; }
.card.failed { border-top-color: #e45756; } .card.dead { border-top-color: #b279a2; }
.card.expired { border-top-color: #f58518; } .card.deleted { border-top-color: #9d9da1; }
.card.taken { border-top-color: #72b7b2; } .card.unfinished { border-top-color: #eeca3b; }
.card.stuck { border-top-color: #d62728; }
.worst, .panel { background: #fff; border: 1px solid var(--line); border-radius: 10px; min-width: 0; }
.worst { padding: 12px 16px; }
.worst h2 { margin: 0 0 0.4em; font-size: 1.02em; }
.worst p { margin: 0; color: var(--muted); }
.worst p.foot { font-size: 0.8em; margin-top: 0.5em; }
.panel { padding: 16px 18px; margin: 16px 0; }
figure { margin: 16px 0; }
figure img { display: block; width: 100%; max-width: 100%; height: auto; }
.scroll { overflow-x: auto; max-width: 100%; background: #fff; border: 1px solid var(--line);
          border-radius: 10px; }
table { border-collapse: collapse; font-size: 0.86em; font-variant-numeric: tabular-nums; }
.scroll table { min-width: 100%; }
.scroll.tall { max-height: 32em; overflow-y: auto; }
.scroll.tall th { position: sticky; top: 0; }
th, td { padding: 0.4em 0.7em; text-align: right; border-bottom: 1px solid var(--line);
         white-space: nowrap; }
th { background: #f8f9fb; color: var(--muted); font-weight: 600; }
th.l, td.l, table.fixed td:first-child, table.fixed th:first-child { text-align: left; }
tbody tr:last-child td { border-bottom: none; }
tbody tr:hover td { background: #f8fafc; }
table.fixed { table-layout: fixed; width: 100%; }
table.fixed col.q { width: 40%; }
table.fixed th, table.fixed td { overflow: hidden; text-overflow: ellipsis; }
.name { display: inline-block; max-width: 24em; overflow: hidden; text-overflow: ellipsis;
        white-space: nowrap; vertical-align: bottom; }
table.fixed .name { max-width: 100%; }
details { margin-top: 2em; color: var(--muted); }
pre { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 0.8em;
      white-space: pre-wrap; overflow-wrap: anywhere; font-size: 0.85em; }
"""


def render(summary: Summary, jobs: Frame, minutes: Frame, stuck: Frame, failed: Frame,
           generated: datetime, timing: Timing) -> str:
    """The report page. ``jobs`` is the job view, ``minutes`` the minute view (outcomes
    counted per job), ``stuck`` and ``failed`` the stuck and failed views (times in µs)."""
    parts = [_headline(summary, generated)]
    if summary.first_event is not None and summary.last_event is not None:
        buckets = time_axis(summary.first_event, summary.last_event)
        series = _minute_series(minutes, buckets.width)
        counts = [(r["bucket"], r) for r in series]
        parts = [_headline(summary, generated, busiest(counts, buckets)),
                 "<h2>Over time</h2>", _figure(flow_chart(counts, buckets))]
        if any(c[k] for _, c in counts for k in BAD):
            parts.append(_figure(failure_chart(counts, buckets)))
        else:
            parts.append('<p class="note">No job failed, died or expired.</p>')
        parts += [_figure(times_chart(_percentile_series(jobs, buckets.width), buckets)),
                  "<h2>Queues</h2>", _figure(queue_chart(summary.queues)),
                  _figure(queue_time_chart(series, buckets))
                  if any(r["added"] for r in series) else ""]
    else:
        parts += ["<h2>Queues</h2>", '<p class="note">No events yet.</p>']
    states = summary.stuck_states
    parts += ["<h2>Every queue</h2>", _queue_table(summary.queues),
              f'<h2 id="stuck">Stuck jobs ({summary.stuck:,})</h2>',
              f'<p class="note">Jobs unfinished for more than {summary.stale_after:g} s before the '
              f"newest event, by the engine's name of their state: {states[READY]:,} ready (in line, "
              f"or scheduled) and {states[LEASED]:,} leased (their last lease not given back).</p>",
              _stuck_table(stuck, summary.stuck),
              f'<h2 id="failed">Failed jobs ({summary.failed:,})</h2>',
              f'<p class="note">Jobs that ended in the engine\'s state FAILED: '
              f"{summary.outcomes['failed']:,} failed by their worker, {summary.outcomes['dead']:,} "
              "dead (out of attempts).</p>",
              _failed_table(failed, summary.failed),
              "<h2>Rejected records</h2>",
              _table(["kind", "records"],
                     [["malformed lines", f"{summary.malformed:,}"]]
                     + [[f"unknown schema version {v}", f"{n:,}"]
                        for v, n in sorted(summary.unknown_versions.items())]
                     + [["files ending in a partial line (waiting)", f"{summary.partial_lines:,}"]]),
              f'<h2 id="timing">How long this run took</h2>',
              f'<p class="note">{html.escape(_timing_note(timing))}</p>', _timing_table(timing),
              "<details><summary>The summary as the command printed it</summary>"
              f"<pre>{html.escape(summary.format())}</pre></details>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>queueserver job history</title><style>{STYLE}{CHART_STYLE}</style></head>"
            "<body><main>" + "\n".join(parts) + f"</main><script>{SCRIPT}</script></body></html>\n")


def _timing_note(timing: Timing) -> str:
    if timing.engine == "spark":
        return (f"Computed by Spark ({timing.reason}). Starting Spark (its JVM and session) took "
                f"{timing.seconds('starting Spark'):.1f} s of the run; the stages below are the "
                "work, until this page was written.")
    return (f"Computed in Python, without Spark ({timing.reason}); the stages below are the work, "
            "until this page was written.")
