"""Paired comparison of two models' accuracy on the same pairs (``compare ... paired=margin``).

A pair is *correct* for a model when its margin Δ = r_c − r_r is > 0 (an exact 0 is wrong: a tie
does not prefer the chosen side). Matched by pair id, every pair of two models a and b falls in
one cell of the 2 × 2 table

                  b correct   b wrong
    a correct     n11         n10        n10 = ``n_a_only``
    a wrong       n01         n00        n01 = ``n_b_only``

Per subset (the pairs' ``dimension`` coordinate; ``subset="all"`` pools every pair) and per cell
of the margin's other dims (``objective``, ``layer``), dims ``[cells ×] subset``:

  accuracy_a, accuracy_b   share of pairs each model gets right                      (fraction)
  accuracy_diff            accuracy_a − accuracy_b = (n10 − n01) / n                 (fraction)
  diff_ci_low, diff_ci_high  percentile paired bootstrap interval of accuracy_diff: the n pairs are
                           resampled with replacement, each keeping both models' outcomes (Efron
                           1979; Efron & Tibshirani 1993, ch. 13). Drawn as the resample's cell
                           counts, Multinomial(n; n10/n, n01/n, (n11 + n00)/n), which is the same
                           distribution as resampling pair indices.
  agreement                (n11 + n00) / n: both right or both wrong                 (fraction)
  p_mcnemar                McNemar's exact test, two-sided (McNemar 1947, Psychometrika 12:153):
                           under H0 a discordant pair is "a only" or "b only" with probability ½,
                           p = min(1, 2·P[X ≤ min(n10, n01)]), X ~ Binomial(n10 + n01, ½); 1 when no
                           pair is discordant
  p_holm, p_sidak          family-wise adjusted p: Holm's step-down (Holm 1979, Scand. J. Stat.
                           6:65) and Šidák's single step 1 − (1 − p)^m (Šidák 1967, JASA 62:626).
                           Family: the per-subset tests across every subset and every cell (e.g.
                           every layer); the ``all`` rows form a second family across cells. Rows
                           with no pair (p NaN) are left out of m.
  n_pairs, n_both_correct, n_a_only, n_b_only, n_both_wrong, n_missing    (count)
Per pair, dims ``pair [× cells]``: ``correct_a``, ``correct_b``, ``agree`` (1/0; NaN where a margin
is NaN). A pair whose margin is NaN in either run is left out of its row and counted in
``n_missing``.

The bootstrap draws from one ``numpy`` PCG64 generator seeded with ``seed``, consumed cell by cell,
the subsets in sorted order and then ``all``; the seed, n_boot and ci are stored in the attrs.
Raises ``SpecError`` when the runs hold different pair sets, a pair twice, different subset labels
for one pair, different coordinates along another dim, or a subset named ``all``.
"""
from __future__ import annotations

import numpy as np
import xarray as xr
from scipy.stats import binom

from ..errors import SpecError

ALL = "all"
COUNTS = ("n_pairs", "n_both_correct", "n_a_only", "n_b_only", "n_both_wrong", "n_missing")
ROW_VARS = ("accuracy_a", "accuracy_b", "accuracy_diff", "diff_ci_low", "diff_ci_high", "agreement", "p_mcnemar")


def mcnemar_exact(n_a_only: int, n_b_only: int) -> float:
    """Two-sided exact McNemar p from the discordant counts (see the module doc); 1.0 when both are 0."""
    n = int(n_a_only) + int(n_b_only)
    if n == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(int(n_a_only), int(n_b_only)), n, 0.5)))


