"""The frame of every console page (header, navigation, search box, the
style sheet inline) and the small formatting helpers the pages share.

Everything that comes from outside (queue names, ids, payloads, messages)
goes through :func:`esc` (``html.escape``, quotes too) before it is part of
a page; URLs are built with :func:`url` (each path segment percent-encoded).
"""
from __future__ import annotations

import html
import math
from typing import Iterable, Optional, Tuple
from urllib.parse import quote, urlencode

#: The colour of each job state (bars, badges, chips).
STATE_COLOURS = {"ready": "#3b82f6", "scheduled": "#8b5cf6", "leased": "#f59e0b",
                 "finished": "#10b981", "failed": "#ef4444", "completed": "#10b981"}

CSS = """
:root{--bg:#f4f6f9;--card:#fff;--line:#e4e7ec;--text:#1d2433;--muted:#667085;--accent:#4f46e5;
--accent-soft:#eef2ff;--ready:#3b82f6;--scheduled:#8b5cf6;--leased:#f59e0b;--finished:#10b981;
--failed:#ef4444;--mono:ui-monospace,SFMono-Regular,"DejaVu Sans Mono",Menlo,Consolas,monospace}
*{box-sizing:border-box}
html{background:var(--bg)}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:var(--text);background:var(--bg)}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
header.top{background:#151a2d;color:#e6e9f2;border-bottom:3px solid var(--accent)}
header.top .in{max-width:1680px;margin:0 auto;padding:0 24px;display:flex;align-items:center;gap:28px;height:58px}
.brand{display:flex;align-items:center;gap:10px;color:#fff;font-weight:700;font-size:16px;letter-spacing:.2px}
.brand:hover{text-decoration:none}
.logo{width:26px;height:26px;border-radius:7px;background:linear-gradient(135deg,#818cf8,#4f46e5);
display:inline-grid;place-items:center;font-size:13px;color:#fff}
.node{font-weight:500;font-size:12px;color:#c7cbe0;background:#262d48;border-radius:999px;padding:2px 10px}
nav.main{display:flex;gap:4px}
nav.main a{color:#c7cbe0;padding:7px 12px;border-radius:8px;font-weight:500}
nav.main a:hover{background:#232a44;color:#fff;text-decoration:none}
nav.main a.on{background:#2d3556;color:#fff}
form.search{margin-left:auto;display:flex}
form.search input{width:320px;border:1px solid #343c5e;background:#1e2540;color:#fff;border-radius:8px 0 0 8px;
padding:7px 12px;font:inherit;outline:none}
form.search input::placeholder{color:#8b91ad}
form.search input:focus{border-color:#818cf8}
form.search button{border:0;background:var(--accent);color:#fff;border-radius:0 8px 8px 0;padding:0 14px;font:inherit;
font-weight:600;cursor:pointer}
main{max-width:1680px;margin:0 auto;padding:26px 24px 60px}
h1{font-size:24px;margin:0;font-weight:700;letter-spacing:-.2px;word-break:break-all}
h1.mono{font-size:20px;letter-spacing:0}
h2{font-size:15px;margin:0 0 14px;font-weight:650}
.crumbs{color:var(--muted);font-size:13px;margin-bottom:6px}
.crumbs a{color:var(--muted)}.crumbs span{margin:0 6px;color:#b0b6c3}
.head{display:flex;align-items:center;gap:14px;flex-wrap:wrap;margin-bottom:20px}
.head .sub{color:var(--muted);width:100%;margin-top:-8px}
.card{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:18px 20px;margin-bottom:18px;
box-shadow:0 1px 2px rgba(16,24,40,.04)}
.card.flush{padding:0;overflow:auto}
.card.flush h2{padding:16px 20px 0}
.grid{display:grid;gap:18px;align-items:start}
.g2{grid-template-columns:minmax(0,1.35fr) minmax(0,1fr)}
.g3{grid-template-columns:repeat(3,minmax(0,1fr))}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(140px,1fr));gap:14px;margin-bottom:18px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:14px 16px;position:relative;
overflow:hidden;color:var(--text)}
a.tile:hover{text-decoration:none;border-color:#c7cdf9}
.tile .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.6px;font-weight:600}
.tile .v{font-size:26px;font-weight:700;font-variant-numeric:tabular-nums;margin-top:2px}
.tile .v small{font-size:13px;color:var(--muted);font-weight:500}
.tile::before{content:"";position:absolute;left:0;top:0;bottom:0;width:4px;background:var(--c,#cbd2e0)}
.tile.on{border-color:var(--c);box-shadow:0 0 0 1px var(--c) inset}
table{width:100%;border-collapse:collapse;font-variant-numeric:tabular-nums}
th,td{padding:9px 10px;text-align:left;border-bottom:1px solid #eef0f4;white-space:nowrap}
td.wrap{white-space:normal;min-width:90px}
th{font-size:12px;text-transform:uppercase;letter-spacing:.5px;color:var(--muted);font-weight:600;background:#fafbfc;
user-select:none}
th.sortable{cursor:pointer}th.sortable:hover{color:var(--text)}th.sortable:focus-visible{outline:2px solid var(--accent);outline-offset:-2px}
th.sorted-asc::after{content:" \\25B2";font-size:9px}th.sorted-desc::after{content:" \\25BC";font-size:9px}
tr:last-child td{border-bottom:0}
tbody tr:hover td{background:#f9fafc}
td.n,th.n{text-align:right}
td.id{font-family:var(--mono);font-size:13px}
td.name{font-weight:600;max-width:280px;overflow:hidden;text-overflow:ellipsis}
.zero{color:#b3b9c6}
.hot{color:var(--failed);font-weight:600}
.warm{color:#b45309;font-weight:600}
.bar{display:flex;height:10px;border-radius:5px;overflow:hidden;background:#eef0f4;min-width:90px}
.bar i{display:block;height:100%}
.bar-cell{width:120px}
.chip{display:inline-block;font-size:11.5px;font-weight:600;padding:1px 8px;border-radius:999px;background:#eef0f4;
color:#475467;margin:1px 4px 1px 0}
.badge{display:inline-block;font-size:12px;font-weight:650;padding:3px 10px;border-radius:999px;
color:#fff;background:var(--c,#667085);text-transform:uppercase;letter-spacing:.5px}
.dot{display:inline-block;width:8px;height:8px;border-radius:50%;background:var(--c,#cbd2e0);margin-right:6px}
.tabs{display:flex;gap:6px;padding:0 20px;border-bottom:1px solid var(--line);flex-wrap:wrap}
.tabs a,.tabs label{padding:10px 12px;color:var(--muted);font-weight:600;border-bottom:2px solid transparent;
margin-bottom:-1px;cursor:pointer}
.tabs a:hover,.tabs label:hover{color:var(--text);text-decoration:none}
.tabs a.on{color:var(--text);border-color:var(--c,var(--accent))}
.tabs .count{display:inline-block;margin-left:6px;font-size:11.5px;background:#eef0f4;border-radius:999px;
padding:0 7px;color:#475467}
.empty{padding:38px 20px;text-align:center;color:var(--muted)}
.empty b{display:block;color:var(--text);font-size:15px;margin-bottom:4px}
.pager{display:flex;align-items:center;gap:6px;padding:12px 20px;border-top:1px solid var(--line);color:var(--muted)}
.pager .sp{flex:1}
.pager a,.pager b{min-width:32px;text-align:center;padding:4px 9px;border:1px solid var(--line);border-radius:7px}
.pager b{background:var(--accent);color:#fff;border-color:var(--accent)}
.pager .off{color:#c0c5d0;padding:4px 9px}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:8px 22px;margin:0}
dl.kv dt{color:var(--muted)}dl.kv dd{margin:0;font-variant-numeric:tabular-nums;word-break:break-all}
.mono{font-family:var(--mono);font-size:13px}
pre{margin:0;font-family:var(--mono);font-size:12.5px;line-height:1.55;background:#0f1424;color:#dbe1f1;
border-radius:9px;padding:14px 16px;overflow:auto;max-height:420px;white-space:pre-wrap;word-break:break-all}
.ptabs input{display:none}
.ptabs .pane{display:none;padding:16px 20px}
.ptabs #pt-text:checked~.panes .p-text,.ptabs #pt-hex:checked~.panes .p-hex{display:block}
.ptabs #pt-text:checked~.tabs label[for=pt-text],.ptabs #pt-hex:checked~.tabs label[for=pt-hex]{color:var(--text);
border-color:var(--accent)}
.note{color:var(--muted);font-size:12.5px;margin-top:8px}
th.sel,td.sel{width:34px;padding-right:0}
td.error{white-space:normal;max-width:420px;color:#b42318;font-family:var(--mono);font-size:12.5px;
overflow-wrap:anywhere}
.listbar{padding:12px 20px;border-bottom:1px solid var(--line)}
form.filters{display:flex;gap:8px;flex-wrap:wrap;align-items:center;margin:0}
form.filters input,form.filters select{border:1px solid #d0d5dd;border-radius:8px;padding:6px 9px;font:inherit;
background:#fff}
form.filters input[type=search]{min-width:220px}
.bulkbar{padding:12px 20px;border-top:1px solid var(--line);background:#fafbfc}
.bulkbar form.act{margin:0}
.note.pad{padding:0 20px 12px}
form.act{display:flex;gap:8px;align-items:center;flex-wrap:wrap;margin:0 0 10px}
form.act input[type=password],form.act input[type=text]{border:1px solid #d0d5dd;border-radius:8px;padding:7px 10px;
font:inherit;width:200px}
.btn{border:1px solid #d0d5dd;background:#fff;color:var(--text);border-radius:8px;padding:7px 14px;font:inherit;
font-weight:600;cursor:pointer;display:inline-block}
.btn:hover{background:#f5f6f8;text-decoration:none}
.btn.danger{background:var(--failed);border-color:var(--failed);color:#fff}.btn.danger:hover{background:#dc2626}
.btn.primary{background:var(--accent);border-color:var(--accent);color:#fff}
.flash{border-radius:10px;padding:12px 16px;margin-bottom:18px;font-weight:500;border:1px solid}
.flash.ok{background:#ecfdf3;border-color:#abefc6;color:#067647}
.flash.warn{background:#fffaeb;border-color:#fedf89;color:#93370d}
.err{max-width:640px;margin:50px auto;text-align:center;padding:34px 28px 26px}
.err .code{font-size:64px;font-weight:800;color:var(--c);letter-spacing:-2px;line-height:1}
.err h1{margin:10px 0 8px}.err p{color:#475467;font-size:15px}
.live{display:inline-flex;align-items:center;gap:6px;font-size:12px;color:var(--muted);font-weight:500}
.live::before{content:"";width:8px;height:8px;border-radius:50%;background:#12b76a;box-shadow:0 0 0 3px #d1fadf}
.live.stale::before{background:#f79009;box-shadow:0 0 0 3px #fef0c7}
.legend{display:flex;gap:16px;font-size:12.5px;color:#475467;margin:-4px 0 8px}
.chart svg{width:100%;height:auto;display:block}
.grid.charts{grid-template-columns:repeat(2,minmax(0,1fr))}
.chart h3{font-size:13px;margin:0 0 6px;color:#475467;font-weight:600}
.chart-head{display:flex;align-items:center;gap:14px;flex-wrap:wrap;margin-bottom:10px}
.chart-head h2{margin:0}
nav.ranges{margin-left:auto;display:flex;gap:4px}
nav.ranges a,nav.ranges b{padding:3px 10px;border-radius:7px;border:1px solid var(--line);font-size:12.5px}
nav.ranges b{background:var(--accent);color:#fff;border-color:var(--accent)}
.danger-zone{border-color:#fecdca}
.danger-zone h2{color:#b42318}
.muted{color:var(--muted)}
footer{max-width:1680px;margin:0 auto;padding:0 24px 30px;color:#98a2b3;font-size:12px}
@media (max-width:1400px){th,td{padding:8px 6px}.bar{min-width:60px}.bar-cell{width:80px}}
@media (max-width:900px){.g2,.g3,.grid.charts{grid-template-columns:1fr}form.search input{width:180px}}
"""


