"""Held-out reports of reward margins, and model-free baselines (numpy and scipy, no model).

Conventions: a margin ``Δ = r_c − r_r`` (reward units) is *correct* when ``Δ > 0``; a tie
(``Δ == 0`` exactly, e.g. chosen == rejected) counts one half. Baselines score a pair from a
feature ``f`` (chosen minus rejected) the same way: ``f > 0`` correct, ``f == 0`` one half.

- ``correct``, ``bootstrap_ci`` (cluster bootstrap), ``n_eff``, ``accuracy``, ``spearman``: the shared
  statistics of ``reward_lens_spec.stats``, used here as there.
- ``bt_loss``: mean ``softplus(−Δ)`` in nats (Bradley & Terry 1952).
- ``reliability``: 10 equal-width bins of ``p = σ(Δ)``. Every pair enters twice, as
  ``(p, 1)`` and ``(1 − p, 0)`` (both presentation orders), so the table is defined although
  the label is always "chosen wins"; ECE = Σ_b (n_b / N)·|mean p_b − freq_b| (Naeini et al.
  2015; Guo et al. 2017).
- ``length_log_ratio``: ``log((1 + len_c) / (1 + len_r))``, lengths in characters.
- ``binned_accuracy``: accuracy of the margin and of the feature baseline inside bins of the
  length log-ratio; the bin ``|ratio| ≤ 0.1`` is the length-matched one.

Every summary carries ``n`` (pairs) and ``n_eff`` (distinct prompt clusters, the effective
sample size). Errors: ``ValueError`` for arrays of different lengths.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.special import expit, log_expit

from ..stats import accuracy, bootstrap_ci, correct, mean_with_ci, n_eff, spearman  # noqa: F401  (fit's reports, and ``fit.evaluate``'s names as before)

LENGTH_EDGES = (-math.inf, -0.5, -0.1, 0.1, 0.5, math.inf)


def bt_loss(margin) -> float:
    """Mean Bradley–Terry loss ``softplus(−Δ)`` in nats."""
    return float(np.mean(-log_expit(np.asarray(margin, np.float64))))


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
