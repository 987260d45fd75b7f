"""The console's one script, served as ``/static/console.js``: kept here as a
string so that it ships inside the package with no package-data setting.

Small and framework-free, and the pages work without it (it only adds):
click a table header to sort by that column (numbers by their ``data-v``);
an element with ``data-src`` is refreshed from that URL every 2 s (the
overview's live section, a queue's chart) while the tab is visible, and a
table's sort is kept across refreshes; a token typed into one action form
is offered in the others of the tab once an action with it succeeded
(``sessionStorage``: gone with the tab). A list's head box picks every job
of its page, and a button with ``data-confirm`` (a bulk action) asks first.
"""

CONSOLE_JS = r"""
(function () {
  "use strict";
  var sortState = {};   // table key -> [column index, direction]

  function key(table) { return table.closest("[id]") ? table.closest("[id]").id : "t"; }

  function cellValue(row, index, kind) {
    var cell = row.children[index];
    if (!cell) return kind === "num" ? -Infinity : "";
    var v = cell.getAttribute("data-v");
    if (v === null) v = cell.textContent.trim();
    if (kind === "num") { var n = parseFloat(v); return isNaN(n) ? -Infinity : n; }
    return v.toLowerCase();
  }

  function sortTable(table, index, dir) {
    var th = table.tHead.rows[0].cells[index];
    if (!th) return;
    var kind = th.getAttribute("data-sort");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index, kind), y = cellValue(b, index, kind);
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) {
      c.classList.remove("sorted-asc", "sorted-desc");
    });
    th.classList.add(dir > 0 ? "sorted-asc" : "sorted-desc");
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
  }

  function wireTables(root) {
    Array.prototype.forEach.call(root.querySelectorAll("table.sort"), function (table) {
      var k = key(table);
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
        if (!th.hasAttribute("data-sort")) return;
        th.tabIndex = 0;
        th.setAttribute("role", "button");
        th.addEventListener("keydown", function (e) {
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); th.click(); }
        });
        th.addEventListener("click", function () {
          var cur = sortState[k];
          var dir = cur && cur[0] === index ? -cur[1]
                    : (th.getAttribute("data-sort") === "num" ? -1 : 1);
          sortState[k] = [index, dir];
          sortTable(table, index, dir);
        });
      });
      if (sortState[k]) sortTable(table, sortState[k][0], sortState[k][1]);
    });
  }

  function refresh(el) {
    if (document.hidden || el.busy) return;   // one request at a time, none in a hidden tab
    el.busy = true;
    var badge = document.getElementById("live-state");
    fetch(el.getAttribute("data-src"), {headers: {"Accept": "text/html"}, cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) {
        el.innerHTML = html;
        wireTables(el);
        if (badge) { badge.classList.remove("stale"); badge.textContent = "live"; }
      })
      .catch(function () {
        if (badge) { badge.classList.add("stale"); badge.textContent = "reconnecting"; }
      })
      .then(function () { el.busy = false; });
  }

  function rememberTokens() {
    // A token is kept for the tab only once an action with it succeeded (the
    // page after it shows the green notice): a mistyped one is never offered.
    var saved = null;
    try {
      var pending = sessionStorage.getItem("qs-token-pending");
      sessionStorage.removeItem("qs-token-pending");
      if (pending && document.querySelector(".flash.ok")) sessionStorage.setItem("qs-token", pending);
      saved = sessionStorage.getItem("qs-token");
    } catch (e) {}
    Array.prototype.forEach.call(document.querySelectorAll("input[name=token]"), function (input) {
      if (saved && !input.value) input.value = saved;
      input.form.addEventListener("submit", function () {
        try { sessionStorage.setItem("qs-token-pending", input.value); } catch (e) {}
      });
    });
  }

  function wireBulk() {
    // a list's head box picks every job of the page; a button that acts on
    // many jobs asks first (without the script, the form posts as it is)
    document.addEventListener("change", function (e) {
      var box = e.target;
      if (!box.classList || !box.classList.contains("select-all")) return;
      var table = box.closest("table");
      Array.prototype.forEach.call(table.querySelectorAll("input[name=id]"), function (b) {
        b.checked = box.checked;
      });
    });
    document.addEventListener("click", function (e) {
      var button = e.target.closest ? e.target.closest("button[data-confirm]") : null;
      if (button && !window.confirm(button.getAttribute("data-confirm"))) e.preventDefault();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    wireTables(document);
    wireBulk();
    rememberTokens();
    Array.prototype.forEach.call(document.querySelectorAll("[data-src]"), function (el) {
      setInterval(function () { refresh(el); }, 2000);
    });
  });
})();
"""