def esc(value: object) -> str:
    """``value`` as text safe anywhere in HTML (element text and quoted attributes)."""
    return html.escape(str(value), quote=True)


def url(*segments: object, **query: object) -> str:
    """An absolute console path of ``segments`` (each percent-encoded, ``/`` too)
    and a query of the ``query`` items that are not None."""
    path = "/" + "/".join(quote(str(s), safe="") for s in segments)
    items = [(k, str(v)) for k, v in query.items() if v is not None]
    return path + ("?" + urlencode(items) if items else "")


def fmt_int(n: Optional[int]) -> str:
    return "—" if n is None else f"{n:,}"


def fmt_rate(x: float) -> str:
    """A per-second rate, short: 0, 0.4, 12.5, 340, 1.2k, 45k."""
    if x <= 0:
        return "0"
    if x < 10:
        return f"{x:.1f}".rstrip("0").rstrip(".") if x >= 0.05 else "<0.1"
    if x < 1000:
        return f"{x:.0f}"
    if x < 10_000:
        return f"{x / 1000:.1f}k"
    return f"{x / 1000:.0f}k"


def fmt_age(seconds: Optional[float]) -> str:
    """A duration for a person: 850ms, 42s, 3m 12s, 2h 05m, 3d 4h; None: —."""
    if seconds is None:
        return "—"
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def num_cell(value: float, text: Optional[str] = None, cls: str = "") -> str:
    """A right-aligned table cell whose sort key is ``value``; zero greyed."""
    shown = text if text is not None else (fmt_int(int(value)) if float(value).is_integer() else str(value))
    classes = " ".join(c for c in ("n", cls, "zero" if value == 0 and not cls else "") if c)
    return f'<td class="{classes}" data-v="{value:g}">{esc(shown)}</td>'


