"""LEACE cells recomputed (``trust.cell_truth``): every held-out displacement by the oblique-projection eraser, and
the certificate's before / after probe AUCs (L2 logistic regression by Newton's method, Mann–Whitney AUC)."""
from __future__ import annotations

import hashlib
import re

import numpy as np

from .common import encoded, hooked_forward, obs_step, finite_rows

SPLIT_SEED, FIT_FRACTION, PROBE_L2 = 0, 0.5, 1.0     # the leace / leace_certificate defaults organisms grade


def _split(ids, salt: str, fraction: float) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.sha256(f"{salt}:{i}".encode()).digest(), "big") < fraction * 2 ** 256
                     for i in ids])


def _oblique_eraser(X, Z):
    """(mu, E) with r(x) = x − E (x − mu): LEACE written as an oblique projection (module table)."""
    mu = X.mean(0)
    Xc, Zc = X - mu, Z - Z.mean(0)
    sxx, sxz = Xc.T @ Xc / len(X), Xc.T @ Zc / len(X)
    sinv = np.linalg.pinv(sxx, rcond=1e-10, hermitian=True)
    return mu, sxz @ np.linalg.pinv(sxz.T @ sinv @ sxz, rcond=1e-10) @ sxz.T @ sinv


def _leace_layer(ds, var) -> int:
    m = re.search(r"resid_post\[(\d+)\]", str(ds[var].attrs.get("description", "")))
    if m is None:
        raise ValueError(f"{var}: only resid_post erasure is recomputed (its description names no resid_post[layer])")
    return int(m.group(1))


def _concept_data(org, layer, field):
    enc = encoded(org)
    X = np.asarray([[hooked_forward(org.lm.model, s, keep=[(layer, "resid")])[1][(layer, "resid")]
                     for s in (enc.chosen[i], enc.rejected[i])] for i in range(len(enc.pair_ids))])
    by_id = {p.id: p for p in org.pairs}
    y = np.asarray([str(by_id[i].meta_dict()[field]) for i in enc.pair_ids])
    return enc, X, y


def _erased(X, y, fit):
    classes = np.unique(y[fit])
    Z = (np.repeat(y[fit], 2)[:, None] == classes[None, :]).astype(np.float64)
    mu, E = _oblique_eraser(X[fit].reshape(-1, X.shape[-1]), Z)
    return X - (X - mu) @ E.T


def leace_displacement_cells(ds, org, obs):
    """Every held-out pair's ``displacement`` (planted concept) and ``unplanted_displacement`` beside the
    recomputation's mean over sides of ‖r(x) − x‖ / ‖x‖."""
    out = {}
    for var in ("displacement", "unplanted_displacement"):
        field = str(ds[var].attrs.get("concept", "")).removeprefix("field:")
        enc, X, y = _concept_data(org, _leace_layer(ds, var), field)
        fit_ = _split(enc.pair_ids, str(SPLIT_SEED), FIT_FRACTION)
        if int(ds[var].attrs.get("n_fit", -1)) != int(fit_.sum()):
            raise ValueError(f"{var}: fitted on {ds[var].attrs.get('n_fit')} pairs, the declared split has "
                             f"{int(fit_.sum())}")
        moved = np.linalg.norm(_erased(X, y, fit_) - X, axis=-1) / np.linalg.norm(X, axis=-1)
        rows, vals = finite_rows(ds, var, enc)
        if sorted(rows) != [i for i in range(len(enc.pair_ids)) if not fit_[i]][:len(rows)] or not rows:
            raise ValueError(f"{var}: read on pairs that are not the held-out split")
        out[var] = ([vals.ravel()], [moved[rows].mean(1)])
    return out


def _newton_logistic(X, t, l2):
    """L2 logistic regression (weights penalized, intercept not) on standardized X by Newton's method."""
    m, sd = X.mean(0), X.std(0) + 1e-12
    A = np.hstack([(X - m) / sd, np.ones((len(X), 1))])
    w = np.zeros(A.shape[1])
    pen = np.r_[np.full(A.shape[1] - 1, l2), 0.0]
    for _ in range(100):
        p = 1 / (1 + np.exp(-(A @ w)))
        g = A.T @ (p - t) + pen * w
        H = (A * (p * (1 - p))[:, None]).T @ A + np.diag(pen)
        step = np.linalg.solve(H, g)
        w -= step
        if np.max(np.abs(step)) < 1e-12:
            break
    return lambda Xn: np.hstack([(Xn - m) / sd, np.ones((len(Xn), 1))]) @ w


def _auc(score, pos):
    from scipy.stats import mannwhitneyu
    return float(mannwhitneyu(score[pos], score[~pos]).statistic / (pos.sum() * (~pos).sum()))


def leace_certificate_cells(ds, org, obs):
    """The ``certificate``'s before / after AUC estimates beside the recomputation's (binary concept)."""
    cert = ds["certificate"]
    field = str(cert.attrs.get("concept", "")).removeprefix("field:")
    st = obs_step(obs, "certificate")
    enc, X, y = _concept_data(org, int(st["layer"]), field)
    ids = [str(i) for i in enc.pair_ids]
    fit_ = _split(ids, str(SPLIT_SEED), FIT_FRACTION)
    held = np.flatnonzero(~fit_)
    tr = held[_split([ids[i] for i in held], f"probe:{SPLIT_SEED}", 0.5)]
    te = np.setdiff1d(held, tr)
    if (int(cert["n_train"]), int(cert["n_test"])) != (tr.size, te.size):
        raise ValueError(f"certificate: probe split {int(cert['n_train'])}/{int(cert['n_test'])} pairs, the "
                         f"declared split {tr.size}/{te.size}")
    classes = np.unique(y[tr])
    if classes.size != 2:
        raise ValueError("certificate: only a binary concept is recomputed")
    want = []
    for A in (X, _erased(X, y, fit_)):
        score = _newton_logistic(A[tr].reshape(-1, A.shape[-1]), np.repeat(y[tr] == classes[1], 2).astype(float),
                                 PROBE_L2)(A[te].reshape(-1, A.shape[-1]))
        want.append(_auc(score, np.repeat(y[te] == classes[1], 2)))
    got = np.asarray(cert.sel(stage=["before", "after"], bound="estimate").values, np.float64)
    return {"certificate": ([got], [np.asarray(want)])}
