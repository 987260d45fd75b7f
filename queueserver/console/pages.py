"""The console's pages, rendered from the records of :mod:`.model`: plain
functions from data to HTML (no I/O), so each is tested by calling it.

Forms that act (delete, requeue, purge) carry a password field for the
token and the hidden CSRF field the app hands in (``csrf``); nothing here
decides who may act (that is :mod:`.auth`).

Why one module, though over 600 lines: each page is one function of a few
dozen lines, and they share the pieces before them (a job list, with its
filters, pager and bulk form, is on the queue and the failed pages alike;
the rate charts on the overview and a queue's page); there is no state
here to split along.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence

from .auth import CSRF_FIELD, TOKEN_FIELD
from .charts import DEPTH, STATES as STATE_SERIES, depth_chart, legend, rate_chart
from .layout import (STATE_COLOURS, crumbs, empty, esc, fmt_age, fmt_int, fmt_rate, num_cell, page, state_badge,
                     table, url)
from .series import RANGES
from .model import (LISTS, MAX_LISTED, MAX_PER_PAGE, STATES, ClusterView, JobDetail, JobPage, JobRow, Lease, QueueRow,
                    RatePoint, SearchResult, WorkersView)

#: The name each state goes by in the pages (finished jobs are those kept with results).
STATE_LABELS = {"ready": "Ready", "scheduled": "Scheduled", "leased": "Leased", "finished": "Finished",
                "failed": "Failed"}
#: What an empty list of a state says.
EMPTY_STATE = {"ready": "No jobs ready", "scheduled": "No jobs scheduled", "leased": "No jobs leased",
               "finished": "No finished jobs kept", "failed": "No failed jobs"}
#: The flash line after an action, by kind (fixed texts: a link cannot make the page say anything else).
NOTICES = {"deleted": "Deleted job {job}.", "requeued": "Requeued job {job}.",
           "purged": "Purged {count} jobs from this queue.", "retried-many": "Retried {count} jobs.",
           "deleted-many": "Deleted {count} jobs."}
#: The range a chart shows unless the page asks for another (a name of series.RANGES).
DEFAULT_SPAN = "1h"


# -------------------------------------------------------------- pieces
def _depth(row: QueueRow) -> int:
    return row["ready"] + row["scheduled"] + row["leased"] + row["finished"]


def depth_bar(row: QueueRow, widest: int) -> str:
    """A bar of the queue's jobs by state, as wide as its depth against the widest queue's."""
    total = _depth(row)
    if not total:
        return '<div class=bar title="empty"></div>'
    scale = max(total / max(widest, 1), 0.02) * 100
    segments = "".join(
        f'<i style="width:{row[s] / total * scale:.2f}%;background:{STATE_COLOURS[s]}" '   # type: ignore[literal-required]
        f'title="{s}: {row[s]:,}"></i>'   # type: ignore[literal-required]
        for s in STATES if row[s])   # type: ignore[literal-required]
    return f'<div class=bar title="{total:,} jobs">{segments}</div>'


def _csrf_field(csrf: str) -> str:
    return f'<input type=hidden name="{CSRF_FIELD}" value="{esc(csrf)}">'


def _token_field() -> str:
    return (f'<input type=password name="{TOKEN_FIELD}" placeholder="Token" autocomplete="off" '
            'aria-label="token" required>')


def action_form(action: str, label: str, csrf: str, danger: bool = False, hidden: Optional[Dict[str, str]] = None,
                note: str = "") -> str:
    fields = "".join(f'<input type=hidden name="{esc(k)}" value="{esc(v)}">' for k, v in (hidden or {}).items())
    return (f'<form class=act method=post action="{esc(action)}">{_csrf_field(csrf)}{fields}{_token_field()}'
            f'<button class="btn{" danger" if danger else ""}" type=submit>{esc(label)}</button>'
            f'{f"<span class=note>{esc(note)}</span>" if note else ""}</form>')


def flash(notice: Optional[str], count: Optional[str] = None, job: Optional[str] = None) -> str:
    if notice not in NOTICES:
        return ""
    text = NOTICES[notice].format(count=count if (count or "").isdigit() else "the",
                                  job=(job or "")[:80])
    return f'<div class="flash ok" role=status>{esc(text)}</div>'


# ------------------------------------------------------------ overview
def queue_rows(rows: Sequence[QueueRow]) -> str:
    """The overview's table rows (also what the page's script swaps in every 2 s)."""
    widest = max((_depth(r) for r in rows), default=0)
    out = []
    for r in rows:
        oldest = r["oldest_ready_age_s"]
        age_cls = "hot" if oldest is not None and oldest >= 300 else ("warm" if oldest is not None and oldest >= 30
                                                                      else "")
        where = f'{r["node"]}/{r["shard"]}' if r["node"] else str(r["shard"])
        out.append(
            f'<tr data-queue="{esc(r["name"])}">'
            f'<td class=name data-v="{esc(r["name"])}"><a href="{esc(url("queues", r["name"]))}">{esc(r["name"])}</a></td>'
            f'<td class=bar-cell data-v="{_depth(r)}">{depth_bar(r, widest)}</td>'
            + num_cell(r["ready"]) + num_cell(r["scheduled"])
            + num_cell(r["leased"], cls="warm" if r["leased"] else "")
            + num_cell(r["finished"])
            + num_cell(r["added_per_s"], fmt_rate(r["added_per_s"]))
            + num_cell(r["completed_per_s"], fmt_rate(r["completed_per_s"]))
            + num_cell(r["failed_per_s"], fmt_rate(r["failed_per_s"]), cls="hot" if r["failed_per_s"] > 0 else "")
            + f'<td class="n {age_cls}" data-v="{-1 if oldest is None else oldest:g}">{esc(fmt_age(oldest))}</td>'
            + f'<td class=wrap data-v="{esc(",".join(r["protocols"]))}">'
            + ("".join(f"<span class=chip>{esc(p)}</span>" for p in r["protocols"]) or '<span class=zero>—</span>')
            + f'</td><td class="n" data-v="{esc(where)}">{esc(where)}</td></tr>')
    return "".join(out)


def overview_live(rows: Sequence[QueueRow]) -> str:
    """The part of the overview that refreshes itself: the totals and the table."""
    totals = {s: sum(r[s] for r in rows) for s in STATES}   # type: ignore[literal-required]
    rates = [("Added/s", sum(r["added_per_s"] for r in rows), "#4f46e5"),
             ("Completed/s", sum(r["completed_per_s"] for r in rows), "#10b981"),
             ("Failed/s", sum(r["failed_per_s"] for r in rows), "#ef4444")]
    tiles = "".join(f'<div class=tile style="--c:{STATE_COLOURS[s]}"><div class=k>{STATE_LABELS[s]}</div>'
                    f'<div class=v data-total="{s}">{fmt_int(totals[s])}</div></div>' for s in STATES)
    tiles += "".join(f'<div class=tile style="--c:{c}"><div class=k>{k}</div><div class=v>{fmt_rate(v)}</div></div>'
                     for k, v, c in rates)
    if not rows:
        body = empty("No queues yet", " — add a job over any protocol and its queue appears here.")
    else:
        body = table([("Queue", "text"), ("Depth", "num"), ("Ready", "num"), ("Scheduled", "num"),
                      ("Leased", "num"), ("Finished", "num"), ("Added/s", "num"), ("Done/s", "num"),
                      ("Failed/s", "num"), ("Oldest ready", "num"), ("Protocols", "text"), ("Shard", "text")],
                     [queue_rows(rows)], body_id="queue-rows")
    return (f'<div class=tiles>{tiles}</div>'
            f'<div class="card flush"><h2>Queues <span class=muted>({len(rows)})</span></h2>{body}</div>')


def overview(rows: Sequence[QueueRow], node: str, points: Sequence[RatePoint] = (),
             span: str = DEFAULT_SPAN) -> str:
    body = ('<div class=head><h1>Overview</h1><span class=live id=live-state>live</span>'
            f'<div class=sub>Every queue on {"the cluster" if any(r["node"] for r in rows) else "this node"}, '
            'its jobs by state and its rates; refreshes every 2 s. Click a column to sort.</div></div>'
            f'<section id=live data-src="/api/queues?format=html">{overview_live(rows)}</section>'
            + charts_card(points, span, None, lambda r: url(range=r)))
    return page("Overview", body, node, active="overview")


# ------------------------------------------------------------- charts
def _resolution(points: Sequence[RatePoint]) -> str:
    step = points[-1]["step"] if points and points[-1].get("step") else 5
    return f"a point every {fmt_age(step)}"


def charts(points: Sequence[RatePoint], queue: Optional[str] = None) -> str:
    """Throughput and jobs held side by side (what a chart card refreshes)."""
    return ('<div class="grid g2 charts">'
            f'<div><h3>Per second</h3>{legend()}{rate_chart(points)}</div>'
            f'<div><h3>Jobs held</h3>{legend(DEPTH if queue else STATE_SERIES, "")}'
            f'{depth_chart(points, by_state=queue is None)}</div></div>'
            f'<p class="note">{esc(_resolution(points))}</p>')


def charts_card(points: Sequence[RatePoint], span: str, queue: Optional[str],
                link: Callable[[str], str]) -> str:
    """The charts of the node (or ``queue``) over ``span`` (a name of
    series.RANGES), with links to the other ranges; refreshed live."""
    ranges = "".join(f'<b>{esc(name)}</b>' if name == span else f'<a href="{esc(link(name))}">{esc(name)}</a>'
                     for name in RANGES)
    src = url("api", "series", queue=queue, range=span, format="html")
    title = "Throughput and jobs held" + ("" if queue else " on this node")
    return (f'<div class="card chart" id=charts><div class=chart-head><h2>{title}</h2>'
            f'<nav class=ranges aria-label="time range">{ranges}</nav></div>'
            f'<div id=chart data-src="{esc(src)}">{charts(points, queue)}</div></div>')


# ------------------------------------------------------------ a queue
def list_url(queue: Optional[str], *more: str, **query: object) -> str:
    """A path of a queue's list (``queue`` None: the failed jobs of every queue, ``/failed``)."""
    return url("queues", queue, *more, **query) if queue is not None else url("failed", *more, **query)


