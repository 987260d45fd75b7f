"""The report's chart styles and script: the values under the pointer, and zooming into a time range.

The page carries them inline (the report is one self-contained file, read
on machines with no network): no library, no request. The script reads
each ``svg.chart``'s data (the JSON after it, :func:`.charts._data`) and

* on hover shows a tooltip with the values of the bucket (time charts: every
  series; the heat map: the queue and its count) or the queue (the bar
  chart: each outcome and the total) under the pointer, and shades it;
* on a drag across a time chart zooms every time chart of that figure to
  the buckets dragged over (the plot area's ``viewBox``, in buckets, is
  narrowed; the time labels are redrawn for the range, the bar values
  moved); a double-click or "Show all" zooms back out.

tests/test_history_report_browser.py drives both in Chromium.
"""
from __future__ import annotations

STYLE = """
.plot { position: relative; }
svg.chart { display: block; width: 100%; height: auto; margin-top: 4px;
            font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif; }
svg.chart .grid { stroke: #e6e8ec; stroke-width: 1; }
svg.chart .tick, svg.chart .axis { fill: #5d6b7b; font-size: 11px; }
svg.chart .legend, svg.chart .name { fill: #333; font-size: 12px; }
svg.chart .value { fill: #333; font-size: 11px; }
svg.chart .panel-title { fill: #1d2733; font-size: 13px; font-weight: 600; }
svg.area { cursor: crosshair; }
svg.area .bg { fill: transparent; }
svg.area .line { fill: none; stroke-width: 1.6; vector-effect: non-scaling-stroke; }
svg.area .line.runs { stroke-width: 2.6; }
svg.area .dashed { stroke-dasharray: 4 3; }
svg.area .band { stroke: none; }
svg.area rect { shape-rendering: crispEdges; }
svg.area .hover { fill: rgba(29, 39, 51, 0.09); pointer-events: none; }
svg.area .select { fill: rgba(76, 120, 168, 0.22); pointer-events: none; }
.tip { position: absolute; z-index: 2; pointer-events: none; background: #fff; color: #1d2733;
       border: 1px solid #cfd6df; border-radius: 6px; padding: 6px 9px; font-size: 0.82em;
       line-height: 1.5; box-shadow: 0 2px 8px rgba(0, 0, 0, 0.12); white-space: nowrap; }
.tip b { display: block; font-weight: 600; }
.tip i { display: inline-block; width: 9px; height: 9px; border-radius: 2px; margin-right: 6px;
         font-style: normal; }
.tip span { float: right; margin-left: 14px; font-variant-numeric: tabular-nums; }
.zoombar { display: flex; gap: 12px; align-items: center; color: #5d6b7b; font-size: 0.82em;
           margin-top: 6px; }
.zoombar button { font: inherit; padding: 2px 10px; border: 1px solid #cfd6df; border-radius: 6px;
                  background: #f8f9fb; cursor: pointer; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var NS = null;   // the SVG namespace, taken from the page's first chart
  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  var STEPS = [1, 2, 3, 5, 6, 10, 12, 15, 20, 30, 60, 120, 240, 360, 720, 1440];

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function hm(ms) { var d = new Date(ms); return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()); }
  function day(ms) { var d = new Date(ms); return MONTHS[d.getUTCMonth()] + " " + pad(d.getUTCDate()); }
  function start(data, i) { return data.first + i * data.width; }
  function stamp(data, ms) { return data.width >= 86400000 ? day(ms) : day(ms) + " " + hm(ms); }
  function span(data, i) {
    var a = start(data, i), b = a + data.width;
    if (data.width >= 86400000) { return day(a) + " UTC"; }
    return day(a) + " " + hm(a) + "\u2013" + hm(b) + " UTC";
  }
  function count(v) { return Number(v).toLocaleString("en-US"); }
  function seconds(v) {   // as charts.short_seconds
    if (v <= 0) { return "0"; }
    var units = [[3600, "h"], [60, "min"], [1, "s"], [1e-3, "ms"], [1e-6, "\u00b5s"]];
    for (var k = 0; k < units.length; k++) {
      if (v >= units[k][0]) { return Number((v / units[k][0]).toPrecision(3)) + " " + units[k][1]; }
    }
    return Number((v / 1e-6).toPrecision(2)) + " \u00b5s";
  }
  function value(data, v) {
    if (v === null || v === undefined) { return "\u2013"; }
    return data.format === "seconds" ? seconds(v) : count(v);
  }
  function ticks(n, most) {   // as charts.tick_positions
    var out = [], step, k;
    if (n <= most) { for (k = 0; k < n; k++) { out.push(k); } return out; }
    step = Math.ceil(n / most);
    for (k = 0; k < STEPS.length; k++) { if (Math.ceil(n / STEPS[k]) <= most) { step = STEPS[k]; break; } }
    for (k = 0; k < n; k += step) { out.push(k); }
    return out;
  }
  function esc(text) {
    return String(text).replace(/[&<>"]/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;"}[c];
    });
  }
  function line(name, color, text) {
    return "<div>" + (color ? "<i style=\"background:" + color + "\"></i>" : "") + esc(name) +
           " <span>" + esc(text) + "</span></div>";
  }

  function Chart(svg, figure) {
    NS = svg.namespaceURI;
    this.svg = svg;
    this.figure = figure;
    this.data = JSON.parse(svg.nextElementSibling.textContent);
    this.area = svg.querySelector("svg.area");
    this.height = Number(this.area.getAttribute("height"));
    this.left = Number(this.area.getAttribute("x"));
    this.top = Number(this.area.getAttribute("y"));
    this.width = Number(this.area.getAttribute("width"));
    this.plot = svg.parentNode;
    this.tip = this.plot.querySelector(".tip");
    this.hover = this.area.querySelector(".hover");
    this.select = this.area.querySelector(".select");
    this.a = 0;
    this.b = this.data.axis === "time" ? this.data.count : this.width;
    this.rows = this.data.rows ? this.data.rows.length : 0;
    var self = this;
    this.area.addEventListener("mousemove", function (e) { self.move(e); });
    this.area.addEventListener("mouseleave", function () { self.leave(); });
    if (this.data.axis === "time") {
      this.area.addEventListener("mousedown", function (e) { self.down(e); });
      this.area.addEventListener("dblclick", function (e) { e.preventDefault(); zoom(figure, null); });
    }
  }
  Chart.prototype.rect = function () {
    // The plot area on the page, from the chart's own box: a nested svg's client rect is that
    // of its content, which a zoom stretches far beyond the area.
    var outer = this.svg.getBoundingClientRect(), scale = outer.width / this.svg.viewBox.baseVal.width;
    return {left: outer.left + this.left * scale, top: outer.top + this.top * scale,
            width: this.width * scale, height: this.height * scale};
  };
  Chart.prototype.at = function (e) {
    var r = this.rect();
    var fx = Math.min(Math.max((e.clientX - r.left) / r.width, 0), 0.999999);
    var fy = Math.min(Math.max((e.clientY - r.top) / r.height, 0), 0.999999);
    return {bucket: Math.floor(this.a + fx * (this.b - this.a)), row: Math.floor(fy * this.rows),
            x: e.clientX, y: e.clientY};
  };
  Chart.prototype.move = function (e) {
    var p = this.at(e), d = this.data, html = "", k, total;
    if (this.dragFrom !== undefined) {
      var lo = Math.min(this.dragFrom, p.bucket), hi = Math.max(this.dragFrom, p.bucket);
      this.select.setAttribute("x", lo);
      this.select.setAttribute("width", hi - lo + 1);
    }
    if (d.axis === "rows") {
      if (!this.rows) { return; }
      var row = d.rows[p.row];
      var rowPx = this.height / this.rows;
      this.hover.setAttribute("x", 0); this.hover.setAttribute("width", this.width);
      this.hover.setAttribute("y", p.row * rowPx); this.hover.setAttribute("height", rowPx);
      html = "<b>" + esc(row.name) + "</b>";
      total = 0;
      for (k in row.counts) { if (row.counts[k]) { html += line(k, null, count(row.counts[k])); total += row.counts[k]; } }
      html += line("all", null, count(total));
    } else if (d.kind === "heat") {
      if (!this.rows) { return; }
      var cell = d.rows[p.row];
      var h = this.height / this.rows;
      this.hover.setAttribute("x", p.bucket); this.hover.setAttribute("width", 1);
      this.hover.setAttribute("y", p.row * h); this.hover.setAttribute("height", h);
      html = "<b>" + esc(cell.name) + "</b>" + line(span(d, p.bucket), null,
              count(cell.values[p.bucket]) + " " + d.unit);
    } else {
      this.hover.setAttribute("x", p.bucket); this.hover.setAttribute("width", 1);
      html = "<b>" + esc(span(d, p.bucket)) + "</b>";
      for (k = 0; k < d.series.length; k++) {
        html += line(d.series[k].name, d.series[k].color, value(d, d.series[k].values[p.bucket]));
      }
    }
    this.show(html, p);
  };
  Chart.prototype.show = function (html, p) {
    var r = this.plot.getBoundingClientRect();
    this.tip.innerHTML = html;
    this.tip.hidden = false;
    var x = p.x - r.left + 14, y = p.y - r.top + 14;
    if (x + this.tip.offsetWidth > r.width) { x = Math.max(0, p.x - r.left - this.tip.offsetWidth - 14); }
    this.tip.style.left = x + "px";
    this.tip.style.top = y + "px";
  };
  Chart.prototype.leave = function () {
    this.tip.hidden = true;
    this.hover.setAttribute("width", 0);
  };
  Chart.prototype.down = function (e) {
    if (e.button !== 0) { return; }
    e.preventDefault();
    var self = this;
    this.dragFrom = this.at(e).bucket;
    function up(ev) {
      window.removeEventListener("mouseup", up);
      var from = self.dragFrom, to = self.at(ev).bucket;
      self.dragFrom = undefined;
      self.select.setAttribute("width", 0);
      if (to !== from) { zoom(self.figure, [Math.min(from, to), Math.max(from, to) + 1]); }
    }
    window.addEventListener("mouseup", up);
  };
  Chart.prototype.range = function (a, b) {
    var d = this.data, n = b - a, self = this;
    this.a = a; this.b = b;
    this.area.setAttribute("viewBox", a + " 0 " + n + " " + this.height);
    var group = this.svg.querySelector("g.xticks");
    while (group.firstChild) { group.removeChild(group.firstChild); }
    var shown = ticks(n, 9), previous = null;
    shown.forEach(function (t) {
      var i = a + t, ms = start(d, i);
      var x = self.left + (t + (d.centred ? 0.5 : 0)) * self.width / n;
      var text = document.createElementNS(NS, "text");
      text.setAttribute("x", x); text.setAttribute("y", self.top + self.height + 16);
      text.setAttribute("text-anchor", "middle");
      text.setAttribute("class", "tick xt");
      var lines = d.width >= 86400000 ? [day(ms)]
                : (previous === null || day(previous) !== day(ms)) ? [hm(ms), day(ms)] : [hm(ms)];
      lines.forEach(function (words, k) {
        var span = document.createElementNS(NS, "tspan");
        span.setAttribute("x", x); span.setAttribute("dy", k ? "1.15em" : "0");
        span.textContent = words;
        text.appendChild(span);
      });
      group.appendChild(text);
      previous = ms;
    });
    this.svg.querySelectorAll("[data-bx]").forEach(function (label) {
      var bx = Number(label.getAttribute("data-bx"));
      label.setAttribute("x", self.left + (bx - a) * self.width / n);
      label.style.display = bx < a || bx > b ? "none" : "";
    });
  };

  function zoom(figure, range) {
    var charts = figure.charts.filter(function (c) { return c.data.axis === "time"; });
    if (!charts.length) { return; }
    var whole = charts[0].data.count;
    var a = range ? Math.max(0, range[0]) : 0, b = range ? Math.min(whole, range[1]) : whole;
    charts.forEach(function (c) { c.range(a, b); });
    var d = charts[0].data;
    figure.bar.querySelector(".reset").hidden = !range;
    figure.bar.querySelector(".range").textContent = range
      ? "Showing " + stamp(d, start(d, a)) + " to " + stamp(d, start(d, b)) + " UTC: " + (b - a) +
        " of " + whole + " buckets (one per " + d.bucket + ")."
      : "Drag across the chart to zoom into a time range.";
  }

  document.querySelectorAll("figure.chart").forEach(function (figure) {
    figure.charts = [];
    figure.querySelectorAll("svg.chart").forEach(function (svg) { figure.charts.push(new Chart(svg, figure)); });
    if (figure.charts.some(function (c) { return c.data.axis === "time"; })) {
      var bar = document.createElement("div");
      bar.className = "zoombar";
      bar.innerHTML = "<span class=\"range\"></span><button type=\"button\" class=\"reset\" hidden>Show all</button>";
      bar.querySelector(".reset").addEventListener("click", function () { zoom(figure, null); });
      figure.appendChild(bar);
      figure.bar = bar;
      zoom(figure, null);
    }
  });
}());
"""
