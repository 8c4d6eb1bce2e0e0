"""leace_certificate: can a fresh linear probe still read the concept after LEACE erasure? AUC with a CI.

Input: readout-token activations with ``pair``, ``side``, ``d_model`` (and ``layer``, picked by ``layer``),
e.g. ``{op: capture, site: resid_post}``. The eraser is fitted exactly as ``leace`` fits it (same
``concept``, ``tokens``, ``fit_fraction``, ``seed``: same split, same closed form; ``ops._leace``). The
held-out pairs are split again by a seeded hash (salt ``probe``, half each); a fresh L2-regularized
logistic-regression probe (``l2``; one-vs-rest for more than two classes, macro-averaged) is trained on
one half and scored on the other, on the raw activations (``before``) and on the erased ones
(``after``). Output: ``stage`` (before, after) × ``bound`` (estimate, ci_low, ci_high), the test AUC
(fraction; 0.5 = chance), the interval by bootstrap over test pairs (both sides of a pair resampled
together; the probe held fixed; ``ci``, ``resamples``); coords ``n_train``, ``n_test`` (pairs). A
certificate holds when ``after``'s interval contains 0.5 while ``before``'s lies above it.
Source: probing as the test of linear erasure (Ravfogel et al. 2020, INLP; Belrose et al. 2023, §6).
Gauge: invariant. Errors: ``SpecError`` for an input without those dims, a ``layer`` the input lacks, or
the leace errors (``ops.leace``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from ._leace import FIELDS, erase, in_split, probe_auc, macro_auc
from .base import INVARIANT, Operator, labelled
from .leace import check_readout_input, readout_eraser
from ..stats import bootstrap_ci


@dataclass(frozen=True)
class LeaceCertificateParams:
    layer: Optional[int] = None
    concept: str = "dimension"
    tokens: tuple = ()
    fit_fraction: float = 0.5
    seed: int = 0
    l2: float = 1.0
    ci: float = 0.95
    resamples: int = 1000


@OPERATORS.register
class LeaceCertificate(Operator):
    """A fresh linear probe's held-out AUC for the concept before and after LEACE erasure (stage × bound)."""

    name = "leace_certificate"
    dims = "x (pair × side × [layer ×] d_model) → stage × bound"
    Params = LeaceCertificateParams
    pair_fields = FIELDS

    def out_dims(self, in_dims, info, where):
        check_readout_input(self.p, in_dims[0], info, where)
        if set(in_dims[0]) - {"pair", "side", "layer", "d_model"}:
            raise SpecError(where + ".input", f"needs pair × side × [layer ×] d_model, got {in_dims[0]}.",
                            fix="select or reduce the other dims first, leaving pair × side × [layer ×] d_model.")
        if not 0 < self.p.ci < 1 or not (isinstance(self.p.resamples, int) and self.p.resamples >= 2):
            raise SpecError(where + ".ci", "ci must be in (0, 1) and resamples an integer >= 2.",
                            fix="e.g. ci: 0.95 and resamples: 1000 in the step.")
        return ("stage", "bound")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x):
        p = self.p
        X, ids, fit, y, mu, E = readout_eraser(ctx, p, x)
        held = np.flatnonzero(~fit)
        tr = held[in_split([ids[i] for i in held], f"probe:{p.seed}", 0.5)]
        te = np.setdiff1d(held, tr)
        rows = lambda idx, A: A[idx].reshape(-1, A.shape[-1])  # noqa: E731
        ytr, yte = y[tr].ravel(), y[te].ravel()
        data = np.full((2, 3), np.nan)
        for s, A in enumerate((X, erase(X, mu, E))):
            est, scores = probe_auc(rows(tr, A), ytr, rows(te, A), yte, p.l2)
            if np.isfinite(est):
                cols = np.unique(ytr)[1:] if np.unique(ytr).size == 2 else np.unique(ytr)
                lo, hi = bootstrap_ci(lambda idx: macro_auc(scores[idx], yte[idx], cols), len(yte),
                                      groups=np.repeat(np.arange(te.size), 2), n_boot=p.resamples, seed=p.seed,
                                      level=p.ci)
                data[s] = (est, lo, hi)
        arr = xr.DataArray(data, dims=("stage", "bound"),
                           coords={"stage": ["before", "after"], "bound": ["estimate", "ci_low", "ci_high"],
                                   "n_train": int(tr.size), "n_test": int(te.size)})
        out = labelled(arr, "fraction", INVARIANT, f"held-out AUC of a fresh linear probe for '{p.concept}' "
                                                   f"before / after LEACE erasure (0.5 = chance)")
        out.attrs.update(concept=p.concept, n_fit=int(fit.sum()), ci=p.ci, resamples=p.resamples,
                         method="L2 logistic probe (scipy L-BFGS); bootstrap over test pairs, percentile interval")
        return out