def holm(p) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values of a family; NaN entries stay NaN and are not counted in m."""
    p = np.asarray(p, np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    q = p[ok]
    m = q.size
    order = np.argsort(q, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * q[order]))
    res = np.empty(m)
    res[order] = adj
    out[ok] = res
    return out


def sidak(p) -> np.ndarray:
    """Šidák (1967) single-step adjusted p-values 1 − (1 − p)^m; NaN entries stay NaN and are not counted in m."""
    p = np.asarray(p, np.float64)
    m = int(np.isfinite(p).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isfinite(p), -np.expm1(m * np.log1p(-np.minimum(p, 1.0))), np.nan)


def _matched(a: xr.DataArray, b: xr.DataArray, name: str, runs) -> tuple[xr.DataArray, xr.DataArray, np.ndarray]:
    """``(a, b, subset label per pair)``: b in a's pair order; refuses unmatched pair sets (module doc)."""
    for key, arr, rid in (("a", a, runs[0]), ("b", b, runs[1])):
        if "pair" not in arr.dims:
            raise SpecError(f"paired.{name}", f"'{name}' of run {rid} has no pair dim (dims {arr.dims}).",
                            fix="name a per-pair margin (e.g. paired=margin).")
        ids = [str(i) for i in arr["pair"].values]
        if len(set(ids)) != len(ids):
            raise SpecError(key, f"run {rid} holds a pair id twice in '{name}'.", fix="rerun it; pair ids are unique.")
    if sorted(a.dims) != sorted(b.dims):
        raise SpecError(f"paired.{name}", f"'{name}' has dims {a.dims} in run {runs[0]} but {b.dims} in run {runs[1]}.",
                        fix="compare runs whose heads have the same objectives (model.num_labels), or set paired=none.")
    ia, ib = {str(i) for i in a["pair"].values}, {str(i) for i in b["pair"].values}
    if ia != ib:
        only_a, only_b = sorted(ia - ib), sorted(ib - ia)
        raise SpecError("b", f"runs {runs[0]} and {runs[1]} hold different pairs in '{name}': {len(only_a)} only in "
                        f"a {only_a[:3]}, {len(only_b)} only in b {only_b[:3]}; a paired test needs every pair "
                        "scored by both models.", fix="run both models on one dataset config (the same dataset, "
                        "limit and dimensions).")
    b = b.transpose(*a.dims)
    b = b.isel(pair=[{str(i): k for k, i in enumerate(b["pair"].values)}[str(i)] for i in a["pair"].values])
    for d in (d for d in a.dims if d != "pair"):
        if d in a.coords and d in b.coords and sorted(map(str, a[d].values)) != sorted(map(str, b[d].values)):
            raise SpecError(f"paired.{name}", f"'{name}' has {d} {list(map(str, a[d].values))} in run {runs[0]} "
                            f"but {list(map(str, b[d].values))} in run {runs[1]}.",
                            fix=f"run both with the same {d} (one observable config), or set paired=none.")
        if d in a.coords and d in b.coords:
            b = b.sel({d: a[d].values})
    labels = [np.array([str(v) for v in x["dimension"].values], dtype=object) if "dimension" in x.coords else None
              for x in (a, b)]
    if labels[0] is not None and labels[1] is not None and (labels[0] != labels[1]).any():
        k = int(np.argmax(labels[0] != labels[1]))
        raise SpecError("b", f"pair {str(a['pair'].values[k])!r} is in subset {labels[0][k]!r} in run {runs[0]} "
                        f"but {labels[1][k]!r} in run {runs[1]}: the runs did not read the same data.",
                        fix="run both models on one dataset config.")
    subset = labels[0] if labels[0] is not None else labels[1]
    if subset is not None and ALL in set(subset.tolist()):
        raise SpecError("dataset.dimensions", f"a subset is named {ALL!r}, the name of the pooled row.",
                        fix="rename that subset in the data (dataset.fields.subset or the file).")
    return a, b, subset if subset is not None else np.full(a.sizes["pair"], ALL, dtype=object)


def _row(ca: np.ndarray, cb: np.ndarray, n_missing: int, rng, n_boot: int, ci: float) -> tuple[list, list]:
    """Counts and statistics of one row from 0/1 outcome vectors (finite pairs only)."""
    n = ca.size
    n11, n10 = int((ca & cb).sum()), int((ca & ~cb).sum())
    n01 = int((~ca & cb).sum())
    n00 = n - n11 - n10 - n01
    counts = [n, n11, n10, n01, n00, n_missing]
    if n == 0:
        return counts, [np.nan] * len(ROW_VARS)
    draws = rng.multinomial(n, [n10 / n, n01 / n, (n11 + n00) / n], size=n_boot) if n_boot else np.zeros((0, 3))
    diffs = (draws[:, 0] - draws[:, 1]) / n
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(diffs, [alpha, 1.0 - alpha]) if n_boot else (np.nan, np.nan)
    stats = [(n11 + n10) / n, (n11 + n01) / n, (n10 - n01) / n, float(lo), float(hi), (n11 + n00) / n,
             mcnemar_exact(n10, n01)]
    return counts, stats


