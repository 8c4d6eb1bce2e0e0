"""Lanczos with full reorthogonalization, and stochastic Lanczos quadrature, for a symmetric operator
given only as a matrix-vector product (a Hessian-vector product).

``lanczos(matvec, v0, m)``: m steps of the three-term recurrence (Lanczos 1950), every new vector
orthogonalized against all earlier ones twice (classical Gram–Schmidt, "twice is enough": Giraud et al.
2005), so with m = n the tridiagonal T has exactly the operator's spectrum (up to rounding); it stops
early on an invariant subspace (β below ``tol``·‖A‖). Ritz values/vectors: ``ritz``.
``slq(matvec, n, m, n_vectors, seed)``: stochastic Lanczos quadrature (Golub & Meurant 1997; Ubaru,
Chen & Saad 2017, "Fast estimation of tr(f(A)) via stochastic Lanczos quadrature"): for Rademacher
vectors z (PCG64 ``seed``), zᵀf(A)z/‖z‖² ≈ Σ_j τ_j f(θ_j) with θ_j the Ritz values and τ_j = (e₁ᵀy_j)²;
the spectral density is the average of these weighted nodes. float64 throughout.
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import eigh_tridiagonal


def lanczos(matvec, v0: np.ndarray, m: int, tol: float = 1e-10):
    """``(alpha (k,), beta (k-1,), Q (n, k))`` after k ≤ m steps from ``v0``; Qᵀ A Q = tridiag(β, α, β)."""
    n = v0.size
    m = min(m, n)
    Q = np.zeros((n, m))
    alpha, beta = np.zeros(m), np.zeros(m)
    q = v0 / np.linalg.norm(v0)
    scale = 0.0
    for j in range(m):
        Q[:, j] = q
        w = np.asarray(matvec(q), np.float64)
        alpha[j] = q @ w
        for _ in range(2):                               # full reorthogonalization, twice
            w -= Q[:, :j + 1] @ (Q[:, :j + 1].T @ w)
        b = np.linalg.norm(w)
        scale = max(scale, abs(alpha[j]), b)
        if j == m - 1 or b <= tol * max(scale, 1e-300):
            return alpha[:j + 1], beta[:j], Q[:, :j + 1]
        beta[j] = b
        q = w / b
    return alpha, beta[:m - 1], Q                          # not reached


def ritz(alpha: np.ndarray, beta: np.ndarray):
    """Eigenvalues (ascending) and eigenvectors of the tridiagonal T."""
    if alpha.size == 1:
        return alpha.copy(), np.ones((1, 1))
    return eigh_tridiagonal(alpha, beta)


def top_eigen(matvec, n: int, k: int, m: int, seed: int = 0):
    """The k eigenvalues of largest magnitude (signed, ordered by |λ| descending) and their unit Ritz
    vectors (n, k), from m Lanczos steps from a PCG64-seeded Gaussian start. NaN-padded past the
    Krylov dimension reached."""
    v0 = np.random.Generator(np.random.PCG64(seed)).normal(size=n)
    a, b, Q = lanczos(matvec, v0, m)
    th, Y = ritz(a, b)
    order = np.argsort(-np.abs(th), kind="stable")[:k]
    vals, vecs = np.full(k, np.nan), np.full((n, k), np.nan)
    vals[:order.size], vecs[:, :order.size] = th[order], Q @ Y[:, order]
    return vals, vecs


def slq(matvec, n: int, m: int, n_vectors: int, seed: int = 0):
    """Stochastic Lanczos quadrature: a list of ``(nodes, weights)`` per Rademacher probe (weights sum to 1)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out = []
    for _ in range(n_vectors):
        z = rng.integers(0, 2, size=n) * 2.0 - 1.0
        a, b, _ = lanczos(matvec, z, m)
        th, Y = ritz(a, b)
        out.append((th, Y[0] ** 2))
    return out


def participation_ratio(quad, n: int) -> float:
    """(Σ|λ|)² / Σλ² from SLQ quadratures (``slq``'s output) of an n×n operator: tr|A| ≈ n·E[Σ τ|θ|],
    tr A² ≈ n·E[Σ τ θ²]; in [1, n]. NaN for a zero operator."""
    a = np.mean([w @ np.abs(t) for t, w in quad])
    b = np.mean([w @ t ** 2 for t, w in quad])
    return float(n * a * a / b) if b > 0 else float("nan")


def density(quad, edges: np.ndarray) -> np.ndarray:
    """Spectral mass per bin of ``edges`` (nodes clipped into the range), averaged over probes; sums to 1."""
    out = np.zeros(edges.size - 1)
    for t, w in quad:
        idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, edges.size - 2)
        np.add.at(out, idx, w)
    return out / len(quad)
