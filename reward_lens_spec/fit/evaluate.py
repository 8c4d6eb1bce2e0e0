"""Held-out statistics of reward margins, and model-free baselines (numpy only, no model).

Conventions: a margin ``Δ = r_c − r_r`` (reward units) is *correct* when ``Δ > 0``; a tie
(``Δ == 0`` exactly, e.g. chosen == rejected) counts one half. Baselines score a pair from a
feature ``f`` (chosen minus rejected) the same way: ``f > 0`` correct, ``f == 0`` one half.

- ``bootstrap_ci``: percentile bootstrap (Efron & Tibshirani 1993, ch. 13). With ``groups``
  (prompt cluster keys) whole clusters are resampled — the cluster bootstrap (Field & Welsh
  2007, "Bootstrapping clustered data", JRSS-B 69:369) — because pairs sharing a prompt are
  not independent. Seeded (NumPy PCG64).
- ``bt_loss``: mean ``softplus(−Δ)`` in nats (Bradley & Terry 1952).
- ``reliability``: 10 equal-width bins of ``p = σ(Δ)``. Every pair enters twice, as
  ``(p, 1)`` and ``(1 − p, 0)`` (both presentation orders), so the table is defined although
  the label is always "chosen wins"; ECE = Σ_b (n_b / N)·|mean p_b − freq_b| (Naeini et al.
  2015; Guo et al. 2017).
- ``length_log_ratio``: ``log((1 + len_c) / (1 + len_r))``, lengths in characters.
- ``binned_accuracy``: accuracy of the margin and of the feature baseline inside bins of the
  length log-ratio; the bin ``|ratio| ≤ 0.1`` is the length-matched one.
- ``spearman``: Spearman's ρ (scipy) with a cluster-bootstrap CI.

Every summary carries ``n`` (pairs) and ``n_eff`` (distinct prompt clusters, the effective
sample size). Errors: ``ValueError`` for arrays of different lengths.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy.special import expit, log_expit
from scipy.stats import rankdata

LENGTH_EDGES = (-math.inf, -0.5, -0.1, 0.1, 0.5, math.inf)


def correct(x) -> np.ndarray:
    """Per-pair score of a margin or feature: 1 if > 0, 0.5 if == 0, 0 if < 0 (NaN stays NaN)."""
    x = np.asarray(x, np.float64)
    out = np.where(x > 0, 1.0, np.where(x == 0, 0.5, 0.0))
    return np.where(np.isnan(x), np.nan, out)


def bt_loss(margin) -> float:
    """Mean Bradley–Terry loss ``softplus(−Δ)`` in nats."""
    return float(np.mean(-log_expit(np.asarray(margin, np.float64))))


def _cluster_index(groups, n):
    if groups is None:
        return [np.array([i]) for i in range(n)]
    groups = np.asarray(groups)
    if len(groups) != n:
        raise ValueError(f"groups has {len(groups)} entries for {n} values.")
    _, inv = np.unique(groups, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    cuts = np.flatnonzero(np.diff(inv[order])) + 1
    return np.split(order, cuts)


def bootstrap_ci(stat: Callable[[np.ndarray], float], n: int, *, groups=None, n_boot: int = 1000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of ``stat(idx)`` (``idx``: resampled row indices) over ``n`` rows.

    Returns ``(nan, nan)`` when ``n == 0`` or fewer than 2 replicates are finite.
    """
    if n == 0:
        return (math.nan, math.nan)
    clusters = _cluster_index(groups, n)
    row_cluster = np.empty(n, np.int64)
    for k, c in enumerate(clusters):
        row_cluster[c] = k
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    rows = np.arange(n)
    for b in range(n_boot):
        weight = np.bincount(rng.integers(0, len(clusters), len(clusters)), minlength=len(clusters))
        reps[b] = stat(np.repeat(rows, weight[row_cluster]))
    reps = reps[np.isfinite(reps)]
    if reps.size < 2:
        return (math.nan, math.nan)
    a = (1.0 - level) / 2
    return (float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a)))


def n_eff(groups, n: int) -> int:
    """Effective sample size: distinct prompt clusters (``n`` when no groups are given)."""
    return n if groups is None else int(len(set(np.asarray(groups).tolist())))


def mean_with_ci(values, *, groups=None, n_boot: int = 1000, seed: int = 0) -> dict:
    """``{estimate, ci_low, ci_high, n, n_eff}`` of the mean of ``values`` (NaN rows dropped)."""
    v = np.asarray(values, np.float64)
    keep = np.isfinite(v)
    v = v[keep]
    g = None if groups is None else np.asarray(groups)[keep]
    lo, hi = (math.nan, math.nan)
    if len(v):
        # vectorised cluster bootstrap of a mean: resample clusters, ratio of summed sums to summed counts
        clusters = _cluster_index(g, len(v))
        sums = np.array([v[c].sum() for c in clusters])
        counts = np.array([len(c) for c in clusters], np.float64)
        pick = np.random.default_rng(seed).integers(0, len(clusters), (n_boot, len(clusters)))
        reps = sums[pick].sum(1) / counts[pick].sum(1)
        lo, hi = (float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975)))
    return {"estimate": float(v.mean()) if len(v) else math.nan, "ci_low": lo, "ci_high": hi,
            "n": int(len(v)), "n_eff": n_eff(g, len(v))}


