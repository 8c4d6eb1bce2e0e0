"""Calibration criteria of ``sae_attribution`` on the ``sparse_feature`` organism (``organisms.sae_organism``).

The organism plants its margin in one atom u_0 of the readout activations; its truth holds every pair's readout
activation per side (plain forward, a hook on the final norm) and the head row ``w`` and bias ``b``. A run
trains (or loads) its own dictionary; ``trust.scorecard.evaluate`` hands the criteria that dictionary, looked
up by the digest each output names (``attrs["sae"]``) and re-hashed, and the declared ``mode`` of each patch
step from the plan. From those and the truth the criteria rebuild every cell, written out here (TopK of
ReLU(W_encᵀ(h − b_dec) + b_enc), the head applied to the patched activation) — none of the operator or
intervention code:

==================  =============================  ===================================  ===========================
criterion           needs                          reading per strength                 floor at full strength
==================  =============================  ===================================  ===========================
sae_contribution    sae_contribution               mean over pairs of Σ_feature         every (pair, feature) cell:
                                                   contribution (reward units)          1 − max err / RMS ≥ 0.999
sae_error           sae_contribution, sae_error    mean over pairs of Σ contribution    every pair's error term and
                                                   + error (= the margin)               Σ + error against the plain
                                                                                        margin w·(h_c − h_r): the
                                                                                        worse fit ≥ 0.999
sae_patch           sae_patch                      mean over the patched pairs of       every (patched pair,
                                                   Σ_feature effect, signed so it        feature) cell ≥ 0.999; the
                                                   rises with the margin (``zero``:     unpatched pairs NaN
                                                   negated)
==================  =============================  ===================================  ===========================

Patch truth at the readout, per feature i with Δf_i = f_i(h_c) − f_i(h_r): ``transplant``: the rejected side's
reward change w·(Δf_i d_i) (r_r,patched − r_r); ``zero``: (w·(−f_i(h_c) d_i)) − (w·(−f_i(h_r) d_i)) = −Δf_i (w·d_i)
(Δ_zeroed − Δ). A patch at ``resid_post`` has no closed form here: the criterion records why it cannot read
it (a failing card). A reading 5% off, one feature late, or a patch of the wrong sign fails its floor.
"""
from __future__ import annotations

import numpy as np

def _dictionary(ds, var):
    """The run's SAE named by ``ds[var].attrs['sae']`` (its digest re-checked) and the step's params."""
    info = ds.attrs.get("sae") or {}
    digest = ds[var].attrs.get("sae")
    sae = (info.get("dictionaries") or {}).get(digest)
    if sae is None:
        raise ValueError(f"{var} names SAE {digest!r}, which the run did not train or load")
    if sae.digest() != digest:
        raise ValueError(f"the SAE named by {var} hashes to {sae.digest()}, not {digest}")
    params = (info.get("steps") or {}).get(var) or {}
    if params.get("site", "readout") != "readout":
        raise ValueError(f"{var} is read at {params.get('site')}: no plain-forward truth off the readout")
    return sae, params


def _encode(sae, h) -> np.ndarray:
    """TopK SAE code of each row, written out (Gao et al. 2024): keep the k largest of ReLU(W_encᵀ(h − b_dec) + b_enc)."""
    W_enc, b_enc, b_dec = (np.asarray(a, np.float64) for a in (sae.W_enc, sae.b_enc, sae.b_dec))
    out = np.zeros((len(h), W_enc.shape[1]))
    for r, x in enumerate(np.asarray(h, np.float64)):
        z = np.maximum(W_enc.T @ (x - b_dec) + b_enc, 0.0)
        keep = np.argsort(-z, kind="stable")[:sae.k]
        out[r, keep] = z[keep]
    return out


def _truth_rows(ds, var, t):
    """(pair ids, h: pair × side × d, f: pair × side × feature, w·d_i: feature, sae, params)."""
    sae, params = _dictionary(ds, var)
    pids = [str(p) for p in ds[var].pair.values]
    h = np.asarray([t["readout"][p] for p in pids], np.float64)
    f = _encode(sae, h.reshape(-1, h.shape[-1])).reshape(h.shape[0], 2, -1)
    wd = np.asarray(sae.W_dec, np.float64) @ np.asarray(t["w"], np.float64)
    return pids, h, f, wd, sae, params


def _grid(ds, var, n_feat) -> np.ndarray:
    da = ds[var]
    if set(da.dims) != {"pair", "feature"}:
        raise ValueError(f"{var} has dims {da.dims}, not (pair, feature)")
    vals = np.asarray(da.transpose("pair", "feature").values, np.float64)
    if vals.shape[1] != n_feat:
        raise ValueError(f"{var} has {vals.shape[1]} features; its SAE has {n_feat}")
    return vals


def _fit(got, want) -> float:
    g, w = np.ravel(got), np.ravel(want)
    if g.size == 0:
        raise ValueError("no cell to compare")
    return 1.0 - float(np.max(np.abs(g - w)) / max(np.sqrt(np.mean(w ** 2)), 1e-12))


