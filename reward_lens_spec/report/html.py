"""HTML of the store report: one self-contained page (inline CSS, a little vanilla JS, SVG data URIs).

The page holds the catalog (sortable by a click on a column head, filterable by text, trust,
observable and model) and one section per run; a run's section is shown alone when its anchor
is the URL fragment (``#run-<id>``, CSS ``:target``), so it works from ``file://`` and from any
static server with no request beyond the page itself. Every string from the store is escaped.
"""
from __future__ import annotations

import json
import re
from html import escape

from .catalog import Entry
from .figures import Figure
from .svg import data_uri

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;max-width:1180px;padding:12px 20px;color:#222}
h1{font-size:20px;margin:4px 0}h2{font-size:17px;margin:18px 0 6px}h3{font-size:15px;margin:14px 0 4px}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #e3e3e3;padding:4px 6px;text-align:left;
vertical-align:top}th{background:#f4f4f4;cursor:pointer;user-select:none;white-space:nowrap}
th[data-dir=asc]::after{content:" \\25B2"}th[data-dir=desc]::after{content:" \\25BC"}
td.num{text-align:right}.mono,code,pre{font-family:ui-monospace,monospace;font-size:12px}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:420px}
.filters{display:flex;gap:10px;flex-wrap:wrap;align-items:center;margin:8px 0}
.trust{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px;background:#eee}
.trust.calibrated{background:#d8ecd2}.trust.registered{background:#cfe0f5}.trust.adjudicated{background:#e6d8f2}
.trust.flagged{background:#f7c9c9}.ev{font-size:11px;color:#555;max-width:360px}.numbers{font-size:12px;max-width:340px}
section.run{display:none}section.run:target{display:block}body:has(section.run:target) #catalog{display:none}
figure{margin:10px 14px 10px 0;display:inline-block;vertical-align:top;max-width:560px}
figure img{border:1px solid #ddd;max-width:100%;height:auto}figcaption{font-size:12px;color:#444}
.side{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:16px}.side td{overflow-wrap:anywhere}
td.date{white-space:nowrap}.refusal{background:#fff4e5;border-left:4px solid #f0a500;
padding:6px 10px;margin:6px 0}.note{color:#555;font-size:12px}details{margin:8px 0}summary{cursor:pointer}
"""

JS = """
(function () {
  var table = document.getElementById("catalog-table");
  if (!table) return;
  var body = table.tBodies[0];
  var boxes = ["f-text", "f-trust", "f-observable", "f-model"].map(function (id) {
    return document.getElementById(id);
  });
  var count = document.getElementById("f-count");
  function apply() {
    var text = boxes[0].value.trim().toLowerCase(), shown = 0;
    Array.prototype.forEach.call(body.rows, function (tr) {
      var ok = (!text || tr.textContent.toLowerCase().indexOf(text) >= 0) &&
        (!boxes[1].value || tr.dataset.trust === boxes[1].value) &&
        (!boxes[2].value || tr.dataset.observable === boxes[2].value) &&
        (!boxes[3].value || tr.dataset.model === boxes[3].value);
      tr.hidden = !ok;
      if (ok) shown += 1;
    });
    count.textContent = shown + " of " + body.rows.length + " runs shown";
  }
  boxes.forEach(function (b) { b.addEventListener("input", apply); b.addEventListener("change", apply); });
  table.tHead.addEventListener("click", function (ev) {
    var th = ev.target.closest("th");
    if (!th) return;
    var i = th.cellIndex, num = th.dataset.type === "num", dir = th.dataset.dir === "asc" ? -1 : 1;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { delete h.dataset.dir; });
    th.dataset.dir = dir === 1 ? "asc" : "desc";
    function key(tr) {
      var c = tr.cells[i], v = c.dataset.sort !== undefined ? c.dataset.sort : c.textContent;
      if (!num) return v;
      var x = parseFloat(v);
      return isNaN(x) ? -Infinity : x;
    }
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      return (num ? (x > y) - (x < y) : String(x).localeCompare(String(y))) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
  apply();
})();
"""

COLUMNS = (("model", "str"), ("dataset", "str"), ("observable", "str"), ("pairs", "num"), ("key numbers", "str"),
           ("trust", "str"), ("date", "str"), ("run id", "str"))


def e(x) -> str:
    return escape(str(x), quote=True)


def trust_badge(entry: Entry) -> str:
    t = entry.trust
    cls = "flagged" if t.verified is False else e(t.level)
    return (f'<span class="trust {cls}" title="{e(t.status)}">{e(t.level)}</span> <span class="note">'
            f'{e(t.status)}</span><div class="ev">evidence: {e(t.evidence)}<br>scope: {e(t.scope)}</div>')


def catalog_table(entries: list[Entry]) -> str:
    head = "".join(f'<th data-type="{k}">{e(n)}</th>' for n, k in COLUMNS)
    rows = []
    for en in entries:
        pairs = "" if en.pairs is None else str(en.pairs)
        rows.append(
            f'<tr data-run="{e(en.run_id)}" data-trust="{e(en.trust.level)}" data-observable="{e(en.observable)}" '
            f'data-model="{e(en.model)}"><td>{e(en.model)}</td><td>{e(en.dataset)}</td><td>{e(en.observable)}</td>'
            f'<td class="num" data-sort="{e(pairs)}">{e(pairs or "?")}</td><td class="numbers">{e(en.numbers)}</td>'
            f'<td data-sort="{e(en.trust.level)}">'
            f'{trust_badge(en)}</td><td class="mono date">{e(en.created)}</td>'
            f'<td class="mono"><a href="#{e(en.anchor)}">{e(en.run_id)}</a></td></tr>')
    return f'<table id="catalog-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def sweep_tables(entries: list[Entry]) -> str:
    """Runs of one observable side by side (a sweep over models or data): one table per observable that two or
    more runs share, a row per run with its model, dataset, pairs, trust and key numbers."""
    by_obs: dict[str, list[Entry]] = {}
    for en in entries:
        if not en.observable.startswith("scorecard:"):
            by_obs.setdefault(en.observable, []).append(en)
    parts = []
    for obs, group in by_obs.items():
        if len(group) < 2:
            continue
        rows = [[e(en.model), e(en.dataset), e("" if en.pairs is None else en.pairs), e(en.trust.level),
                 f'<span class="numbers">{e(en.numbers)}</span>', f'<a class="mono" href="#{e(en.anchor)}">'
                 f'{e(en.run_id)}</a>'] for en in group]
        parts.append(f"<h3>{e(obs)}: {len(group)} runs</h3>"
                     + table(["model", "dataset", "pairs", "trust", "key numbers", "run"], rows))
    return f'<div id="side-by-side"><h2>Runs side by side</h2>{"".join(parts)}</div>' if parts else ""


def _select(id_: str, label: str, values) -> str:
    opts = "".join(f'<option value="{e(v)}">{e(v)}</option>' for v in sorted(set(values)))
    return f'<label>{e(label)} <select id="{id_}"><option value="">all</option>{opts}</select></label>'


def figure_html(fig: Figure) -> str:
    m = re.search(r'width="(\d+)" height="(\d+)"', fig.svg)
    size = f' width="{m.group(1)}" height="{m.group(2)}"' if m else ""
    return (f'<figure><img src="{data_uri(fig.svg)}" alt="{e(fig.title)}"{size}>'
            f"<figcaption><b>{e(fig.title)}.</b> {e(fig.caption)}</figcaption></figure>")


def details(summary: str, inner: str, *, open_: bool = False) -> str:
    return f'<details{" open" if open_ else ""}><summary>{e(summary)}</summary>{inner}</details>'


def pre(obj) -> str:
    text = obj if isinstance(obj, str) else json.dumps(obj, indent=2, sort_keys=True, default=str)
    return f"<pre>{e(text)}</pre>"


def kv_table(rows) -> str:
    return "<table>" + "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def table(head, rows) -> str:
    h = "".join(f"<th>{e(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def run_section(entry: Entry, body: str) -> str:
    return (f'<section class="run" id="{e(entry.anchor)}"><p><a href="#catalog">← catalog</a></p>'
            f'<h2>{e(entry.observable)} · {e(entry.model)} · {e(entry.dataset)}</h2>'
            f'<p class="mono">{e(entry.run_id)}</p>{body}</section>')


def page(store_url: str, generated: str, entries: list[Entry], sections: list[str], n_incomplete: int) -> str:
    """The whole page as one string."""
    filters = ('<div class="filters"><label>filter <input id="f-text" type="search" placeholder="any text"></label>'
               + _select("f-trust", "trust", [x.trust.level for x in entries])
               + _select("f-observable", "observable", [x.observable for x in entries])
               + _select("f-model", "model", [x.model for x in entries])
               + '<span id="f-count" class="note"></span></div>')
    skipped = (f'<p class="note">{n_incomplete} incomplete run(s) in the store are not results and are not '
               f'listed (<code>reward-lens-spec store gc url=...</code> removes them).</p>' if n_incomplete else "")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<title>reward_lens_spec store report</title><style>{CSS}</style></head><body>"
            f'<div id="catalog"><h1>Store <code>{e(store_url)}</code></h1>'
            f'<p class="note">{len(entries)} complete run(s); report generated {e(generated)} from the store '
            f"alone (no model). Click a column to sort, a run id to open its page.</p>{skipped}{filters}"
            f"{catalog_table(entries)}{sweep_tables(entries)}</div>{''.join(sections)}<script>{JS}</script></body></html>")
