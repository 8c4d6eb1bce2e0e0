"""``build_report(url, out_dir) -> Path``: the store's one-page HTML report (``<out_dir>/index.html``).

Reads the store only through the public reader (``open_store``: ``runs``, ``incomplete``,
``provenance``, ``config_yaml``, ``load(lazy=True)``), one run at a time (``open_run``): small
observables are read in one pass, large ones stay lazy and only the variables drawn are read.
Needs no model and no network; the page needs neither either (see ``html``). Raises ``StoreError`` for an
unreadable store; a run that cannot be read gets a section saying so, not a crash.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import RewardLensError
from ..store import open_store
from .catalog import Entry, entry, trust_of
from .compare_view import compare_view
from .arrays import first_objective, strs
from .figures import run_figures
from .html import details, e, figure_html, kv_table, page, pre, run_section, table
from .summary_stats import summary_cell
from .svg import fmt
from ..data.accounting import (KIND_FLAGS, PAIR_FLAGS, pairs_covered, pairs_limit, pairs_phrase,
    restricted_outputs)

MAX_MEAN_CELLS = 1_000_000          # the summary reads a variable's mean only up to this size
LOAD_AT_ONCE = 64 * 2**20           # a variable up to this many bytes is read when the run is opened
MAX_PAIR_ROWS = 500
HASHES = ("spec_hash", "model_fingerprint", "dataset_checksum", "study_hash", "git_sha", "observable_spec_hash")


def summary_table(ds) -> str:
    """Every variable: dims with sizes, units, gauge, trust attr, the statistic that fits it
    (``summary_stats.summary_cell``: a mean, a share per component, an off-diagonal, an estimate with its CI)
    and its n (pairs with a finite value; fewer than the run's where ``observable.pairs`` restricts the
    variable)."""
    rows = []
    for name in sorted(map(str, ds.data_vars)):       # zarr lists a group's arrays in no fixed order
        var = ds[name]
        dims = " × ".join(f"{d}={var.sizes[d]}" for d in var.dims) or "scalar"
        if var.size <= MAX_MEAN_CELLS and np.issubdtype(var.dtype, np.number):
            v = np.asarray(var.values, float)
            fin = v[np.isfinite(v)]
            mean = summary_cell(var) if fin.size else "no finite value"
            n = f"{pairs_covered(var)} of {var.sizes['pair']}" if "pair" in var.dims else f"{fin.size} cells"
        else:
            mean = f"not read ({var.size} cells)" if np.issubdtype(var.dtype, np.number) else "—"
            n = ""
        rows.append([e(name), e(dims), e(var.attrs.get("units", "")), e(var.attrs.get("gauge", "")),
                     e(var.attrs.get("trust", "")), e(mean), e(n)])
    return table(["variable", "dims", "units", "gauge", "trust", "summary", "n pairs"], rows)


def pair_table(ds, prov: dict) -> str:
    """The pairs in the one vocabulary (``data.accounting.pairs_phrase``: scored, excluded by reason with ids,
    flagged by flag, restricted outputs), then per pair its stored flags and its checks (margin ≤ 0, non-finite
    values, crystallization outside [0, 1]); ``margin ≤ 0`` is counted under its own name, not as flagged."""
    excluded = prov.get("excluded") or {}
    eff = prov.get("effective_n") if isinstance(prov.get("effective_n"), dict) else {}
    if not excluded and not prov.get("pair_flags") and "margin" not in ds:
        return ""
    excl_text = "; ".join(f"{k}: {len(v)} ({', '.join(map(str, v[:20]))}{' ...' if len(v) > 20 else ''})"
                          for k, v in excluded.items() if isinstance(v, list) and v) or "none"
    phrase = pairs_phrase(excluded, prov.get("pair_flags"), eff.get("n_scored"),
                          restricted_outputs(ds, pairs_limit(prov)))
    parts = [f"<p>Pairs: {e(phrase)}. Excluded ids: {e(excl_text)}.</p>"]
    if "margin" not in ds or "pair" not in ds["margin"].dims:
        return "".join(parts)
    margin = first_objective(ds["margin"])[0].transpose("pair", ...)
    m = np.asarray(margin.values, float).reshape(ds.sizes["pair"], -1)[:, 0]
    labels = {k: c for k, c in ds["margin"].coords.items() if c.dims == ("pair",)}   # the margin's own pair labels
    ids = strs(labels["pair"].values)    # (an output by dimension makes the observable's `dimension` a dim, not these)
    dim = strs(labels["dimension"].values) if "dimension" in labels else np.array([""] * len(ids))
    cf = (np.asarray(first_objective(ds["crystallization_fraction"])[0].values, float).ravel()
          if "crystallization_fraction" in ds else np.full(len(ids), np.nan))
    flag_cols = {f: np.asarray(labels[f].values, bool) for f in PAIR_FLAGS + KIND_FLAGS if f in labels}
    rows, n_le0, n_nonfinite = [], 0, 0
    for i in range(len(ids)):
        f = []
        if not np.isfinite(m[i]):
            f.append("margin not finite")
            n_nonfinite += 1
        elif m[i] <= 0:
            f.append("margin ≤ 0 (rejected preferred)")
            n_le0 += 1
        if "crystallization_fraction" in ds and np.isfinite(cf[i]) and not 0 <= cf[i] <= 1:
            f.append("crystallization fraction outside [0, 1]")
        if len(rows) < MAX_PAIR_ROWS:
            rows.append([f'<span class="mono">{e(ids[i])}</span>', e(dim[i]), e(fmt(m[i])),
                         e(fmt(cf[i])) if "crystallization_fraction" in ds else "",
                         e(", ".join(k for k, col in flag_cols.items() if col[i])), e("; ".join(f))])
    more = f" (first {MAX_PAIR_ROWS} of {len(ids)} shown)" if len(ids) > MAX_PAIR_ROWS else ""
    nf = f"; margin not finite {n_nonfinite}" if n_nonfinite else ""
    parts.append(details(f"Per-pair values and flags: margin ≤ 0 in {n_le0} of {len(ids)} pair(s){nf}{more}",
                         table(["pair", "dimension", "margin", "crystallization", "flagged", "checks"], rows)))
    return "".join(parts)


def provenance_block(store, run_id: str, prov: dict) -> str:
    """Hashes, the resolved config, versions and every other provenance attr, in one ``<details>``."""
    hashes = [(k, f'<span class="mono">{e(prov[k])}</span>') for k in HASHES if prov.get(k)]
    config = None
    try:
        config = store.config_yaml(run_id)
    except RewardLensError:
        pass
    rest = {k: v for k, v in prov.items() if k not in ("config_yaml", "config", *HASHES)}
    inner = (kv_table(hashes) + (f"<h3>Resolved config</h3>{pre(config)}" if config else "<p>No resolved config.</p>")
             + f"<h3>Versions</h3>{pre(prov.get('versions', {}))}<h3>All provenance attrs</h3>{pre(rest)}")
    return details("Provenance: resolved config, hashes, versions", inner)


def _side_by_side(store, prov: dict, rows: dict) -> str:
    """The two compared runs' identities and trust (as the catalog shows it), in two columns."""
    cols = []
    for rid in prov.get("runs", []):
        try:
            p = store.provenance(rid)
        except RewardLensError as exc:
            cols.append(f"<div><p>run {e(rid)}: {e(exc)}</p></div>")
            continue
        t = trust_of(rows.get(rid, {}), p)
        kv = [(k, e(p.get(k))) for k in ("model", "model_fingerprint", "dataset", "dataset_checksum")]
        cols.append(f'<div><h3><a href="#run-{e(rid)}">{e(rid)}</a></h3>'
                    + kv_table(kv + [("trust", e(f"{t.level} ({t.status}): {t.evidence}"))]) + "</div>")
    return f'<div class="side">{"".join(cols)}</div>'


