"""Calibration criteria of ``drift`` (``compare.drift``) on the training organism (``models.training_organism``).

The organism's planted step is known (``PLANTED_STEP``: the trigger feature carries its true label from there);
its truth here is rebuilt per checkpoint from the checkpoints themselves — each one loaded by transformers from
its folder, every pair side a plain forward (batch of one, the organism's template, a hook on the final norm):
the margin per pair and the readout activation h per side (``truth_series``). From those the series ``drift``
stores are written out anew (naive linear CKA in its HSIC form, Kornblith et al. 2019; the Procrustes residual
from the singular values of XᵀY, Schönemann 1966; scipy's Spearman ρ) and compared cell by cell with what the
drift run stored:

================  =========================================  ============================================
criterion         reads (every checkpoint, both references)  floor
================  =========================================  ============================================
drift_margin      mean_margin, accuracy                      1 − max err / RMS ≥ 0.999 against the plain
                                                             forwards' per-checkpoint mean margin and accuracy
drift_similarity  cka, procrustes_residual, margin_spearman  the worst of the three fits ≥ 0.999 (NaN where
                                                             the truth is NaN, e.g. checkpoint 0 vs previous)
drift_step        mean_margin                                the interval where the stored mean margin jumps
                                                             most (from the stored values, not the
                                                             ``largest_change`` attr) is the planted one (the
                                                             last checkpoint at or before the planted step →
                                                             the next): 1, else 0
================  =========================================  ============================================

These criteria have no strength axis (one organism, one planted step): a drift card's ``strengths`` are the
checkpoint steps and its readings are per checkpoint; ``trust.evidence.card_verdict`` does not ask them for a
Spearman trend (``UNDOSED``). A series moved one checkpoint locates the wrong interval and misses the truth's
cells; a series 5% off misses its cells.

Why the step is read off the mean margin alone: on the organism's held-out pairs (``eval_pairs(20)``) over all
11 checkpoints (measured 2026-12-04) the mean margin jumps 2.36 → 13.18 in 100 → 120, but CKA (0.441 vs 0.445)
and the Procrustes residual (0.866 vs 0.851) change slightly more in 40 → 60, and margin ρ most in 0 → 20
(−0.849); on checkpoints 60–140 all four put it in 100 → 120 (``tests/test_drift.py``). The similarities are
graded for their values (``drift_similarity``), not for where they move.
"""
from __future__ import annotations

import numpy as np

UNDOSED = ("drift_margin", "drift_similarity", "drift_step")     # no strength axis: no Spearman trend
SIMILARITY = ("cka", "procrustes_residual", "margin_spearman")


def naive_cka(X, Y) -> float:
    """Linear CKA, HSIC form with the centring matrix H (Kornblith et al. 2019), written out."""
    n = X.shape[0]
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = X @ X.T, Y @ Y.T
    hsic = lambda A, B: float(np.trace(A @ H @ B @ H))      # noqa: E731
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def naive_procrustes(X, Y) -> float:
    """min over orthogonal R of ‖X̂R − Ŷ‖_F, X̂, Ŷ centred and of unit Frobenius norm: √(2 − 2·Σ σ(X̂ᵀŶ))."""
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    Xc, Yc = Xc / np.linalg.norm(Xc), Yc / np.linalg.norm(Yc)
    return float(np.sqrt(max(2.0 - 2.0 * np.linalg.svd(Xc.T @ Yc, compute_uv=False).sum(), 0.0)))


def truth_series(margins: list, hs: list) -> dict:
    """The drift series from per-checkpoint plain-forward margins (pairs) and readout rows (2·pairs × d)."""
    from scipy.stats import spearmanr
    K = len(margins)
    out = {"mean_margin": np.array([np.mean(m) for m in margins]),
           "accuracy": np.array([np.mean((m > 0) + 0.5 * (m == 0)) for m in margins])}
    for name in SIMILARITY:
        out[name] = np.full((K, 2), np.nan)                   # reference: previous, last
    for i in range(K):
        for r, (a, b) in enumerate(((i - 1, i), (i, K - 1))):     # vs previous, vs last
            if a < 0 or a == b:
                continue
            out["cka"][i, r] = naive_cka(hs[a], hs[b])
            out["procrustes_residual"][i, r] = naive_procrustes(hs[a], hs[b])
            out["margin_spearman"][i, r] = float(spearmanr(margins[a], margins[b]).statistic)
    return out