def _pager(jobs: JobPage, shown: Dict[str, str]) -> str:
    cur, pages = jobs["page"], jobs["pages"]
    if jobs["total"] == 0:
        return ""
    if pages <= 1:
        return (f'<div class=pager>{fmt_int(jobs["total"])} {"job" if jobs["total"] == 1 else "jobs"}'
                '<span class=sp></span></div>')
    per = jobs["per_page"] if jobs["per_page"] != 50 else None
    state = jobs["state"] if jobs["queue"] is not None else None

    def link(n: int, text: str = "") -> str:
        if n == cur and not text:
            return f"<b>{n}</b>"
        if n < 1 or n > pages:
            return f'<span class=off>{esc(text)}</span>'
        href = list_url(jobs["queue"], state=state, page=n, per_page=per, **shown)
        return f'<a href="{esc(href)}">{esc(text or n)}</a>'

    shown_pages = sorted({1, pages, *range(max(1, cur - 2), min(pages, cur + 2) + 1)})
    nums: List[str] = []
    for i, n in enumerate(shown_pages):
        if i and n - shown_pages[i - 1] > 1:
            nums.append("<span class=off>…</span>")
        nums.append(link(n))
    first = (cur - 1) * jobs["per_page"] + 1
    last = min(cur * jobs["per_page"], jobs["total"])
    return (f'<div class=pager>{fmt_int(first)}–{fmt_int(last)} of {fmt_int(jobs["total"])} jobs'
            f'<span class=sp></span>{link(cur - 1, "‹ Prev")}{"".join(nums)}{link(cur + 1, "Next ›")}</div>')