def run_body(store, run_id: str, prov: dict, datasets: dict, rows: dict | None = None) -> str:
    """A run's section: summary, compare view, per observable variables, flags and figures, provenance."""
    keys = ("model", "model_family", "dataset", "observable", "created", "wall_s", "device", "dtype", "seed",
            "effective_n")
    parts = [kv_table([(k, e(prov[k])) for k in keys if k in prov])]
    if prov.get("observable") == "compare":
        figs, refusals, notes = compare_view(store, prov, datasets)
        parts.append("<h3>Side by side</h3>" + _side_by_side(store, prov, rows or {})
                     + "".join(figure_html(f) for f in figs))
        parts += [f'<div class="refusal"><b>{e(r.variable)}: not compared.</b> {e(r.message)}</div>' for r in refusals]
        parts += [f'<p class="note">skipped {e(n)}</p>' for n in notes]
    for obs, ds in datasets.items():
        parts.append(f"<h3>Observable {e(obs)}</h3>" + summary_table(ds) + pair_table(ds, prov))
        parts += [figure_html(f) for f in run_figures(ds, prov)]
    parts.append(provenance_block(store, run_id, prov))
    return "".join(parts)


def open_run(store, run_id: str, prov: dict | None = None) -> dict:
    """The run's observables: each variable up to ``LOAD_AT_ONCE`` bytes read at once, larger ones left
    lazy (dask), so only the variables drawn are read. Without dask: the reader's eager load."""
    try:
        import dask  # noqa: F401
    except ImportError:                             # the reader's lazy open needs dask
        return store.load(run_id, lazy=False, verdict=prov)
    return store.load(run_id, lazy=LOAD_AT_ONCE, verdict=prov)   # prov: its derived trust, not derived again


def build_report(url: str, out_dir, *, storage_options: dict | None = None) -> Path:
    """Write ``<out_dir>/index.html`` for every complete run of store ``url``; return its path."""
    store = open_store(url, storage_options=storage_options)
    df = store.runs()
    entries: list[Entry] = []
    sections: list[str] = []
    rows = {str(r["run_id"]): r for r in df.to_dict("records")}
    evidence = store.evidence()                      # one scan: each run's provenance derived from it
    for row in rows.values():
        run_id = str(row["run_id"])
        prov = store.provenance(run_id, evidence=evidence)
        try:
            datasets = open_run(store, run_id, prov)
            body = run_body(store, run_id, prov, datasets, rows)
        except RewardLensError as exc:
            datasets, body = {}, f'<div class="refusal">This run could not be read: {e(exc)}</div>'
        en = entry(row, prov, datasets)
        entries.append(en)
        sections.append(run_section(en, body))
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    html = page(store.url, generated, entries, sections, len(store.incomplete()))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    return path
