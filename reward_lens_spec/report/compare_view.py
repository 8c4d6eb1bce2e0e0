"""Side-by-side view of a stored ``compare`` run: margin scatter, direction cosines, refusals.

For each compared invariant variable (a ``statistic`` Dataset): the two runs' values per pair
(read lazily from the two source runs, aligned on pair ids) as a scatter, captioned with the
stored Pearson r and Spearman ρ, their bootstrap CIs and the permutation p against shuffled
pairings (the null). For each compared direction: the cosine beside its random-direction null
quantiles. For each paired accuracy test (``compare.paired``): the accuracy difference per subset
with its paired bootstrap CI, captioned with McNemar's exact p and its Holm and Šidák adjustments,
the counts, the family and the seed. For each frame-dependent variable both runs hold but the comparison does not: the
refusal the gauge gate gives (``compare.runs.check_frame``), which names the fix.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import RewardLensError
from ..frames.gate import gauge_of, is_frame_dependent
from .figures import Figure, units_and_gauge
from .svg import PALETTE, Chart, fmt, span
from ..compare.runs import check_frame


@dataclass(frozen=True)
class Refusal:
    """A comparison the gauge gate refuses: the variable and the gate's one-line message (with its fix)."""

    variable: str
    message: str


def _source_vars(store, run_id: str) -> dict[str, xr.DataArray]:
    """Every variable of a source run, lazily (first observable holding each name)."""
    out: dict[str, xr.DataArray] = {}
    for ds in store.load(run_id, lazy=True).values():
        for v in ds.data_vars:
            out.setdefault(str(v), ds[v])
    return out


def _first_cell(da: xr.DataArray, keep: str) -> tuple[xr.DataArray, str]:
    rest = [d for d in da.dims if d != keep]
    if not rest:
        return da, ""
    sel = {d: 0 for d in rest}
    label = ", ".join(f"{d}={da[d].values[0]}" if d in da.coords else f"{d}=0" for d in rest)
    return da.isel(sel), f" [{label}]"


def margin_figure(name: str, res: xr.Dataset, a: xr.DataArray, b: xr.DataArray, runs, models) -> Figure:
    a, tag = _first_cell(a, "pair")
    b, _ = _first_cell(b, "pair")
    a, b = xr.align(a.reset_coords(drop=True), b.reset_coords(drop=True), join="inner")
    x, y = np.asarray(a.values, float), np.asarray(b.values, float)
    ok = np.isfinite(x) & np.isfinite(y)
    c = Chart(span(x, include=[0]), span(y, include=[0]), f"{name}, {models[0]} ({a.attrs.get('units', '')})",
              f"{name}, {models[1]}")
    c.hline(0, "#bbb", dash=None)
    c.vline(0, "#bbb", dash=None)
    c.points(x, y, PALETTE[0], opacity=0.7)
    cell = res
    for d in [d for d in res["estimate"].dims if d != "statistic"]:
        cell = cell.isel({d: 0})
    stats = []
    for s in cell["statistic"].values:
        r = cell.sel(statistic=s)
        stats.append(f"{s} {fmt(r['estimate'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}], "
                     f"p_perm {fmt(r['p_perm'])}")
    att = res.attrs
    return Figure(f"{name}: {runs[0]} vs {runs[1]}{tag}", c.render(),
                  f"{name} per pair, run a (x) against run b (y), {int(ok.sum())} shared pairs drawn. Stored "
                  f"comparison: {'; '.join(stats)} (CI: percentile bootstrap, n_boot {att.get('n_boot', '?')}; "
                  f"null: shuffled pairings, n_perm {att.get('n_perm', '?')}). {units_and_gauge(a)}")


def direction_figure(name: str, res: xr.Dataset) -> Figure:
    cell = res
    for d in [d for d in res["cosine"].dims]:
        cell = cell.isel({d: 0})
    cos = float(cell["cosine"].values)
    q = cell["null_abs_cosine"]
    c = Chart((0, 1), (0, 1), "|cosine|", "", height=150, yticks=[])
    for i, (qq, v) in enumerate(zip(q["quantile"].values, np.asarray(q.values, float))):
        c.vline(v, PALETTE[1 + i], label=f"null q{float(qq):.2f} = {fmt(v)}")
    c.points([abs(cos)], [0.5], PALETTE[0], r=5, label=f"observed |cos| = {fmt(abs(cos))}")
    return Figure(f"{name}: direction cosine", c.render(),
                  f"Cosine of the two directions in their shared frame: {fmt(cos)}, p = {fmt(cell['p_value'])} "
                  f"against {res.attrs.get('n_null', '?')} random directions ({res.attrs.get('null', '')}). "
                  f"{units_and_gauge(res['cosine'])}")