def _error_cell(j: JobRow) -> str:
    error = j.get("error")
    if j.get("outcome") != "failed":
        return '<td class="zero" data-v="">—</td>'
    if error is None:
        return '<td class="muted" data-v="">no attempts left</td>'
    text = error.strip() or "(no message)"
    return f'<td class="error" data-v="{esc(text)}" title="{esc(text)}">{esc(text)}</td>'


def job_rows(jobs: Sequence[JobRow], finished: bool = False, select: bool = False, queues: bool = False) -> str:
    """A list's rows: with ``finished``, each one's outcome and error; with
    ``select``, a box to pick it for a bulk action; with ``queues``, its queue."""
    out = []
    for j in jobs:
        ttr = j["ttr_left_s"]
        box = (f'<td class=sel><input type=checkbox name=id value="{esc(j["id"])}" form=bulk '
               f'aria-label="select {esc(j["id"])}"></td>' if select else "")
        queue = (f'<td class=name data-v="{esc(j["queue"])}"><a href="{esc(url("queues", j["queue"]))}">'
                 f'{esc(j["queue"])}</a></td>' if queues else "")
        outcome = ""
        if finished:
            done = j.get("outcome")
            outcome = (f'<td data-v="{esc(done)}">{state_badge(done)}</td>' if done
                       else '<td class=zero data-v="">—</td>') + _error_cell(j)
        out.append(
            f'<tr data-job="{esc(j["id"])}">{box}<td class=id data-v="{esc(j["id"])}">'
            f'<a href="{esc(url("jobs", j["id"]))}">{esc(j["id"])}</a></td>' + queue
            + (num_cell(j["number"], fmt_int(j["number"])) if j["number"] is not None
               else '<td class="n zero" data-v="-1">—</td>')
            + outcome
            + num_cell(j["priority"]) + num_cell(j["attempts"], cls="hot" if j["attempts"] > 1 else "")
            + num_cell(j["age_s"], fmt_age(j["age_s"]))
            + ("" if finished else
               num_cell(-1 if ttr is None else ttr, fmt_age(ttr), cls="warm" if ttr is not None and ttr < 5 else ""))
            + num_cell(-1 if j["ttl_left_s"] is None else j["ttl_left_s"], fmt_age(j["ttl_left_s"]))
            + "</tr>")
    return "".join(out)


#: The fields of a list's filters, as a page's query names them.
FILTER_FIELDS = ("outcome", "older", "newer", "priority", "text")


def filter_form(jobs: JobPage, shown: Dict[str, str]) -> str:
    """The list's filters (a GET form: the page works without the script)."""
    queue, state = jobs["queue"], jobs["state"]
    fields = ""
    if state == "finished":
        options = "".join(f'<option value="{v}"{" selected" if shown.get("outcome", "") == v else ""}>{label}</option>'
                          for v, label in (("", "Any outcome"), ("failed", "Failed"), ("completed", "Completed")))
        fields += f'<select name=outcome aria-label="outcome">{options}</select>'
    if queue is None:
        fields += (f'<input type=text name=queue value="{esc(shown.get("queue", ""))}" placeholder="Queue" '
                   'aria-label="queue" maxlength=300>')
    else:
        fields += f'<input type=hidden name=state value="{esc(state)}">'
    fields += (f'<input type=text name=older value="{esc(shown.get("older", ""))}" placeholder="Older than (10m)" '
               'aria-label="older than" size=12 maxlength=20>'
               f'<input type=text name=newer value="{esc(shown.get("newer", ""))}" placeholder="Newer than (1h)" '
               'aria-label="newer than" size=12 maxlength=20>'
               f'<input type=text name=priority value="{esc(shown.get("priority", ""))}" placeholder="Priority" '
               'aria-label="priority" size=7 maxlength=20 inputmode=numeric>'
               f'<input type=search name=text value="{esc(shown.get("text", ""))}" placeholder="Payload or error text" '
               'aria-label="payload text" maxlength=200>')
    clear = list_url(queue, state=state if queue is not None else None)
    active = any(shown.get(k) for k in (*FILTER_FIELDS, "queue"))
    return (f'<form class=filters method=get action="{esc(list_url(queue))}" role=search>{fields}'
            '<button class=btn type=submit>Filter</button>'
            + (f'<a class=btn href="{esc(clear)}">Clear</a>' if active else "") + "</form>")