def located(series: np.ndarray, how: str) -> int | None:
    """Index k of the checkpoint ending the interval k−1 → k where ``series`` changed most (None: no finite)."""
    v = np.abs(np.diff(series)) if how == "jump" else np.asarray(series, np.float64)[1:, 0]
    if not np.isfinite(v).any():
        return None
    return int(np.nanargmax(v) if how in ("jump", "high") else np.nanargmin(v)) + 1


def planted_index(steps, planted_step: int) -> int:
    """Index of the first checkpoint after the planted step (the interval ending there holds it)."""
    after = [k for k, s in enumerate(steps) if s > planted_step]
    if not after or after[0] == 0:
        raise ValueError(f"the checkpoints {list(steps)} do not bracket the planted step {planted_step}")
    return after[0]


def _stored(ds, name) -> np.ndarray:
    da = ds[name]
    if "reference" in da.dims:
        da = da.transpose("checkpoint", "reference").sel(reference=["previous", "last"])
    elif da.dims != ("checkpoint",):
        raise ValueError(f"{name} has dims {da.dims}")
    v = np.asarray(da.values, np.float64)
    if v.shape[0] != len(ds["checkpoint"]) or v.size == 0:
        raise ValueError(f"{name} holds {v.shape[0]} checkpoints")
    return v


def _fit(got, want) -> float:
    g, w = np.ravel(got), np.ravel(want)
    if g.shape != w.shape:
        raise ValueError(f"{g.size} cells read where the truth has {w.size}")
    keep = np.isfinite(w)
    if np.any(np.isfinite(g) != keep):
        raise ValueError("the reading is NaN where the truth is not, or the other way round")
    if not keep.any():
        raise ValueError("no cell to compare")
    return 1.0 - float(np.max(np.abs(g[keep] - w[keep])) / max(np.sqrt(np.mean(w[keep] ** 2)), 1e-12))


def margin_fit(ds, t) -> float:
    return min(_fit(_stored(ds, n), t["series"][n]) for n in ("mean_margin", "accuracy"))


def similarity_fit(ds, t) -> float:
    return min(_fit(_stored(ds, n), t["series"][n]) for n in SIMILARITY)


def step_located(ds, t) -> float:
    """1 when the stored mean margin's largest jump ends at the first checkpoint after the planted step."""
    return float(located(_stored(ds, "mean_margin"), "jump") == planted_index(t["steps"], t["planted_step"]))


def step_jumps(ds, t) -> np.ndarray:
    """Per checkpoint: |mean margin − the previous checkpoint's| (0 at the first), reward units."""
    return np.concatenate([[0.0], np.abs(np.diff(_stored(ds, "mean_margin")))])


def drift_criteria(Criterion) -> tuple:
    """This module's criteria as ``trust.criteria.Criterion`` rows (graded by ``trust.drift_card`` only)."""
    return (
        Criterion("drift_margin", ("mean_margin", "accuracy"), lambda ds, t: _stored(ds, "mean_margin"), margin_fit,
                  "every checkpoint's mean margin and accuracy equal the plain forwards' (1 − max err / RMS ≥ 0.999)",
                  None, needs_unit=False, kinds=("training",), floor=0.999),
        Criterion("drift_similarity", SIMILARITY, lambda ds, t: _stored(ds, "cka")[:, 0], similarity_fit,
                  "every checkpoint's CKA, Procrustes residual and margin ρ (vs previous and last) equal the naive "
                  "formulas on the plain forwards' activations and margins (worst 1 − max err / RMS ≥ 0.999)", None,
                  needs_unit=False, kinds=("training",), floor=0.999),
        Criterion("drift_step", ("mean_margin",), step_jumps, step_located,
                  "the stored mean margin's largest jump between consecutive checkpoints is the planted interval "
                  "(1 = located)", None, needs_unit=False, kinds=("training",), floor=1.0),
    )
