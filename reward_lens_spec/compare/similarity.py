"""Representation similarity of two activation matrices on the SAME inputs (row i = input i of each).

``linear_cka(X, Y)``: linear centred kernel alignment, ``‖Ycᵀ Xc‖²_F / (‖Xcᵀ Xc‖_F ‖Ycᵀ Yc‖_F)`` with
Xc, Yc the column-centred matrices (Kornblith, Norouzi, Lee & Hinton 2019, "Similarity of neural
network representations revisited", ICML). 1 for identical activations; invariant to orthogonal
transforms and isotropic scaling of either side; in [0, 1].

``procrustes_residual(X, Y)``: the orthogonal Procrustes residual ``‖X̃ R − Ỹ‖_F`` with X̃, Ỹ centred and
scaled to unit Frobenius norm and R the orthogonal matrix minimising it (Schönemann 1966, Psychometrika
31:1–10; ``scipy.linalg.orthogonal_procrustes``). 0 for a rotated (and scaled, shifted) copy; in [0, 2].

Both dimensionless (units ``fraction``), gauge-invariant: a basis change of either model moves neither.
Errors: ``SpecError`` for mismatched shapes, non-finite values or a constant matrix.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from ..errors import SpecError


def _centred(X, Y) -> tuple[np.ndarray, np.ndarray]:
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0] or X.shape[0] < 2:
        raise SpecError("activations", f"need two matrices with the same rows (inputs), at least 2; got shapes "
                        f"{X.shape} and {Y.shape}.", fix="capture both on the same pairs.")
    if not (np.isfinite(X).all() and np.isfinite(Y).all()):
        raise SpecError("activations", "non-finite activations.", fix="check the runs' stored activations.")
    X, Y = X - X.mean(0), Y - Y.mean(0)
    if not (np.linalg.norm(X) > 0 and np.linalg.norm(Y) > 0):
        raise SpecError("activations", "an activation matrix is constant across inputs: similarity undefined.",
                        fix="capture on inputs that differ (more pairs, or another layer).")
    return X, Y


def linear_cka(X, Y) -> float:
    """Linear CKA of ``X`` (n × d1) and ``Y`` (n × d2); see the module doc."""
    X, Y = _centred(X, Y)
    return float(np.linalg.norm(Y.T @ X) ** 2 / (np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y)))


def procrustes_residual(X, Y) -> float:
    """Orthogonal Procrustes residual of ``X`` onto ``Y`` (both n × d); see the module doc."""
    X, Y = _centred(X, Y)
    if X.shape[1] != Y.shape[1]:
        raise SpecError("activations", f"Procrustes needs one width, got d={X.shape[1]} and d={Y.shape[1]}.",
                        fix="use linear_cka for models of different widths.")
    X, Y = X / np.linalg.norm(X), Y / np.linalg.norm(Y)
    R, _ = scipy.linalg.orthogonal_procrustes(X, Y)
    return float(np.linalg.norm(X @ R - Y))