def paired_figure(name: str, res: xr.Dataset) -> Figure:
    """Accuracy difference (run a − run b) per subset with its CI; the first cell of any other dims."""
    cell, tag = res, []
    for d in [d for d in res["p_mcnemar"].dims if d != "subset"]:
        tag.append(f"{d}={cell[d].values[0]}" if d in cell.coords else f"{d}=0")
        cell = cell.isel({d: 0})
    subsets = [str(x) for x in cell["subset"].values]
    x = np.arange(len(subsets), dtype=float)
    diff, lo, hi = (np.asarray(cell[v].values, float) for v in ("accuracy_diff", "diff_ci_low", "diff_ci_high"))
    c = Chart((-0.5, len(subsets) - 0.5), span(diff, lo, hi, include=[0]), "subset",
              "accuracy a − accuracy b", xticks=[(float(i), s) for i, s in enumerate(subsets)])
    c.hline(0, "#bbb", dash=None)
    c.errorbars(x, lo, hi, PALETTE[0])
    c.points(x, diff, PALETTE[0], r=4)
    rows = [f"{s}: {fmt(cell['accuracy_diff'].sel(subset=s))} [{fmt(cell['diff_ci_low'].sel(subset=s))}, "
            f"{fmt(cell['diff_ci_high'].sel(subset=s))}], McNemar p {fmt(cell['p_mcnemar'].sel(subset=s))}, Holm "
            f"{fmt(cell['p_holm'].sel(subset=s))}, Sidak {fmt(cell['p_sidak'].sel(subset=s))}, n "
            f"{int(cell['n_pairs'].sel(subset=s))} (a only {int(cell['n_a_only'].sel(subset=s))}, b only "
            f"{int(cell['n_b_only'].sel(subset=s))})" for s in subsets]
    att = res.attrs
    where = f" [{', '.join(tag)}]" if tag else ""
    return Figure(f"{name}: paired accuracy{where}", c.render(),
                  f"Accuracy ({att.get('correct', 'margin > 0')}) of run a minus run b per subset, with the "
                  f"{att.get('ci', '?')} percentile paired bootstrap CI (n_boot {att.get('n_boot', '?')}, seed "
                  f"{att.get('seed', '?')}). {'; '.join(rows)}. McNemar exact test on the discordant pairs; "
                  f"adjusted across the family ({att.get('family', '?')}). {units_and_gauge(res['accuracy_diff'])}")


def refusals(store, prov: dict, compared: set[str], va: dict, vb: dict) -> list[Refusal]:
    """The gate's refusal for every frame-dependent variable both runs hold and the comparison lacks."""
    pa, pb = (store.provenance(r) for r in prov["runs"])
    out = []
    for name in sorted(set(va) & set(vb) - compared):
        a, b = va[name], vb[name]
        if not (is_frame_dependent(gauge_of(a)) or is_frame_dependent(gauge_of(b))):
            continue
        try:
            gauge = check_frame(name, a, b, pa, pb, store.url, None)
        except RewardLensError as exc:
            out.append(Refusal(name, str(exc)))
        else:
            out.append(Refusal(name, f"allowed in {gauge}, but not in this comparison's vars; "
                                     f"fix: reward-lens-spec compare ... vars={name}"))
    return out


def compare_view(store, prov: dict, datasets: dict) -> tuple[list[Figure], list[Refusal], list[str]]:
    """(figures, refusals, notes) of one stored comparison; notes say what could not be drawn."""
    runs = [str(r) for r in prov.get("runs", [])]
    models = [str(m) for m in prov.get("models", ["a", "b"])]
    notes = [f"{k}: {v}" for k, v in (prov.get("skipped") or {}).items()]
    try:
        va, vb = _source_vars(store, runs[0]), _source_vars(store, runs[1])
    except (RewardLensError, IndexError) as exc:
        return [], [], notes + [f"source runs not readable, so nothing is drawn: {exc}"]
    figs = []
    for name, res in sorted(datasets.items()):
        res = res.to_dataset()                       # one comparison's statistics share their coords: no padding
        if "p_mcnemar" in res:
            figs.append(paired_figure(name, res))
        elif "estimate" in res and name in va and name in vb:
            figs.append(margin_figure(name, res, va[name], vb[name], runs, models))
        elif "cosine" in res:
            figs.append(direction_figure(name, res))
    return figs, refusals(store, prov, set(datasets), va, vb), notes