def state_badge(state: str) -> str:
    colour = STATE_COLOURS.get(state, "#667085")
    return f'<span class="badge" style="--c:{colour}">{esc(state)}</span>'


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``value`` (positive)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)


#: The tab's icon, inline (no request for /favicon.ico).
FAVICON = ('<link rel=icon href="data:image/svg+xml,'
           "%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 32 32'%3E%3Crect width='32' height='32' "
           "rx='8' fill='%234f46e5'/%3E%3Ctext x='16' y='22' font-size='17' font-family='sans-serif' "
           "font-weight='700' text-anchor='middle' fill='white'%3EQ%3C/text%3E%3C/svg%3E\">")

NAV: Tuple[Tuple[str, str], ...] = (("overview", "/"), ("failed", "/failed"), ("workers", "/workers"),
                                    ("cluster", "/cluster"), ("history", "/history/report"))


def page(title: str, body: str, node: str, active: str = "", search: str = "",
         scripts: bool = True) -> str:
    """A whole page: ``body`` (already HTML) in the console's frame."""
    links = "".join(f'<a href="{href}"{" class=on" if key == active else ""}>{key.capitalize()}</a>'
                    for key, href in NAV)
    script = '<script src="/static/console.js" defer></script>' if scripts else ""
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)} · queueserver</title>{FAVICON}<style>{CSS}</style>{script}</head><body>"
        '<header class=top><div class=in>'
        '<a class=brand href="/"><span class=logo>Q</span>queueserver</a>'
        f'<span class=node title="node">{esc(node)}</span>'
        f"<nav class=main>{links}</nav>"
        '<form class=search action="/search" method=get role=search>'
        f'<input name=q value="{esc(search)}" placeholder="Queue name, job id or number" '
        'aria-label="Search queues and jobs" maxlength=300>'
        "<button type=submit>Search</button></form>"
        f"</div></header><main>{body}</main>"
        f"<footer>queueserver console · node {esc(node)}</footer></body></html>\n")


