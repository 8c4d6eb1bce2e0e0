"""The standard figures of one stored run, as SVG with a caption naming units and gauge.

``run_figures(ds, prov) -> list[Figure]`` draws what an observable's Dataset holds:

- ``lens``: normed reward lens (margin read at each depth, layer −1 = embedding), mean ± 95% CI
  (mean ± 1.96·s.e. over pairs) per ``dimension``; the mean margin Δ marked (dashed);
- ``dla``: mean direct linear attribution, layer × component (diverging, centred at 0);
- ``patch_effect``: mean exact activation-patching effect, layer × component;
- ``crystallization_fraction``: histogram over pairs; bins of 0.05 on [0, 1], extended by
  bins of the same width to reach any value outside it (drawn in another colour and counted);
- confounders: every ``*statistic × bound`` variable as estimates with their 95% CI, and
  margin against ``length_log_ratio`` per pair;
- ``reliability_*`` (fit reports): calibration curve of σ(Δ) with bin counts and the ECE;
- ``reading × strength`` (scorecards): each criterion's reading against planted strength;
- any other variable, user-defined or not, chosen by its dims (``generic_figure``): ``pair × layer`` as
  mean ± 95% CI by layer (a line), ``layer`` alone as a line, ``pair × component`` as one bar per component
  (mean ± 95% CI over pairs), ``pair × layer × component`` as a layer × component heat map.

Variables with an ``objective`` dim are drawn for the first objective (named in the title).
Only finite values are drawn; every caption counts what was not. Needs no model.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .arrays import crystallization_bins, first_objective, mean_ci, strs
from .svg import PALETTE, Chart, fmt, heatmap, span


@dataclass(frozen=True)
class Figure:
    """One chart: ``svg`` (a standalone SVG document), its ``title`` and ``caption`` (plain text)."""

    title: str
    svg: str
    caption: str


def units_and_gauge(da) -> str:
    """The caption's units and gauge (and the variable's own trust, where it carries one)."""
    trust = f" Trust: {da.attrs['trust']}." if da.attrs.get("trust") else ""
    return f"Units: {da.attrs.get('units', 'unknown')}. Gauge: {da.attrs.get('gauge', 'unknown')}.{trust}"


def _nonfinite(v: np.ndarray) -> str:
    k = int((~np.isfinite(v)).sum())
    return f" {k} non-finite value(s) not drawn." if k else ""


def lens_figure(ds) -> Figure:
    da, tag = first_objective(ds["lens"])
    da = da.transpose("pair", "layer")
    vals = np.asarray(da.values, float)
    layers = np.asarray(da["layer"].values, float)
    dims = strs(da["dimension"].values) if "dimension" in da.coords else np.array([""] * da.sizes["pair"])
    series = []
    for d in sorted(set(dims.tolist())):
        m, lo, hi = mean_ci(vals[dims == d])
        series.append((d or "all", int((dims == d).sum()), m, lo, hi))
    margin = None
    if "margin" in ds:
        mv = np.asarray(first_objective(ds["margin"])[0].values, float)
        margin = float(np.nanmean(mv)) if np.isfinite(mv).any() else None
    c = Chart(span(layers), span(*[s[2:] for s in series], include=[0] + ([margin] if margin is not None else [])),
              "layer (−1 = embedding)", f"margin read at depth ({da.attrs.get('units', 'reward')})",
              xticks=[(x, str(int(x))) for x in layers[:: max(1, len(layers) // 12)]])
    c.hline(0, "#999", dash=None)
    for i, (d, n, m, lo, hi) in enumerate(series):
        col = PALETTE[i % len(PALETTE)]
        c.band(layers, lo, hi, col)
        c.line(layers, m, col, label=f"{d} (n={n})")
    if margin is not None:
        c.hline(margin, "#000", label=f"mean margin Δ = {fmt(margin)}")
    return Figure(f"Reward lens{tag}", c.render(),
                  f"Normed reward lens: the margin read at each depth, mean ± 95% CI (1.96 s.e.) over "
                  f"{vals.shape[0]} pairs, one line per dimension; dashed: the mean margin Δ, which the lens "
                  f"equals at the last layer. {units_and_gauge(da)}{_nonfinite(vals)}")


def _grid(ds, var: str, what: str) -> tuple[Figure, np.ndarray, object]:
    da, tag = first_objective(ds[var])
    da = da.transpose("pair", "layer", "component")
    vals = np.asarray(da.values, float)
    keep_c = np.isfinite(vals).any((0, 1))
    keep_l = np.isfinite(vals).any((0, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)             # all-NaN cells stay NaN (grey)
        m = np.nanmean(vals[:, keep_l][:, :, keep_c], 0)
    rows = [str(x) for x in np.asarray(da["layer"].values)[keep_l]]
    cols = [str(x) for x in strs(da["component"].values)[keep_c]]
    svg = heatmap(m, rows, cols, xlabel="component", ylabel="layer (−1 = embedding)")
    cap = (f"{what}, mean over {vals.shape[0]} pairs per layer × component (red > 0 > blue; grey: not "
           f"defined at that site). {units_and_gauge(da)}")
    return Figure(f"{what}{tag}", svg, cap), m, (rows, cols)


def dla_figure(ds) -> Figure:
    fig, m, _ = _grid(ds, "dla", "Direct linear attribution")
    da = first_objective(ds["dla"])[0].transpose("pair", ...)
    vals = np.asarray(da.values, float).reshape(da.sizes["pair"], -1)
    total = float(np.nanmean(np.nansum(vals, 1)))
    extra = f" Sum over cells, mean over pairs: {fmt(total)}"
    if "margin" in ds:
        extra += f" (mean margin Δ: {fmt(np.nanmean(np.asarray(first_objective(ds['margin'])[0].values, float)))})"
    return Figure(fig.title, fig.svg, fig.caption + extra + ".")


def patch_figure(ds) -> Figure:
    fig, m, (rows, cols) = _grid(ds, "patch_effect", "Activation patching effect")
    if not np.isfinite(m).any():
        return fig
    i, j = np.unravel_index(np.nanargmax(np.abs(m)), m.shape)
    return Figure(fig.title, fig.svg, fig.caption + f" Largest |mean effect|: layer {rows[i]} {cols[j]} = "
                  f"{fmt(m[i, j])}.")


def crystallization_figure(ds) -> Figure:
    da, tag = first_objective(ds["crystallization_fraction"])
    v = np.asarray(da.values, float).ravel()
    edges, counts = crystallization_bins(v)
    fin = v[np.isfinite(v)]
    out = int(((fin < 0) | (fin > 1)).sum())
    c = Chart(span(edges, pad=0.0), (0, max(1, int(counts.max(initial=0))) * 1.08),
              "crystallization fraction (layer / n_layers)", "pairs")
    for a, b, k in zip(edges[:-1], edges[1:], counts):
        inside = a >= -1e-12 and b <= 1 + 1e-12
        c.rect(a, b, 0, k, "#9467bd" if inside else "#d62728", stroke="#fff",
               title=f"[{fmt(a)}, {fmt(b)}): {int(k)} pair(s)")
    stats = f" Mean {fmt(fin.mean())}, median {fmt(np.median(fin))}." if fin.size else ""
    outside = (f" {out} value(s) outside [0, 1], drawn in red extra bins." if out else " All values in [0, 1].")
    return Figure(f"Crystallization{tag}", c.render(),
                  f"Crystallization fraction over pairs (first lens layer reaching half the final margin, / "
                  f"n_layers), {fin.size} finite value(s) in 0.05-wide bins.{outside}{stats} {units_and_gauge(da)}"
                  f"{_nonfinite(v)}")


def forest_figure(ds, name: str) -> Figure:
    da, tag = first_objective(ds[name])
    sdim = [d for d in da.dims if d != "bound"][0]
    da = da.transpose(sdim, "bound")
    names = strs(da[sdim].values)
    bounds = list(strs(da["bound"].values))
    vals = np.asarray(da.values, float)
    est, lo, hi = (vals[:, bounds.index(b)] for b in ("estimate", "ci_low", "ci_high"))
    counts = [f"{s} = {fmt(e)}" for s, e in zip(names, est) if s.startswith("n_")]
    keep = np.array([not s.startswith("n_") for s in names])
    names, est, lo, hi = names[keep], est[keep], lo[keep], hi[keep]
    k = len(names)
    c = Chart(span(est, lo, hi, include=[0]), (-0.5, k - 0.5), f"estimate ({da.attrs.get('units', '')})", "",
              height=max(140, 22 * k + 70), left=150, yticks=[(k - 1 - i, s) for i, s in enumerate(names)])
    c.vline(0, "#999", dash=None)
    y = np.arange(k)[::-1]
    c.errorbars(y, lo, hi, PALETTE[0], horizontal=True)
    c.points(est, y, PALETTE[0])
    return Figure(f"{name}{tag}", c.render(),
                  f"{name}: estimates (dots) with their 95% CI (lines) per statistic. "
                  f"{'; '.join(counts) + '. ' if counts else ''}{units_and_gauge(da)}")


def length_scatter_figure(ds) -> Figure:
    m = np.asarray(first_objective(ds["margin"])[0].values, float).ravel()
    x = np.asarray(ds["length_log_ratio"].values, float).ravel()
    ok = np.isfinite(m) & np.isfinite(x)
    r = float(np.corrcoef(x[ok], m[ok])[0, 1]) if ok.sum() > 2 and x[ok].std() > 0 and m[ok].std() > 0 else np.nan
    c = Chart(span(x, include=[0]), span(m, include=[0]), "log(len chosen / len rejected)",
              f"margin Δ ({ds['margin'].attrs.get('units', 'reward')})")
    c.hline(0, "#999", dash=None)
    c.vline(0, "#999", dash=None)
    c.points(x, m, PALETTE[1], opacity=0.7)
    return Figure("Margin against length ratio", c.render(),
                  f"Length confound per pair: margin against the log length ratio of the two responses; "
                  f"Pearson r = {fmt(r)} over {int(ok.sum())} pairs (computed here). "
                  f"{units_and_gauge(ds['margin'])}{_nonfinite(np.r_[m, x])}")


def calibration_figure(ds) -> Figure:
    mp, fq, n = (np.asarray(ds[k].values, float) for k in ("reliability_mean_p", "reliability_freq", "reliability_n"))
    ok = n > 0
    c = Chart((0, 1), (0, 1), "predicted P(first wins) = σ(Δ)", "observed frequency", width=420, height=380)
    c.line([0, 1], [0, 1], "#888", dash="4 3", marker=False, label="perfect calibration")
    c.line(mp[ok], fq[ok], PALETTE[0], label="σ(Δ), both orders")
    for x, y, k in zip(mp[ok], fq[ok], n[ok]):
        c.text(x, y, str(int(k)), size=8, anchor="start")
    ece = float(ds["ece"].values)
    extra = ""
    if "accuracy" in ds:
        acc = np.asarray(ds["accuracy"].values, float)
        extra += f" Held-out accuracy {fmt(acc[0])} [{fmt(acc[1])}, {fmt(acc[2])}]."
    if "bt_loss" in ds:
        extra += f" Mean Bradley–Terry loss {fmt(np.asarray(ds['bt_loss'].values, float).ravel()[0])} nats."
    return Figure("Calibration (reliability curve)", c.render(),
                  f"Reliability of σ(Δ) on held-out pairs: mean predicted probability against observed frequency "
                  f"per bin (labels: pairs per bin; {int((~ok).sum())} empty bin(s) not drawn). ECE {fmt(ece)}."
                  f"{extra} {units_and_gauge(ds['reliability_freq'])}")


def scorecard_figure(ds, prov: dict) -> Figure:
    rd = ds["reading"].transpose("criterion", "strength")
    s = np.asarray(rd["strength"].values, float)
    vals = np.asarray(rd.values, float)
    crit = strs(rd["criterion"].values)
    floors = prov.get("floors") or {}
    c = Chart(span(s), span(vals, include=[f.get("floor") for f in floors.values() if f.get("floor") is not None]),
              "planted strength", "reading (mean over pairs)")
    lines = []
    rho = np.asarray(ds["spearman"].values, float) if "spearman" in ds else np.full(len(crit), np.nan)
    passed = np.asarray(ds["passed"].values) if "passed" in ds else [None] * len(crit)
    for i, cname in enumerate(crit):
        col = PALETTE[i % len(PALETTE)]
        c.line(s, vals[i], col, label=cname)
        fl = floors.get(cname, {})
        lines.append(f"{cname}: Spearman ρ {fmt(rho[i])}, floor {fl.get('what', '?')} "
                     f"(value {fmt(fl['value']) if fl.get('value') is not None else 'nan'}) → "
                     f"{'pass' if passed[i] else 'FAIL'}")
    return Figure("Scorecard calibration curves", c.render(),
                  f"Each criterion's reading against the planted strength on organism {prov.get('organism')} "
                  f"({prov.get('base')}); a criterion passes when ρ ≥ {prov.get('min_spearman')} and its floor "
                  f"holds. " + "; ".join(lines) + f". {units_and_gauge(ds['reading'])}{_nonfinite(vals)}")


def stat_vars(ds) -> list[str]:
    """Names of every ``*statistic × bound`` variable (confounder tables)."""
    out = []
    for name, var in ds.data_vars.items():
        rest = [d for d in var.dims if d not in ("objective", "bound")]
        if "bound" in var.dims and len(rest) == 1 and rest[0].endswith("statistic"):
            out.append(str(name))
    return sorted(out)


GENERIC_DIMS = ({"pair", "layer"}, {"pair", "component"}, {"pair", "layer", "component"}, {"layer"})
STANDARD = ("lens", "dla", "patch_effect")


def _layer_line(da, var: str, tag: str) -> Figure:
    """``pair × layer`` (mean ± 95% CI over pairs) or ``layer`` alone, as a line over layers."""
    layers = np.asarray(da["layer"].values, float)
    if "pair" in da.dims:
        vals = np.asarray(da.transpose("pair", "layer").values, float)
        m, lo, hi = mean_ci(vals)
        n = int(np.isfinite(vals).any(1).sum())
        what = f"mean ± 95% CI (1.96 s.e.) over {n} pair(s) with a finite value"
    else:
        vals = np.asarray(da.values, float)
        m = lo = hi = vals
        n, what = None, "one value per layer"
    c = Chart(span(layers), span(m, lo, hi, include=[0]), "layer (−1 = embedding)",
              f"{var} ({da.attrs.get('units', '')})",
              xticks=[(x, str(int(x))) for x in layers[:: max(1, len(layers) // 12)]])
    c.hline(0, "#999", dash=None)
    if n is not None:
        c.band(layers, lo, hi, PALETTE[0])
    c.line(layers, m, PALETTE[0], label=f"mean (n={n} pairs)" if n is not None else var)
    return Figure(f"{var}{tag}", c.render(), f"{var} by layer: {what}. {units_and_gauge(da)}{_nonfinite(vals)}")


def _component_bars(da, var: str, tag: str) -> Figure:
    """``pair × component``: one bar per component, mean ± 95% CI (1.96 s.e.) over pairs."""
    da = da.transpose("pair", "component")
    vals = np.asarray(da.values, float)
    comps = [str(x) for x in strs(da["component"].values)]
    m, lo, hi = mean_ci(vals)
    x = np.arange(len(comps), dtype=float)
    c = Chart((-0.6, len(comps) - 0.4), span(m, lo, hi, include=[0]), "component",
              f"{var} ({da.attrs.get('units', '')})", xticks=[(i, name) for i, name in enumerate(comps)])
    c.hline(0, "#999", dash=None)
    for i in range(len(comps)):
        if np.isfinite(m[i]):
            c.rect(x[i] - 0.3, x[i] + 0.3, min(0.0, m[i]), max(0.0, m[i]), PALETTE[i % len(PALETTE)],
                   title=f"{comps[i]}: {fmt(m[i])} [{fmt(lo[i])}, {fmt(hi[i])}]")
    c.errorbars(x, lo, hi, "#222")
    n = int(np.isfinite(vals).any(1).sum())
    return Figure(f"{var}{tag}", c.render(), f"{var} per component: mean ± 95% CI (1.96 s.e.) over {n} pair(s), "
                  + ", ".join(f"{k} {fmt(v)}" for k, v in zip(comps, m)) + f". {units_and_gauge(da)}{_nonfinite(vals)}")


def generic_figure(ds, var: str) -> Figure:
    """A variable drawn by its dims: ``pair × layer`` or ``layer`` as a line over layers, ``pair × component``
    as bars per component, ``pair × layer × component`` as the grid of its means over pairs."""
    da, tag = first_objective(ds[var])
    if "component" in da.dims and "layer" in da.dims:
        return _grid(ds, var, var)[0]
    if "component" in da.dims:
        return _component_bars(da, var, tag)
    return _layer_line(da, var, tag)


def plottable(ds) -> list[str]:
    """Numeric variables over pair × layer, layer, pair × component or pair × layer × component (any
    ``objective`` dim aside) that no standard figure draws."""
    out = []
    for name in sorted(map(str, ds.data_vars)):
        var = ds[name]
        dims = set(var.dims) - {"objective"}
        if (name not in STANDARD and dims in GENERIC_DIMS and len(dims) == len(var.dims) - ("objective" in var.dims)
                and np.issubdtype(var.dtype, np.number) and all(var.sizes[d] > 0 for d in dims)):
            out.append(name)
    return out


def run_figures(ds, prov: dict) -> list[Figure]:
    """Every standard figure ``ds`` (one observable's Dataset) supports, in a fixed order; then a generic
    figure for every other pair × layer / pair × component variable (``plottable``)."""
    figs = []
    for var, fn in (("lens", lens_figure), ("dla", dla_figure), ("patch_effect", patch_figure),
                    ("crystallization_fraction", crystallization_figure),
                    ("reliability_mean_p", calibration_figure)):
        if var in ds:
            figs.append(fn(ds))
    figs += [generic_figure(ds, n) for n in plottable(ds)]
    figs += [forest_figure(ds, n) for n in stat_vars(ds)]
    if "length_log_ratio" in ds and "margin" in ds and "pair" in ds["length_log_ratio"].dims:
        figs.append(length_scatter_figure(ds))
    if "reading" in ds and "strength" in ds["reading"].dims:
        figs.append(scorecard_figure(ds, prov))
    return figs