def contribution_truth(ds, t, var="sae_contribution") -> np.ndarray:
    _, _, f, wd, _, _ = _truth_rows(ds, var, t)
    return (f[:, 0] - f[:, 1]) * wd


def error_truth(ds, t, var="sae_error") -> np.ndarray:
    _, h, f, _, sae, _ = _truth_rows(ds, var, t)
    recon = f @ np.asarray(sae.W_dec, np.float64) + np.asarray(sae.b_dec, np.float64)
    e = h - recon
    return (e[:, 0] - e[:, 1]) @ np.asarray(t["w"], np.float64)


def patch_truth(ds, t, var="sae_patch") -> np.ndarray:
    """Per pair and feature: the head applied to the patched activation minus the unpatched (module doc)."""
    _, h, f, _, sae, params = _truth_rows(ds, var, t)
    D, w, b = np.asarray(sae.W_dec, np.float64), np.asarray(t["w"], np.float64), float(t["b"])
    r = lambda x: x @ w + b      # noqa: E731  the classifier's linear head on the readout activation
    out = np.zeros(f.shape[::2])
    for i in range(D.shape[0]):
        if params.get("mode", "transplant") == "transplant":
            out[:, i] = r(h[:, 1] + (f[:, 0, i] - f[:, 1, i])[:, None] * D[i]) - r(h[:, 1])
        else:
            zc, zr = r(h[:, 0] - f[:, 0, i, None] * D[i]), r(h[:, 1] - f[:, 1, i, None] * D[i])
            out[:, i] = (zc - zr) - (r(h[:, 0]) - r(h[:, 1]))
    return out


def _contribution_fit(ds, t) -> float:
    want = contribution_truth(ds, t)
    return _fit(_grid(ds, "sae_contribution", want.shape[1]), want)


def _error_values(ds) -> np.ndarray:
    da = ds["sae_error"]
    if set(da.dims) != {"pair"}:
        raise ValueError(f"sae_error has dims {da.dims}, not (pair,)")
    return np.asarray(da.values, np.float64)


def _error_fit(ds, t) -> float:
    err = _error_values(ds)
    contrib = _grid(ds, "sae_contribution", contribution_truth(ds, t).shape[1])
    h = np.asarray([t["readout"][str(p)] for p in ds["sae_error"].pair.values], np.float64)
    margin = (h[:, 0] - h[:, 1]) @ np.asarray(t["w"], np.float64)
    return min(_fit(err, error_truth(ds, t)), _fit(contrib.sum(1) + err, margin))


def _patched_rows(ds, t):
    """(reading, truth) on the pairs the patch covers (its finite rows, which must be the first ones)."""
    want = patch_truth(ds, t)
    got = _grid(ds, "sae_patch", want.shape[1])
    rows = np.isfinite(got).all(1)
    n = int(rows.sum())
    if n == 0 or not rows[:n].all() or np.isfinite(got[n:]).any():
        raise ValueError(f"sae_patch covers pairs {np.flatnonzero(rows).tolist()}: not the first pairs, every "
                         "feature")
    return got[:n], want[:n]


def _patch_reading(ds, t) -> float:
    got, _ = _patched_rows(ds, t)
    sign = -1.0 if ((ds.attrs.get("sae") or {}).get("steps") or {}).get("sae_patch", {}).get("mode") == "zero" else 1.0
    return sign * float(np.mean(got.sum(1)))


def sae_criteria(Criterion) -> tuple:
    """This module's criteria as ``trust.criteria.Criterion`` rows (the class passed in: no import cycle)."""
    return (
        Criterion("sae_contribution", ("sae_contribution",),
                  lambda ds, t: float(np.mean(_grid(ds, "sae_contribution", contribution_truth(ds, t).shape[1])
                                              .sum(1))), _contribution_fit,
                  "every (pair, feature) contribution equals (f_i(h_c) − f_i(h_r))·(w·d_i) rebuilt from the plain "
                  "forward's readout and the run's dictionary (1 − max err / RMS ≥ 0.999)", None, needs_unit=False,
                  kinds=("sparse_feature",), floor=0.999),
        Criterion("sae_error", ("sae_contribution", "sae_error"),
                  lambda ds, t: float(np.mean(np.asarray(ds["sae_contribution"].sum("feature").values, np.float64)
                                              + _error_values(ds))), _error_fit,
                  "every pair's error term equals w·(e_c − e_r) rebuilt, and Σ contribution + error equals the "
                  "plain forward's margin (worse fit ≥ 0.999)", None, needs_unit=False, kinds=("sparse_feature",), floor=0.999),
        Criterion("sae_patch", ("sae_patch",), _patch_reading, lambda ds, t: _fit(*_patched_rows(ds, t)),
                  "every patched (pair, feature) effect equals the head applied to the patched readout activation "
                  "minus the unpatched, for the declared mode, sign included (1 − max err / RMS ≥ 0.999)", None,
                  needs_unit=False, kinds=("sparse_feature",), floor=0.999),
    )