def crumbs(*items: Tuple[str, Optional[str]]) -> str:
    """A breadcrumb line of (text, link or None)."""
    parts = [f'<a href="{esc(href)}">{esc(text)}</a>' if href else esc(text) for text, href in items]
    return '<div class=crumbs>' + "<span>/</span>".join(parts) + "</div>"


def empty(title: str, text: str = "") -> str:
    return f'<div class=empty><b>{esc(title)}</b>{esc(text)}</div>'


def table(head: Iterable[Tuple[str, str]], rows: Iterable[str], sortable: bool = True,
          body_id: str = "", select: bool = False) -> str:
    """A table of ``head`` (label, kind: "text", "num" or "" for unsortable) and row HTML;
    ``select``: its rows start with a box to pick them, its head with one to pick them all."""
    cells = ['<th class=sel><input type=checkbox class=select-all aria-label="select every job on this page">'
             '</th>'] if select else []
    for label, kind in head:
        classes = " ".join(c for c in ("n" if kind == "num" else "", "sortable" if kind and sortable else "") if c)
        attr = f' data-sort="{kind}"' if kind and sortable else ""
        cells.append(f'<th class="{classes}"{attr}>{esc(label)}</th>')
    tbody = f'<tbody id="{body_id}">' if body_id else "<tbody>"
    return f'<table class="{"sort" if sortable else ""}"><thead><tr>{"".join(cells)}</tr></thead>' \
           f'{tbody}{"".join(rows)}</tbody></table>'