def bulk_form(jobs: JobPage, shown: Dict[str, str], csrf: str) -> str:
    """Retry or delete the jobs picked on the page, or every job the list
    (with its filters) holds: one POST, logged once with its count."""
    queue, state, total = jobs["queue"], jobs["state"], jobs["total"]
    hidden = {"state": state, **shown}
    retry = state in ("failed", "finished", "leased")
    everything = f"all {fmt_int(total)}" if total != 1 else "the 1"
    which = "matching job" + ("" if total == 1 else "s") if any(shown.get(k) for k in shown) else \
        ("job" if total == 1 else "jobs") + " in this list"
    buttons = ""
    if retry:
        buttons += ('<button class=btn type=submit name=action value=retry>Retry selected</button>'
                    f'<button class=btn type=submit name=action value=retry-all '
                    f'data-confirm="Retry {esc(everything)} {esc(which)}?">Retry {esc(everything)}</button>')
    buttons += ('<button class="btn danger" type=submit name=action value=delete '
                'data-confirm="Delete the selected jobs?">Delete selected</button>'
                f'<button class="btn danger" type=submit name=action value=delete-all '
                f'data-confirm="Delete {esc(everything)} {esc(which)}? This cannot be undone.">'
                f'Delete {esc(everything)}</button>')
    fields = "".join(f'<input type=hidden name="{esc(k)}" value="{esc(v)}">' for k, v in hidden.items() if v)
    note = ("Retry puts a failed or leased job back to ready as a new attempt (others are left as they are). "
            if retry else "")
    return (f'<form class="act bulk" id=bulk method=post action="{esc(list_url(queue, "bulk"))}">'
            f'{_csrf_field(csrf)}{fields}{_token_field()}{buttons}'
            f'<span class=note>{esc(note)}The “all” buttons act on every job of the list and its filters, '
            'not only this page.</span></form>')


def job_list(jobs: JobPage, shown: Dict[str, str], csrf: str, empty_text: str) -> str:
    """A list of jobs with its filters, its pages and its bulk actions."""
    state = jobs["state"]
    finished = state in ("finished", "failed")
    every = jobs["queue"] is None
    head = [("Id", "text")] + ([("Queue", "text")] if every else []) + [("Number", "num")]
    if finished:
        head += [("Outcome", "text"), ("Error", "text")]
    head += [("Priority", "num"), ("Attempts", "num"), ("Age", "num")]
    head += [] if finished else [("TTR left", "num")]
    head += [("TTL left", "num")]
    if jobs["jobs"]:
        listing = table(head, [job_rows(jobs["jobs"], finished, select=True, queues=every)], select=True)
    else:
        filtered = any(shown.get(k) for k in shown)
        listing = empty(empty_text, " that match these filters." if filtered else
                        (" on this page: go back a page." if jobs["total"] else "."))
    bulk = bulk_form(jobs, shown, csrf) if jobs["total"] else ""
    return (f'<div class=listbar>{filter_form(jobs, shown)}</div>{listing}{_pager(jobs, shown)}'
            + (f'<div class=bulkbar>{bulk}</div>' if bulk else ""))


def queue_page(jobs: JobPage, row: Optional[QueueRow], rates: Sequence[RatePoint], node: str, csrf: str,
               history: bool = False, capped: bool = False, notice: str = "",
               shown: Optional[Dict[str, str]] = None, span: str = DEFAULT_SPAN) -> str:
    name, state = jobs["queue"], jobs["state"]
    assert name is not None   # a queue's own page
    shown = shown or {}
    counts = {s: (row[s] if row else None) for s in STATES}   # type: ignore[literal-required]
    tiles = "".join(
        f'<a class="tile{" on" if s == state else ""}" style="--c:{STATE_COLOURS[s]}" '
        f'href="{esc(url("queues", name, state=s))}"><div class=k>{STATE_LABELS[s]}</div>'
        f'<div class=v>{fmt_int(counts[s])}</div></a>' for s in STATES)
    if row:
        tiles += (f'<div class=tile style="--c:#4f46e5"><div class=k>Added/s</div>'
                  f'<div class=v>{fmt_rate(row["added_per_s"])}</div></div>'
                  f'<div class=tile style="--c:#ef4444"><div class=k>Failed/s</div>'
                  f'<div class=v>{fmt_rate(row["failed_per_s"])}</div></div>'
                  f'<div class=tile style="--c:#98a2b3"><div class=k>Oldest ready</div>'
                  f'<div class=v>{fmt_age(row["oldest_ready_age_s"])}</div></div>')
    # the failed list's count is known only while it is shown (finding failed jobs reads them all)
    counts_shown: Dict[str, Optional[int]] = {**counts, "failed": jobs["total"] if state == "failed" else None}
    state_tabs = "".join(
        f'<a class="{"on" if s == state else ""}" style="--c:{STATE_COLOURS[s]}" '
        f'href="{esc(url("queues", name, state=s))}">{STATE_LABELS[s]}'
        f'<span class=count>{fmt_int(counts_shown[s]) if counts_shown[s] is not None else ""}</span></a>'
        for s in LISTS)
    listing = job_list(jobs, shown, csrf, EMPTY_STATE.get(state, "No jobs") + f" in {name}")
    cap = (f'<div class="flash warn">At most {MAX_PER_PAGE} jobs a page: showing {jobs["per_page"]}.</div>'
           if capped else "")
    where = ""
    if row:
        where = (f'shard {esc(row["shard"])}{" on node " + esc(row["node"]) if row["node"] else ""}'
                 + "".join(f" <span class=chip>{esc(p)}</span>" for p in row["protocols"]))
    history_link = ' · <a href="/history/report">History report</a>' if history else ""
    chart = charts_card(rates, span, name, lambda r: url("queues", name, state=state, range=r, **shown))
    body = (
        crumbs(("Overview", "/"), (name, None))
        + f'<div class=head><h1>{esc(name)}</h1><div class=sub>{where}{history_link}</div></div>'
        + notice + cap
        + f'<div class=tiles>{tiles}</div>'
        + chart
        + f'<div class="card flush" id=jobs><nav class=tabs>{state_tabs}</nav>{listing}</div>'
        + '<div class="card danger-zone"><h2>Purge this queue</h2>'
        + f'<p class=muted>Deletes every job of <b>{esc(name)}</b> (ready, scheduled, leased and finished). '
          "You will be asked to confirm.</p>"
        + action_form(url("queues", name, "purge"), "Purge…", csrf, danger=True)
        + "</div>")
    return page(name, body, node)