def paired_accuracy(a: xr.DataArray, b: xr.DataArray, *, n_boot: int = 1000, seed: int = 0, ci: float = 0.95,
                    name: str = "margin", runs=("a", "b")) -> xr.Dataset:
    """McNemar test, paired bootstrap CI of the accuracy difference, Holm/Šidák; see the module doc.

    ``a``, ``b``: one variable (a margin in reward units, dims ``pair [× cells]``) of runs ``runs``.
    Returns the Dataset described there; attrs ``seed``, ``n_boot``, ``ci``, ``method``, ``family``.
    """
    a, b, subset = _matched(a, b, name, runs)
    rest = [d for d in a.dims if d != "pair"]
    va = np.asarray(a.transpose("pair", *rest).values, np.float64).reshape(a.sizes["pair"], -1)
    vb = np.asarray(b.transpose("pair", *rest).values, np.float64).reshape(a.sizes["pair"], -1)
    rows = sorted(set(subset.tolist()) - {ALL}) + [ALL]
    masks = [subset == s if s != ALL else np.ones(subset.size, bool) for s in rows]
    rng = np.random.Generator(np.random.PCG64(seed))
    counts = np.zeros((va.shape[1], len(rows), len(COUNTS)), np.int64)
    stats = np.zeros((va.shape[1], len(rows), len(ROW_VARS)))
    for c in range(va.shape[1]):
        ok = np.isfinite(va[:, c]) & np.isfinite(vb[:, c])
        for r, mask in enumerate(masks):
            sel = mask & ok
            counts[c, r], stats[c, r] = _row(va[sel, c] > 0, vb[sel, c] > 0, int((mask & ~ok).sum()), rng, n_boot, ci)
    p = stats[..., ROW_VARS.index("p_mcnemar")]
    sub_p, all_p = p[:, :-1], p[:, -1]
    p_holm = np.concatenate([holm(sub_p.ravel()).reshape(sub_p.shape), holm(all_p)[:, None]], 1)
    p_sidak = np.concatenate([sidak(sub_p.ravel()).reshape(sub_p.shape), sidak(all_p)[:, None]], 1)
    shape = [a.sizes[d] for d in rest]
    dims = (*rest, "subset")
    coords = {"subset": rows, **{d: a[d].values for d in rest if d in a.coords}}
    inv = {"gauge": "invariant"}

    def var(values, units, desc):
        return xr.DataArray(np.asarray(values).reshape(shape + [len(rows)]), dims=dims, coords=coords,
                            attrs={"units": units, "description": desc, **inv})

    units = {"p_mcnemar": "probability"}
    data = {v: var(stats[..., k], units.get(v, "fraction"), v) for k, v in enumerate(ROW_VARS)}
    data.update({v: var(counts[..., k], "count", v) for k, v in enumerate(COUNTS)})
    data["p_holm"] = var(p_holm, "probability", "McNemar p, Holm-adjusted across the family")
    data["p_sidak"] = var(p_sidak, "probability", "McNemar p, Sidak-adjusted across the family")
    pair_coords = {d: a[d] for d in a.coords if "pair" in a[d].dims}
    with np.errstate(invalid="ignore"):
        ok_a, ok_b = np.isfinite(a.values), np.isfinite(b.values)
        ca = np.where(ok_a, (a.values > 0).astype(float), np.nan)
        cb = np.where(ok_b, (b.values > 0).astype(float), np.nan)
        agree = np.where(ok_a & ok_b, (ca == cb).astype(float), np.nan)
    for v, vals in (("correct_a", ca), ("correct_b", cb), ("agree", agree)):
        data[v] = xr.DataArray(vals, dims=a.dims, coords={**pair_coords, **{d: a[d] for d in rest if d in a.coords}},
                               attrs={"units": "indicator", **inv})
    m_sub, m_all = int(np.isfinite(sub_p).sum()), int(np.isfinite(all_p).sum())
    return xr.Dataset(data, attrs={
        "variable": name, "runs": list(runs), "seed": int(seed), "n_boot": int(n_boot), "ci": float(ci),
        "correct": "margin > 0 (an exact 0 is wrong)",
        "method": "McNemar exact (binomial on the discordant pairs, two-sided); percentile paired bootstrap of "
                  "the accuracy difference, pairs resampled within each row; Holm and Sidak adjustment",
        "family": f"subset rows: {m_sub} tests (every subset x every cell); all rows: {m_all} (every cell)",
        "rng": "numpy PCG64(seed), consumed cell by cell, subsets sorted then 'all'"})
