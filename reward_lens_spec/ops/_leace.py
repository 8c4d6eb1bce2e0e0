"""Shared by ``leace`` and ``leace_certificate``: concept labels, the seeded split, the LEACE closed form,
and a fresh linear probe's AUC (no operator here).

LEACE (Belrose et al. 2023, "LEACE: Perfect linear concept erasure in closed form", Thm. 4.3): with
Σ_XX the covariance of X (n × d), Σ_XZ its cross-covariance with the one-hot concept Z, W = (Σ_XX^{1/2})⁺
and P the orthogonal projector onto the column space of W·Σ_XZ, the eraser
    r(x) = x − W⁺ P W (x − μ)
makes Cov(r(X), Z) = 0 on the fit data (so no linear predictor of Z beats a constant, in least squares)
while moving x as little as possible in the mean-squared Mahalanobis sense. float64 throughout.

Concepts (``concept``): ``dimension`` (the pair's dimension), ``field:concept`` | ``field:subset`` |
``field:label`` (a per-pair field, declared in ``Operator.pair_fields`` so it is in the run identity),
``length`` (per side: the side's token count above the fit split's median) or ``tokens`` (per side: the
side's response contains any string of ``tokens``). Pair-level concepts give both sides one label.
Split: a pair is in the fit split when sha256(f"{seed}:{pair id}") falls below ``fit_fraction`` (per
pair, so independent of order and chunking); the held-out pairs are split again (salt ``probe``) into
the probe's train and test halves.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..errors import SpecError
from scipy.optimize import minimize
from scipy.stats import rankdata

FIELDS = ("concept", "subset", "label")
CONCEPTS = ("dimension", "length", "tokens") + tuple(f"field:{f}" for f in FIELDS)


def check_concept(concept: str, tokens, where: str) -> None:
    if concept not in CONCEPTS:
        raise SpecError(where + ".concept", f"unknown concept source '{concept}'.", value=concept, options=CONCEPTS,
                        fix="a per-pair field must be one of concept | subset | label (so it is in the run "
                            "identity); put your label under one of those keys.")
    if concept == "tokens" and (not tokens or not all(isinstance(t, str) and t for t in tokens)):
        raise SpecError(where + ".tokens", "concept: tokens needs a non-empty list of non-empty strings.",
                        fix="e.g. tokens: [' yes', ' no'] in the step.")


def in_split(pair_ids, salt: str, fraction: float) -> np.ndarray:
    """(pair,) bool: sha256(salt:id) / 2²⁵⁶ < fraction."""
    return np.array([int(hashlib.sha256(f"{salt}:{i}".encode()).hexdigest(), 16) / 2.0 ** 256 < fraction
                     for i in pair_ids])


def labels(ctx, concept: str, tokens, fit: np.ndarray) -> np.ndarray:
    """(pair, side) string labels of the concept for every encoded pair."""
    enc = ctx.encoded
    by_id = {p.id: p for p in ctx.pairs}
    pairs = [by_id[i] for i in enc.pair_ids]
    n = len(pairs)
    if concept == "dimension":
        v = np.array([p.dimension for p in pairs], dtype=str)
        return np.stack([v, v], 1)
    if concept.startswith("field:"):
        key = concept.split(":", 1)[1]
        raw = [p.meta_dict().get(key) for p in pairs]
        missing = [p.id for p, r in zip(pairs, raw) if r is None]
        if missing:
            raise SpecError("observable.steps.concept", f"{len(missing)} pair(s) have no field '{key}' "
                            f"(first: {missing[0]!r}).", fix=f"give every pair a '{key}' key.")
        v = np.array([str(r) for r in raw], dtype=str)
        return np.stack([v, v], 1)
    if concept == "length":
        ln = np.array([[len(enc.chosen[i]), len(enc.rejected[i])] for i in range(n)], np.float64)
        med = np.median(ln[fit]) if fit.any() else np.median(ln)
        return np.where(ln > med, "long", "short")
    has = lambda s: any(t in s for t in tokens)  # noqa: E731
    return np.array([[str(has(p.chosen)), str(has(p.rejected))] for p in pairs], dtype=str)


def one_hot(y: np.ndarray) -> np.ndarray:
    classes = np.unique(y)
    return (y[:, None] == classes[None, :]).astype(np.float64)


def fit_leace(X: np.ndarray, Z: np.ndarray, tol: float = 1e-10):
    """``(mu, E)``: the eraser is r(x) = x − (x − mu) @ E.T, E = W⁺ P W (d × d). See the module docstring."""
    X = np.asarray(X, np.float64)
    mu = X.mean(0)
    Xc, Zc = X - mu, Z - Z.mean(0)
    n = X.shape[0]
    sxx, sxz = Xc.T @ Xc / n, Xc.T @ Zc / n
    lam, V = np.linalg.eigh(sxx)
    keep = lam > tol * max(lam.max(), 1e-300)
    s = np.sqrt(np.where(keep, lam, 0.0))
    W = (V * np.where(keep, 1 / np.where(keep, s, 1), 0.0)) @ V.T          # (Σ^{1/2})⁺
    W_pinv = (V * s) @ V.T                                                 # Σ^{1/2}
    U, sv, _ = np.linalg.svd(W @ sxz, full_matrices=False)
    U = U[:, sv > tol * max(sv.max() if sv.size else 0.0, 1e-300)]
    return mu, W_pinv @ (U @ U.T) @ W


def erase(X: np.ndarray, mu: np.ndarray, E: np.ndarray) -> np.ndarray:
    return X - (X - mu) @ E.T


def _logistic(X: np.ndarray, y: np.ndarray, l2: float):
    """L2-regularized logistic regression (L-BFGS, scipy), on standardized features; returns a scorer."""
    m, sd = X.mean(0), X.std(0) + 1e-12
    Xs = (X - m) / sd
    A = np.hstack([Xs, np.ones((len(Xs), 1))])
    t = 2.0 * y - 1.0

    def f(w):
        z = t * (A @ w)
        loss = np.logaddexp(0, -z).sum() + 0.5 * l2 * (w[:-1] @ w[:-1])
        g = A.T @ (-t / (1 + np.exp(z))) + l2 * np.r_[w[:-1], 0.0]
        return loss, g
    w = minimize(f, np.zeros(A.shape[1]), jac=True, method="L-BFGS-B").x
    return lambda Xn: np.hstack([(Xn - m) / sd, np.ones((len(Xn), 1))]) @ w


def auc(score: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney U / n₊n₋, ties ½); NaN with one class only."""
    pos, neg = y == 1, y == 0
    if not pos.any() or not neg.any():
        return float("nan")
    r = rankdata(score)
    return float((r[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * neg.sum()))


def probe_auc(X_tr, y_tr, X_te, y_te, l2: float = 1.0) -> tuple[float, np.ndarray]:
    """A fresh probe (one-vs-rest for > 2 classes: the macro mean AUC) fit on train, scored on test:
    ``(auc, per-row test scores (row, class))`` for bootstrapping; the classes are the train set's."""
    classes = np.unique(y_tr)
    if classes.size < 2:
        return float("nan"), np.zeros((len(X_te), 0))
    cols = classes[1:] if classes.size == 2 else classes
    scores = np.stack([_logistic(X_tr, (y_tr == c).astype(float), l2)(X_te) for c in cols], 1)
    return macro_auc(scores, y_te, cols), scores


def macro_auc(scores: np.ndarray, y: np.ndarray, cols) -> float:
    vals = [auc(scores[:, j], (y == c).astype(float)) for j, c in enumerate(cols)]
    vals = [v for v in vals if np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")