def failed_page(jobs: JobPage, node: str, csrf: str, shown: Dict[str, str], notice: str = "",
                capped: bool = False) -> str:
    """The failed (dead) jobs of every queue of this node, or of one (``shown["queue"]``)."""
    queue = shown.get("queue") or None
    cap = (f'<div class="flash warn">At most {MAX_PER_PAGE} jobs a page: showing {jobs["per_page"]}.</div>'
           if capped else "")
    body = (
        crumbs(("Overview", "/"), ("Failed", None))
        + '<div class=head><h1>Failed jobs</h1>'
        + '<div class=sub>Jobs that failed for good (kept with their error) on '
        + (f"queue {esc(queue)}" if queue else "every queue of this node")
        + ': retry them (back to ready as new attempts) or delete them, picked or all at once.</div></div>'
        + notice + cap
        + f'<div class=tiles><div class=tile style="--c:{STATE_COLOURS["failed"]}"><div class=k>Failed</div>'
          f'<div class=v>{fmt_int(jobs["total"])}</div></div></div>'
        + '<div class="card flush" id=jobs>' + job_list(jobs, shown, csrf, "No failed jobs") + "</div>")
    return page("Failed jobs", body, node, active="failed")


def purge_confirm(queue: str, row: Optional[QueueRow], node: str, csrf: str, mismatch: bool = False) -> str:
    total = _depth(row) if row else None
    warn = ('<div class="flash warn">The name typed does not match the queue\'s: nothing was purged.</div>'
            if mismatch else "")
    body = (
        crumbs(("Overview", "/"), (queue, url("queues", queue)), ("Purge", None))
        + f'<div class=head><h1>Purge {esc(queue)}?</h1></div>' + warn
        + '<div class="card danger-zone"><h2>This cannot be undone</h2>'
        + f'<p>Every job of <b>{esc(queue)}</b>'
        + (f" — <b>{fmt_int(total)}</b> now —" if total is not None else "")
        + " is deleted: ready, scheduled, leased and finished ones. Type the queue's name to confirm.</p>"
        + f'<form class=act method=post action="{esc(url("queues", queue, "purge"))}">{_csrf_field(csrf)}'
        + '<input type=text name=confirm placeholder="Queue name" autocomplete="off" aria-label="confirm" required>'
        + _token_field()
        + '<button class="btn danger" type=submit>Purge queue</button>'
        + f'<a class=btn href="{esc(url("queues", queue))}">Cancel</a></form></div>')
    return page(f"Purge {queue}", body, node)


# ---------------------------------------------------------------- a job
def _kv(items: Sequence[tuple]) -> str:   # type: ignore[type-arg]
    return "<dl class=kv>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def job_page(detail: JobDetail, node: str, csrf: str, notice: str = "", elsewhere: Optional[str] = None) -> str:
    """``elsewhere``: the console URL of the node that holds the job when it
    is another node ("" if unknown): its queue is linked there, and the
    actions are that console's."""
    j = detail["job"]
    remote = elsewhere is not None
    base = (elsewhere or "").rstrip("/") if (elsewhere or "").startswith(("http://", "https://")) else ""
    queue_link = (base + url("queues", j["queue"])) if remote and base else (None if remote
                                                                              else url("queues", j["queue"]))
    max_attempts = detail["max_attempts"]
    attempts = fmt_int(j["attempts"]) + (f" of {fmt_int(max_attempts)}" if max_attempts else "")
    facts = [("Id", f'<span class=mono>{esc(j["id"])}</span>'),
             ("Number", fmt_int(j["number"])),
             ("Queue", f'<a href="{esc(queue_link)}">{esc(j["queue"])}</a>' if queue_link else esc(j["queue"])),
             ("State", state_badge(j["state"]) + (f' {state_badge(str(detail["extra"]["outcome"]))}'
                                                  if j["state"] == "finished" and detail["extra"].get("outcome")
                                                  else "")),
             ("Priority", fmt_int(j["priority"])),
             ("Attempts", attempts),
             ("Age", fmt_age(j["age_s"])),
             ("TTR left", fmt_age(j["ttr_left_s"])),
             ("TTL left", fmt_age(j["ttl_left_s"]) if j["ttl_left_s"] is not None else "no TTL"),
             ("Shard", esc(f'{detail["node"]}/{detail["shard"]}' if detail["node"] else detail["shard"])),
             ("Payload", f'{fmt_int(detail["payload_size"])} bytes')]
    lease = detail["lease"]
    if lease:
        lease_html = lease_facts(lease, j["ttr_left_s"] is not None)
    else:
        lease_html = '<p class=muted>Not leased: no client holds this job.</p>'
    ident = j["id"]
    requeue = ""
    failed = j["state"] == "finished" and detail["extra"].get("outcome") == "failed"
    if j["state"] == "leased" or failed:   # what the shard requeues
        requeue = (f'<button class=btn type=submit formaction="{esc(url("jobs", ident, "requeue"))}" '
                   'title="back to ready, as a new attempt">Requeue</button>')
    actions = (f'<form class=act method=post action="{esc(url("jobs", ident, "delete"))}">{_csrf_field(csrf)}'
               f'<input type=hidden name=queue value="{esc(j["queue"])}">{_token_field()}'
               f'<button class="btn danger" type=submit>Delete job</button>{requeue}</form>')
    actions += ('<p class=note>Actions need a token from this node\'s token file'
                + ("; requeue puts the job back to ready as a new attempt." if requeue else ".") + "</p>")
    if remote:
        there = (f'<a href="{esc(base + url("jobs", ident))}">its console</a>' if base else "its console")
        actions = (f'<p>This job is on node <b>{esc(detail["node"])}</b>: delete or requeue it from '
                   f'{there}.</p>')

    size = detail["payload_size"]
    shown_note = (f'<p class=note>The first 4 KiB of {fmt_int(size)} bytes.</p>' if size > 4096 else "")
    text = detail["payload_text"]
    text_pane = (f"<pre>{esc(text)}</pre>" if text is not None
                 else '<p class=muted>Not valid UTF-8: see the hex view.</p>')
    hex_pane = f"<pre>{esc(_hexdump(detail['payload_hex']))}</pre>"
    payload = (
        '<div class="card flush ptabs"><h2>Payload</h2>'
        f'<input type=radio name=pt id=pt-text {"checked" if text is not None else ""}>'
        f'<input type=radio name=pt id=pt-hex {"" if text is not None else "checked"}>'
        '<nav class=tabs><label for=pt-text>Text</label><label for=pt-hex>Hex</label></nav>'
        f'<div class=panes><div class="pane p-text">{text_pane}{shown_note}</div>'
        f'<div class="pane p-hex">{hex_pane}{shown_note}</div></div></div>')
    result = detail["result"]
    result_html = f"<pre>{esc(result)}</pre>" if result is not None else '<p class=muted>No result.</p>'
    extra = detail["extra"]
    extra_html = _kv([(k, _extra_value(k, v)) for k, v in sorted(extra.items())]) if extra \
        else '<p class=muted>Nothing more.</p>'
    history = ("<pre>" + esc("\n".join(detail["history"])) + "</pre>" if detail["history"]
               else '<p class=muted>No history lines: history is off on this node, or this job has none yet.</p>')
    body = (
        crumbs(("Overview", "/"), (j["queue"], queue_link), (ident, None))
        + f'<div class=head><h1 class=mono>Job {esc(ident)}</h1>{state_badge(j["state"])}</div>' + notice
        + '<div class="grid g2"><div class=card id=details><h2>Details</h2>' + _kv(facts) + "</div>"
        + '<div><div class=card id=lease><h2>Lease</h2>' + lease_html + "</div>"
        + '<div class=card id=actions><h2>Actions</h2>' + actions + "</div></div></div>"
        + payload
        + '<div class="grid g2"><div class=card><h2>Result</h2>' + result_html + "</div>"
        + '<div class=card><h2>More</h2>' + extra_html + "</div></div>"
        + '<div class=card id=history><h2>History</h2>' + history + "</div>")
    return page(f"Job {ident}", body, node)