def accuracy(margin, *, groups=None, n_boot: int = 1000, seed: int = 0) -> dict:
    """Pairwise accuracy (ties one half) with a cluster-bootstrap 95% CI."""
    return mean_with_ci(correct(margin), groups=groups, n_boot=n_boot, seed=seed)


def _rho(x, y) -> float:
    """Spearman ρ = Pearson correlation of average ranks (same value as ``scipy.stats.spearmanr``)."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


def spearman(x, y, *, groups=None, n_boot: int = 1000, seed: int = 0) -> dict:
    """Spearman ρ of ``x`` and ``y`` (rows with a NaN dropped) with a cluster-bootstrap CI."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} values, y has {len(y)}.")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    g = None if groups is None else np.asarray(groups)[keep]
    lo, hi = bootstrap_ci(lambda idx: _rho(x[idx], y[idx]), len(x), groups=g, n_boot=n_boot, seed=seed)
    return {"estimate": _rho(x, y), "ci_low": lo, "ci_high": hi, "n": int(len(x)), "n_eff": n_eff(g, len(x))}


def reliability(margin, n_bins: int = 10) -> tuple[list[dict], float]:
    """Reliability table of ``σ(Δ)`` (both orders; see module doc) and the ECE.

    Table rows: ``{bin_low, bin_high, n, mean_p, freq}`` (``mean_p``/``freq`` NaN when empty).
    """
    p = expit(np.asarray(margin, np.float64))
    probs = np.concatenate([p, 1.0 - p])
    outcome = np.concatenate([np.ones_like(p), np.zeros_like(p)])
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    which = np.clip(np.searchsorted(edges, probs, side="right") - 1, 0, n_bins - 1)
    rows, ece = [], 0.0
    for b in range(n_bins):
        m = which == b
        k = int(m.sum())
        mp = float(probs[m].mean()) if k else math.nan
        fq = float(outcome[m].mean()) if k else math.nan
        rows.append({"bin_low": float(edges[b]), "bin_high": float(edges[b + 1]), "n": k, "mean_p": mp, "freq": fq})
        if k:
            ece += k / len(probs) * abs(mp - fq)
    return rows, float(ece)


def length_log_ratio(len_chosen, len_rejected) -> np.ndarray:
    """``log((1 + len_c) / (1 + len_r))`` per pair (lengths in characters)."""
    return np.log1p(np.asarray(len_chosen, np.float64)) - np.log1p(np.asarray(len_rejected, np.float64))


def binned_accuracy(margin, feature, binning, *, edges: Sequence[float] = LENGTH_EDGES, groups=None,
                    n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """Per bin of ``binning``: ``{bin, low, high, n, n_eff, model {..}, baseline {..}}``.

    ``model``: accuracy of ``margin`` in the bin; ``baseline``: accuracy of ``feature > 0``.
    """
    margin, feature, binning = (np.asarray(a, np.float64) for a in (margin, feature, binning))
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (binning > lo) & (binning <= hi) if lo != -math.inf else binning <= hi
        g = None if groups is None else np.asarray(groups)[m]
        label = "matched" if (lo, hi) == (-0.1, 0.1) else f"({lo:g}, {hi:g}]"
        out.append({"bin": label, "low": float(lo), "high": float(hi), "n": int(m.sum()),
                    "n_eff": n_eff(g, int(m.sum())),
                    "model": accuracy(margin[m], groups=g, n_boot=n_boot, seed=seed),
                    "baseline": accuracy(feature[m], groups=g, n_boot=n_boot, seed=seed)})
    return out


def length_report(margin, len_chosen, len_rejected, *, groups=None, n_boot: int = 1000, seed: int = 0) -> dict:
    """Length confound: ρ(margin, length log-ratio), "longer wins" accuracy, length-matched bins."""
    ratio = length_log_ratio(len_chosen, len_rejected)
    return {"spearman_margin_vs_length": spearman(margin, ratio, groups=groups, n_boot=n_boot, seed=seed),
            "longer_wins_accuracy": accuracy(ratio, groups=groups, n_boot=n_boot, seed=seed),
            "bins": binned_accuracy(margin, ratio, ratio, groups=groups, n_boot=n_boot, seed=seed)}


def margin_report(margin, *, groups=None, n_boot: int = 1000, seed: int = 0) -> dict:
    """Accuracy with CI, mean BT loss (nats) with CI, reliability table (10 bins) and ECE."""
    margin = np.asarray(margin, np.float64)
    table, ece = reliability(margin)
    return {"accuracy": accuracy(margin, groups=groups, n_boot=n_boot, seed=seed),
            "bt_loss": mean_with_ci(-log_expit(margin), groups=groups, n_boot=n_boot, seed=seed),
            "ties": int((margin == 0).sum()), "reliability": table, "ece": ece}
