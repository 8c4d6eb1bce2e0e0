"""Shrinkage covariance of activations, kept in spectral form (no d × d matrix when n < d).

``shrunk_spectrum(acts, shrinkage)`` returns the eigen-decomposition of

    Σ̂ = (1 − ρ) S + ρ μ I,      S = X_cᵀ X_c / n,   μ = tr(S) / d

as ``Spectrum(mean (d,), basis (d × r, orthonormal columns), eigval (r,), iso, rho, ...)``:
``Σ̂ = iso · I + basis · diag(eigval − iso) · basisᵀ`` with ``iso = ρ μ`` the eigenvalue of
Σ̂ on the complement of the data span. Units: activation² (whatever the activations are).

Shrinkage intensity ρ:
  auto         (default) ρ = 0 when n > d and S is non-singular in float64, else Ledoit–Wolf.
               "Non-singular" is a rank test, not a conditioning threshold (a conditioning threshold
               itself changes under a change of basis): the centred data X_c have full column rank,
               σ_min > σ_max · max(n, d) · eps_float64 for X_c's singular values (numpy's
               ``matrix_rank`` tolerance). When the Gram eigenvalues are too spread to resolve σ_min
               (σ_min² < 1e-10 σ_max²) the singular values come from an SVD of X_c itself instead of
               X_cᵀ X_c, which would square the condition number. With ρ = 0, Σ̂ = S transforms as
               Aᵀ S A under any invertible re-parameterisation x → xA of the residual basis, so
               whitened and shared-frame cosines are exactly invariant under GL(d); shrinkage towards
               μI is only orthogonally equivariant, so where an inverse forces it (n ≤ d or a
               near-singular S) the invariance is approximate (``Spectrum.exact_invariance``).
  ledoit_wolf  Ledoit & Wolf (2004), "A well-conditioned estimator for large-dimensional
               covariance matrices", J. Multivariate Anal. 88(2):365–411, Lemma 3.2–3.4 /
               Theorem 3.2: ρ = min(b̄², δ²) / δ² with δ² = ‖S − μI‖², b̄² = n⁻² Σ_k ‖x_k x_kᵀ − S‖²
               (‖A‖² = tr(AAᵀ)/d). Equals ``sklearn.covariance.LedoitWolf`` to 1e-12 (checked against 1.9.1).
  oas          Chen, Wiesel, Eldar & Hero (2010), "Shrinkage algorithms for MMSE covariance
               estimation", IEEE Trans. Signal Process. 58(10):5016–5029, eq. (23) as printed
               (``sklearn.covariance.OAS`` drops the two 2/p terms; the two differ by O(1/p)).
  none         ρ = 0 (plain MLE covariance; needs n > d and a full-rank S to whiten).
  a number     a fixed ρ in [0, 1].

Every quantity above is a trace or Frobenius norm, so it is computed from whichever of the
Gram matrix ``X_c X_cᵀ`` (n × n) or ``X_cᵀ X_c`` (d × d) is smaller; the spectrum comes from
that matrix's ``scipy.linalg.eigh`` (the thin SVD of X_c), with LAPACK's divide-and-conquer
``evd`` driver (2.3 s against 3.4 s for the default ``evr`` on a 2000 × 2000 Gram matrix here);
each basis column's sign is fixed (largest entry positive) so that the same fit hashes alike.
Raises ``SpecError`` for a bad shrinkage name or value, fewer than 2 activations, non-finite
activations, or a singular Σ̂.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import SpecError
from ..spec_checks import check_shrinkage
import scipy.linalg

GRAM_SVD_BELOW = 1e-10      # Gram eigenvalue ratio below which the spectrum is recomputed by SVD of X_c


@dataclass(frozen=True)
class Spectrum:
    mean: np.ndarray      # (d,)
    basis: np.ndarray     # (d, r) orthonormal columns spanning the centred data
    eigval: np.ndarray    # (r,) eigenvalues of the shrunk covariance on ``basis`` (descending)
    iso: float            # eigenvalue of the shrunk covariance on the complement of ``basis``
    rho: float            # shrinkage intensity in [0, 1]
    mu: float             # tr(S) / d
    n: int
    d: int
    timing: dict = field(default_factory=dict)   # seconds per stage: gram, eigh, basis

    @property
    def exact_invariance(self) -> bool:
        """True when Σ̂ = S of full rank: frame cosines invariant under every invertible basis change."""
        return self.rho == 0.0 and self.basis.shape[1] == self.d


def _intensity(method, tr_s: float, fro2_s: float, sum_norm4: float, n: int, d: int) -> float:
    """ρ from tr(S), ‖S‖_F², Σ_k ‖x_k‖⁴ (centred rows), n and d (see module doc for sources)."""
    if not isinstance(method, str):
        return float(method)
    if method == "none":
        return 0.0
    mu = tr_s / d
    if method == "ledoit_wolf":
        delta2 = (fro2_s - d * mu * mu) / d                       # ‖S − μI‖² (normalised Frobenius)
        beta2 = (sum_norm4 - n * fro2_s) / (n * n * d)             # n⁻² Σ_k ‖x_k x_kᵀ − S‖²
        return 0.0 if delta2 <= 0 else float(min(max(beta2, 0.0), delta2) / delta2)
    # OAS, Chen et al. (2010) eq. (23), written with tr(S²) = ‖S‖_F² and tr²(S).
    num = (1.0 - 2.0 / d) * fro2_s + tr_s * tr_s
    den = (n + 1.0 - 2.0 / d) * (fro2_s - tr_s * tr_s / d)
    return 1.0 if den <= 0 else float(min(num / den, 1.0))


def shrunk_spectrum(acts, shrinkage="auto", where: str = "frame") -> Spectrum:
    """Fit Σ̂ to ``acts`` (n × d, any float dtype; computed in float64); see the module doc."""
    method = check_shrinkage(shrinkage, f"{where}.shrinkage")
    X = np.asarray(acts, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise SpecError(f"{where}.activations", f"need an (n × d) array with n ≥ 2, got shape {X.shape}.",
                        fix="capture at least 2 inputs (rows) of one site (n × d_model).")
    if not np.isfinite(X).all():
        raise SpecError(f"{where}.activations", "activations contain NaN or inf.",
                        fix="fit on finite activations: "
                            "check the capture (model.dtype=float32 avoids float16 overflow).")
    n, d = X.shape
    t0 = time.perf_counter()
    mean = X.mean(0)
    Xc = X - mean
    norms2 = np.einsum("nd,nd->n", Xc, Xc)
    if n <= d:      # Gram path: eigen-decomposition of X_c X_cᵀ (n × n), right vectors by X_cᵀ u / σ
        M = Xc @ Xc.T
    else:           # covariance path: X_cᵀ X_c (d × d)
        M = Xc.T @ Xc
    tr_s = float(norms2.sum()) / n
    fro2_s = float(np.einsum("ij,ij->", M, M)) / (n * n)
    rho = _intensity("ledoit_wolf" if method == "auto" else method, tr_s, fro2_s, float((norms2 ** 2).sum()), n, d)
    mu = tr_s / d
    t1 = time.perf_counter()

    g, vecs = scipy.linalg.eigh(M, overwrite_a=True, check_finite=False, driver="evd")   # divide and conquer
    g, vecs = g[::-1], vecs[:, ::-1]
    full_rank = False
    if n > d and (method == "auto" or rho == 0.0):
        if g[-1] < GRAM_SVD_BELOW * max(float(g[0]), 1e-300):      # X_cᵀX_c squares cond: use X_c's SVD
            _, sv, vt = np.linalg.svd(Xc, full_matrices=False)
            g, vecs = sv * sv, vt.T
        else:
            sv = np.sqrt(np.clip(g, 0.0, None))
        full_rank = bool(sv[-1] > sv[0] * max(n, d) * np.finfo(np.float64).eps)
        if method == "auto" and full_rank:
            rho = 0.0                               # S non-singular: no shrinkage, exact GL(d) invariance
    t2 = time.perf_counter()
    if n <= d:
        keep = g > max(float(g[0]), 0.0) * max(n, d) * np.finfo(np.float64).eps
        g, vecs = g[keep], vecs[:, keep]
        basis = (Xc.T @ vecs) / np.sqrt(g)
    else:
        basis = vecs
        g = np.clip(g, 0.0, None)
    eigval = (1.0 - rho) * g / n + rho * mu
    iso = rho * mu
    if rho == 0.0 and n > d:                        # unshrunk: invertible iff X_c has full column rank
        singular = not full_rank
    else:
        singular = eigval.size == 0 or eigval.min() <= 1e-12 * max(float(eigval.max()), 1e-300) or \
            (basis.shape[1] < d and iso <= 1e-12 * max(float(eigval.max()), 1e-300))
    if singular:
        raise SpecError(f"{where}.shrinkage", f"the covariance of {n} activations in d={d} is singular "
                        f"with shrinkage={shrinkage!r}; a whitened frame needs an invertible covariance.",
                        fix="use shrinkage=ledoit_wolf (or oas), or more reference activations "
                            "(frame.reference_limit) than dims.")
    if basis.shape[1]:      # eigenvector signs are arbitrary: make each column's largest entry positive
        flip = np.sign(basis[np.abs(basis).argmax(0), np.arange(basis.shape[1])])
        basis = basis * np.where(flip == 0, 1.0, flip)
    basis = np.ascontiguousarray(basis)
    timing = {"gram_s": t1 - t0, "eigh_s": t2 - t1, "basis_s": time.perf_counter() - t2}
    return Spectrum(mean=mean, basis=basis, eigval=eigval, iso=float(iso), rho=float(rho), mu=float(mu), n=n, d=d,
                    timing={k: round(v, 4) for k, v in timing.items()})


def spectral_power(x: np.ndarray, basis: np.ndarray, eigval: np.ndarray, iso: float, power: float) -> np.ndarray:
    """``x @ Σ̂^power`` for rows ``x`` (..., d), with Σ̂ in spectral form (never forms d × d)."""
    x = np.asarray(x, dtype=np.float64)
    c = iso ** power if iso > 0 else 0.0
    coef = eigval ** power - c
    return c * x + ((x @ basis) * coef) @ basis.T