#: How a lease holder's transport is said.
VIA = {"router": "through its router", "direct": "served by its shard directly"}


def _client_state(connected_s: Optional[float], left_s: Optional[float]) -> str:
    if left_s is not None:
        return f'<span class=warm>disconnected {esc(fmt_age(left_s))} ago</span>'
    if connected_s is not None:
        return f"connected for {esc(fmt_age(connected_s))}"
    return '<span class=muted>connected</span>'


def lease_facts(lease: Lease, timed: bool = True) -> str:
    """Who holds a leased job, since when, and how long it has left."""
    unknown = '<span class=muted>unknown</span>'
    facts = [("Holder", f'<span class=mono>{esc(lease["connection"])}</span>' if lease["connection"] else unknown),
             ("Protocol", f'<span class=chip>{esc(lease["protocol"])}</span>' if lease["protocol"] else unknown)]
    # (.get: a node of an older version may send a lease without them)
    client, via, leased = lease.get("client"), lease.get("via", ""), lease.get("leased_s")
    if client:
        facts.append(("Connection", f'<span class=mono>{esc(client)}</span> '
                                    f'<span class=muted>{esc(VIA.get(via, via))}</span>'))
        facts.append(("Client", _client_state(lease.get("connected_s"), lease.get("left_s"))))
    facts.append(("Leased", f'{esc(fmt_age(leased))} ago' if leased is not None else unknown))
    facts.append(("TTR left", fmt_age(lease["ttr_left_s"]) if timed else "no time limit"))
    return _kv(facts)


def _extra_value(key: str, value: object) -> str:
    """One of the engine's other fields: times as dates, milliseconds as durations too."""
    shown = f'<span class=mono>{esc(value if isinstance(value, str) else json.dumps(value, default=str))}</span>'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if 1e9 < value < 1e11 and not key.endswith(("_ms", "_s", "_us")):   # a unix time
            when = datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            return f'{esc(when)} <span class=muted>({esc(fmt_age(time.time() - value))} ago)</span>'
        if key.endswith("_ms") and value > 0:
            return f'{shown} <span class=muted>({esc(fmt_age(value / 1000))})</span>'
    if value is None:
        return '<span class=zero>—</span>'
    return shown


def _hexdump(hexed: str) -> str:
    """``hexed`` (plain hex) as lines of 16 bytes: offset, bytes, printable text."""
    try:
        data = bytes.fromhex(hexed)
    except ValueError:
        return hexed
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {hexes:<47}  {text}")
    return "\n".join(lines) or "(empty)"


# --------------------------------------------------------------- search
def search_page(text: str, found: SearchResult, node: str) -> str:
    parts = []
    job = found["job"]
    if job:
        j = job["job"]
        parts.append('<div class="card flush"><h2>Job</h2>'
                     + table([("Id", ""), ("Queue", ""), ("State", ""), ("Number", ""), ("Age", "")],
                             [f'<tr><td class=id><a href="{esc(url("jobs", j["id"]))}">{esc(j["id"])}</a></td>'
                              f'<td><a href="{esc(url("queues", j["queue"]))}">{esc(j["queue"])}</a></td>'
                              f'<td>{state_badge(j["state"])}</td><td class=n>{fmt_int(j["number"])}</td>'
                              f'<td class=n>{fmt_age(j["age_s"])}</td></tr>'], sortable=False) + "</div>")
    if found["queues"]:
        parts.append(f'<div class="card flush"><h2>Queues ({len(found["queues"])})</h2>'
                     + table([("Queue", "")], [f'<tr><td class=name><a href="{esc(url("queues", q))}">{esc(q)}</a>'
                                                '</td></tr>' for q in found["queues"]], sortable=False) + "</div>")
    if not parts:
        parts.append('<div class=card>' + empty("Nothing found",
                                                " — no queue name contains it and no job has that id or number.")
                     + "</div>")
    body = (crumbs(("Overview", "/"), ("Search", None))
            + f'<div class=head><h1>Search: {esc(text)}</h1></div>' + "".join(parts))
    return page(f"Search {text}", body, node, search=text)


