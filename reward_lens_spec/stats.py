"""Statistics shared by the operators, the fit reports, the trust scorecard and the report (numpy; scipy's
rank functions imported on first use).

- ``correct``: per-pair score of a margin or feature — 1 if > 0, ½ if == 0 (a tie), 0 if < 0; NaN stays NaN.
- ``bootstrap_ci``: percentile bootstrap (Efron & Tibshirani 1993, ch. 13). With ``groups`` (prompt cluster
  keys) whole clusters are resampled — the cluster bootstrap (Field & Welsh 2007, "Bootstrapping clustered
  data", JRSS-B 69:369) — because pairs sharing a prompt are not independent. Seeded (NumPy PCG64).
- ``n_eff``: distinct prompt clusters, the effective sample size.
- ``mean_with_ci`` / ``accuracy``: a mean (an accuracy, ties one half) with its cluster-bootstrap 95% CI.
- ``spearman``: Spearman's ρ (average ranks, Spearman 1904) with a cluster-bootstrap CI; ``spearman_rho``:
  the bare ρ through ``scipy.stats.spearmanr`` (NaN when a side is constant or not finite).
- ``mean_ci``: mean ± 1.96 standard errors along an axis, NaN ignored (normal approximation).

Every summary dict carries ``n`` (rows) and ``n_eff``. Errors: ``ValueError`` for arrays of different lengths.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np
from scipy.stats import rankdata
from scipy.stats import spearmanr


def correct(x) -> np.ndarray:
    """Per-pair score of a margin or feature: 1 if > 0, 0.5 if == 0, 0 if < 0 (NaN stays NaN)."""
    x = np.asarray(x, np.float64)
    out = np.where(x > 0, 1.0, np.where(x == 0, 0.5, 0.0))
    return np.where(np.isnan(x), np.nan, out)


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


def spearman_rho(x, y) -> float:
    """Spearman ρ with average ranks for ties (Spearman 1904); NaN if a side is constant or not finite."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")

    return float(spearmanr(x, y).statistic)


def mean_ci(a: np.ndarray, axis=0):
    """(mean, low, high) over ``axis`` ignoring NaN: mean ± 1.96 s.e. (s.e. = s / √n, s with ddof 1)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)        # an all-NaN column stays NaN
        n = np.isfinite(a).sum(axis)
        m = np.nanmean(a, axis)
        s = np.nanstd(a, axis, ddof=1) if a.shape[axis] > 1 else np.zeros_like(m)
    half = 1.96 * np.where(n > 1, s / np.sqrt(np.maximum(n, 1)), 0.0)
    return m, m - half, m + half
