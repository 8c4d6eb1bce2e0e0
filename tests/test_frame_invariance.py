"""Whitened-frame cosines are invariant under any invertible change of residual basis wherever the
covariance is invertible (``shrinkage=auto`` with n > d and a full-rank covariance; issue 26, item 9)."""
from __future__ import annotations

import numpy as np
import pytest

from reward_lens_spec.frames.covariance import shrunk_spectrum
from reward_lens_spec.frames.fit import fit_whitened


def _cosines(frame, W):
    u = frame.direction_to_frame(W, "m")
    u = u / np.linalg.norm(u, axis=-1, keepdims=True)
    return u @ u.T


@pytest.mark.parametrize("cond", [1e2, 1e5, 1e8, 1e10])
def test_whitened_cosines_are_basis_invariant(cond):
    rng = np.random.default_rng(int(np.log10(cond)))
    n, d = 400, 24
    X = rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) + rng.standard_normal(d)
    W = rng.standard_normal((5, d))                                  # readout covectors (r = w·x)
    U, _ = np.linalg.qr(rng.standard_normal((d, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    s = np.logspace(0, -np.log10(cond), d)
    A = U @ np.diag(s) @ V.T                                         # activations x → x A
    A_invT = U @ np.diag(1.0 / s) @ V.T                              # covectors w → w A^{-T}
    f0, f1 = fit_whitened(X, "m"), fit_whitened(X @ A, "m")
    assert f0.provenance["invariance"] == f1.provenance["invariance"] == "exact"
    assert shrunk_spectrum(X @ A).rho == 0.0
    np.testing.assert_allclose(_cosines(f1, W @ A_invT), _cosines(f0, W), atol=1e-6)


def test_rank_deficient_covariance_is_shrunk_and_labelled_approximate():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 23)) @ rng.standard_normal((23, 24))   # rank 23 < d = 24
    f = fit_whitened(X, "m")
    assert f.provenance["invariance"] == "approximate"
    assert shrunk_spectrum(X).rho > 0