# -------------------------------------------------------------- cluster
def _up(up: bool) -> str:
    return (f'<span class=badge style="--c:{"#12b76a" if up else "#ef4444"}">{"up" if up else "down"}</span>')


def cluster_page(view: ClusterView, node: str) -> str:
    nodes = view["nodes"]
    shards = [s for n in nodes for s in n["shards"]]
    links_up = sum(1 for link in view["links"] if link["state"] == "up")
    tiles = (f'<div class=tile style="--c:#12b76a"><div class=k>Nodes up</div>'
             f'<div class=v>{sum(n["up"] for n in nodes)}<small> / {len(nodes)}</small></div></div>'
             f'<div class=tile style="--c:#3b82f6"><div class=k>Shards up</div>'
             f'<div class=v>{sum(s["up"] for s in shards)}<small> / {len(shards)}</small></div></div>'
             f'<div class=tile style="--c:#8b5cf6"><div class=k>Jobs</div>'
             f'<div class=v>{fmt_int(sum(s["jobs"] for s in shards if s["role"] != "follower"))}</div></div>'
             f'<div class=tile style="--c:#f59e0b"><div class=k>Moves</div><div class=v>{len(view["moves"])}</div></div>'
             f'<div class=tile style="--c:{"#12b76a" if links_up == len(view["links"]) else "#ef4444"}">'
             f'<div class=k>Links up</div><div class=v>{links_up}<small> / {len(view["links"])}</small></div></div>')
    cards = []
    for n in nodes:
        rows = [f'<tr><td class=name>{esc(s["name"])}</td><td>{_up(s["up"])}</td>'
                + num_cell(s["jobs"]) + num_cell(s["queues"])
                + f'<td class=mono>{esc(s["slots"] or "all")}</td><td>{esc(s["role"])}</td>'
                + (num_cell(s["lag"]) if s["lag"] is not None else '<td class="n zero">—</td>') + "</tr>"
                for s in n["shards"]]
        console = (f' · <a href="{esc(n["console"])}">console</a>' if n["console"].startswith(("http://", "https://"))
                   else "")
        cards.append(
            f'<div class="card flush"><h2>{esc(n["name"])} {_up(n["up"])} '
            f'<span class=muted style="font-weight:400">{esc(n["host"])}{console}</span></h2>'
            + (table([("Shard", "text"), ("State", "text"), ("Jobs", "num"), ("Queues", "num"), ("Slots", "text"),
                      ("Role", "text"), ("Lag", "num")], rows) if rows else empty("No shards reported"))
            + "</div>")
    moves = view["moves"]
    if moves:
        keys = sorted({k for m in moves for k in m})
        moves_html = table([(k, "text") for k in keys],
                           ["<tr>" + "".join(f"<td>{esc(m.get(k, ''))}</td>" for k in keys) + "</tr>" for m in moves])
    else:
        moves_html = empty("No moves in progress")
    if view["links"]:
        links_html = table([("From", "text"), ("To", "text"), ("State", "text")],
                           [f'<tr><td>{esc(link["source"])}</td><td>{esc(link["target"])}</td>'
                            f'<td>{_up(True) if link["state"] == "up" else state_badge(link["state"])}</td></tr>'
                            for link in view["links"]])
    else:
        links_html = empty("No links", " — a single node talks to no other." if not view["clustered"] else "")
    sub = ("A cluster of " + str(len(nodes)) + " nodes." if view["clustered"]
           else "A single node (not part of a cluster).")
    body = (f'<div class=head><h1>Cluster</h1><div class=sub>{esc(sub)}</div></div>'
            f'<div class=tiles>{tiles}</div>' + "".join(cards)
            + '<div class="grid g2"><div class="card flush"><h2>Moves in progress</h2>' + moves_html + "</div>"
            + '<div class="card flush"><h2>Links</h2>' + links_html + "</div></div>")
    return page("Cluster", body, node, active="cluster")


# -------------------------------------------------------------- workers
def _holder_cells(holder: Optional[Dict[str, Any]]) -> str:
    if not holder:
        return '<td class=zero data-v="">unknown</td><td></td><td></td>'
    left = holder.get("left_s")
    gone = (f' <span class=warm title="the client disconnected; the lease runs until its TTR">'
            f'gone {esc(fmt_age(left))}</span>' if left is not None else "")
    return (f'<td class=mono data-v="{esc(holder["address"])}">{esc(holder["address"] or "—")}{gone}</td>'
            f'<td data-v="{esc(holder["protocol"])}"><span class=chip>{esc(holder["protocol"])}</span></td>'
            f'<td class=mono data-v="{esc(holder["client"])}">{esc(holder["client"])}</td>')


def workers_live(view: WorkersView) -> str:
    """The workers page's part that refreshes itself."""
    unknown = view["leases_unknown"]
    tiles = (f'<div class=tile style="--c:#3b82f6"><div class=k>Connections</div>'
             f'<div class=v>{fmt_int(view["connections_total"])}</div></div>'
             f'<div class=tile style="--c:#f59e0b"><div class=k>Leases</div>'
             f'<div class=v>{fmt_int(view["leases_total"])}</div></div>'
             f'<div class=tile style="--c:#10b981"><div class=k>Holding leases</div>'
             f'<div class=v>{fmt_int(sum(1 for c in view["connections"] if c["leases"]))}</div></div>'
             + (f'<div class=tile style="--c:#98a2b3"><div class=k>Holder unknown</div>'
                f'<div class=v>{fmt_int(unknown)}</div></div>' if unknown else ""))
    processes = table([("Router or shard", "text"), ("State", "text"), ("Connections", "num"), ("Leases", "num")],
                      [f'<tr><td class=name>{esc(p["name"])}</td><td>{_up(p["up"])}</td>'
                       + num_cell(p["connections"]) + num_cell(p["leases"]) + "</tr>" for p in view["processes"]])
    if view["connections"]:
        conns = table([("Router", "text"), ("Id", "num"), ("Address", "text"), ("Protocol", "text"),
                       ("Served by", "text"), ("Connected", "num"), ("Leases", "num")],
                      [f'<tr data-connection="{esc(c["router"])}-{c["connection"]}"><td>{esc(c["router"])}</td>'
                       + num_cell(c["connection"], str(c["connection"]))
                       + f'<td class=mono>{esc(c["address"] or "—")}</td>'
                       + f'<td><span class=chip>{esc(c["protocol"])}</span></td><td>{esc(c["served_by"])}</td>'
                       + num_cell(-1 if c["connected_s"] is None else c["connected_s"], fmt_age(c["connected_s"]))
                       + num_cell(c["leases"], cls="warm" if c["leases"] else "") + "</tr>"
                       for c in view["connections"]], body_id="connection-rows")
    else:
        conns = empty("No client connected", " — a worker that connects over any protocol shows here.")
    if view["leases"]:
        leases = table([("Job", "text"), ("Queue", "text"), ("Shard", "num"), ("Holder", "text"),
                        ("Protocol", "text"), ("Connection", "text"), ("Leased for", "num"), ("TTR left", "num"),
                        ("Attempt", "num")],
                       [f'<tr data-job="{esc(lease["job"]["id"])}"><td class=id>'
                        f'<a href="{esc(url("jobs", lease["job"]["id"]))}">{esc(lease["job"]["id"])}</a></td>'
                        f'<td class=name><a href="{esc(url("queues", lease["job"]["queue"]))}">'
                        f'{esc(lease["job"]["queue"])}</a></td>' + num_cell(lease["shard"], str(lease["shard"]))
                        + _holder_cells(lease["holder"])
                        + num_cell(-1 if lease["leased_s"] is None else lease["leased_s"], fmt_age(lease["leased_s"]))
                        + num_cell(-1 if lease["job"]["ttr_left_s"] is None else lease["job"]["ttr_left_s"],
                                   fmt_age(lease["job"]["ttr_left_s"]))
                        + num_cell(lease["job"]["attempts"]) + "</tr>" for lease in view["leases"]],
                       body_id="lease-rows")
    else:
        leases = empty("No job is leased", " — no worker holds a job now.")

    def more(shown: int, total: int, what: str) -> str:
        return (f'<p class="note pad">The first {fmt_int(shown)} of {fmt_int(total)} {what}.</p>'
                if total > shown else "")
    return (f'<div class=tiles>{tiles}</div>'
            f'<div class="card flush"><h2>Routers and shards</h2>{processes}</div>'
            f'<div class="card flush" id=connections><h2>Connections <span class=muted>'
            f'({fmt_int(view["connections_total"])})</span></h2>{conns}'
            f'{more(len(view["connections"]), view["connections_total"], "connections")}</div>'
            f'<div class="card flush" id=leases><h2>Leased jobs <span class=muted>'
            f'({fmt_int(view["leases_total"])})</span></h2>{leases}'
            f'{more(len(view["leases"]), view["leases_total"], "leased jobs, longest held first")}</div>')


def workers_page(view: WorkersView, node: str) -> str:
    body = ('<div class=head><h1>Workers</h1><span class=live id=live-state>live</span>'
            '<div class=sub>Every client connection of this node and the jobs leased to them, per router and '
            f'shard (at most {MAX_LISTED} of each listed); refreshes every 2 s.</div></div>'
            f'<section id=live data-src="/api/workers?format=html">{workers_live(view)}</section>')
    return page("Workers", body, node, active="workers")


# --------------------------------------------------------------- errors
TITLES = {400: "Bad request", 403: "Forbidden", 404: "Not found", 405: "Method not allowed", 411: "Length required",
          413: "Request too large", 500: "Internal error", 503: "Unavailable"}


def error_page(status: int, message: str, node: str) -> str:
    colour = "#f59e0b" if status < 500 else "#ef4444"
    if status == 403:
        colour = "#ef4444"
    title = TITLES.get(status, "Error")
    message = message.strip()
    if message:   # a sentence, whoever wrote it
        message = message[:1].upper() + message[1:] + ("" if message[-1:] in ".!?" else ".")
    body = (f'<div class="card err" style="--c:{colour}"><div class=code>{status}</div><h1>{esc(title)}</h1>'
            f'<p>{esc(message)}</p><p><a class="btn" href="/">Back to the overview</a></p></div>')
    return page(f"{status} {title}", body, node, scripts=False)


def history_missing(node: str) -> str:
    text = ("No history report to show: set [console] history_report in the config to where "
            "`queueserver history` writes its report.html, and run it.")
    return page("History", crumbs(("Overview", "/"), ("History", None))
                + '<div class=head><h1>History</h1></div><div class=card>'
                + empty("No history report yet", " — " + text) + "</div>", node, active="history")
