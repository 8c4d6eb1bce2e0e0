"""Lanczos with full reorthogonalization, and stochastic Lanczos quadrature, for a symmetric operator
given only as a matrix-vector product (a Hessian-vector product).

``lanczos(matvec, v0, m)``: m steps of the three-term recurrence (Lanczos 1950), every new vector
orthogonalized against all earlier ones twice (classical Gram–Schmidt, "twice is enough": Giraud et al.
2005), so with m = n the tridiagonal T has exactly the operator's spectrum (up to rounding); it stops
early on an invariant subspace (β below ``tol``·‖A‖). Ritz values/vectors: ``ritz``.
``slq(matvec, n, m, n_vectors, seed)``: stochastic Lanczos quadrature (Golub & Meurant 1997; Ubaru,
Chen & Saad 2017, "Fast estimation of tr(f(A)) via stochastic Lanczos quadrature"): for Rademacher
vectors z (PCG64 ``seed``), zᵀf(A)z/‖z‖² ≈ Σ_j τ_j f(θ_j) with θ_j the Ritz values and τ_j = (e₁ᵀy_j)²;
the spectral density is the average of these weighted nodes. Standard errors over probes:
``participation_ratio_se`` (delete-one jackknife of the ratio) and ``density_se``. float64 throughout.
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


def slq(matvec, n: int, m: int, n_vectors: int, seed: int = 0, deflate: int = 0):
    """Stochastic Lanczos quadrature: a list of ``(nodes, weights)`` per Rademacher probe, so that
    n·Σ weights·f(nodes) estimates tr f(A) for f(0) = 0 (weights sum to 1 without deflation).

    ``deflate`` = k > 0: the k eigenpairs of largest |λ| are found first (``top_eigen``, m steps) and counted
    exactly, and the probes run on the rest, P A P with P = I − QQᵀ (Q the orthonormalized Ritz vectors): each
    probe's nodes are the k eigenvalues (weight 1/n each) and the Ritz values of P A P from P z (weights
    τ_j·‖Pz‖²/n). Deflation removes the probe noise of a few dominant eigenvalues, which undeflated
    Rademacher probes estimate with a relative error ≈ √(2/V) however large they are (the idea of Hutch++:
    Meyer, Musco, Musco & Woodruff 2021, "Hutch++: Optimal stochastic trace estimation"; here with Lanczos
    Ritz vectors as the low-rank part). k = 0 is plain SLQ (the probes are the same PCG64(seed) draws).
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    vals, Q = np.zeros(0), np.zeros((n, 0))
    if deflate > 0:
        vals, vecs = top_eigen(matvec, n, min(deflate, n), m, seed)
        keep = np.isfinite(vals)
        vals, Q = vals[keep], np.linalg.qr(vecs[:, keep])[0]
    out = []
    for _ in range(n_vectors):
        z = rng.integers(0, 2, size=n) * 2.0 - 1.0
        if vals.size == 0:
            a, b, _ = lanczos(matvec, z, m)
            th, Y = ritz(a, b)
            out.append((th, Y[0] ** 2))
            continue
        z -= Q @ (Q.T @ z)
        nz = float(z @ z)
        if nz <= 1e-12 * n:                                   # the top pairs span the whole space
            out.append((vals.copy(), np.ones(vals.size) / n))
            continue
        a, b, _ = lanczos(lambda x: (lambda y: y - Q @ (Q.T @ y))(np.asarray(matvec(x - Q @ (Q.T @ x)))), z, m)
        th, Y = ritz(a, b)
        out.append((np.concatenate([vals, th]), np.concatenate([np.ones(vals.size), nz * Y[0] ** 2]) / n))
    return out


def _pr(a: np.ndarray, b: np.ndarray, n: int) -> float:
    return float(n * a.mean() ** 2 / b.mean()) if b.mean() > 0 else float("nan")


def participation_ratio(quad, n: int) -> float:
    """(Σ|λ|)² / Σλ² from SLQ quadratures (``slq``'s output) of an n×n operator: tr|A| ≈ n·E[Σ τ|θ|],
    tr A² ≈ n·E[Σ τ θ²]; in [1, n]. NaN for a zero operator."""
    return _pr(np.array([w @ np.abs(t) for t, w in quad]), np.array([w @ t ** 2 for t, w in quad]), n)


def participation_ratio_se(quad, n: int) -> float:
    """Standard error over probes of ``participation_ratio`` (dimensions): the delete-one jackknife of the ratio
    estimator, √((V − 1)/V · Σ_i (PR₍ᵢ₎ − PR₍·₎)²) with PR₍ᵢ₎ the estimate without probe i (Quenouille 1956;
    Efron & Stein 1981). NaN for fewer than 2 probes or a zero operator. It measures the spread from the
    probes only, not the quadrature error of a short Lanczos run."""
    a, b = np.array([w @ np.abs(t) for t, w in quad]), np.array([w @ t ** 2 for t, w in quad])
    V = a.size
    if V < 2:
        return float("nan")
    keep = ~np.eye(V, dtype=bool)
    loo = np.array([_pr(a[k], b[k], n) for k in keep])
    return float(np.sqrt((V - 1) / V * ((loo - loo.mean()) ** 2).sum()))


def _masses(quad, edges: np.ndarray) -> np.ndarray:
    """Spectral mass per bin of ``edges`` for each probe, (probe, bin) (nodes clipped into the range)."""
    out = np.zeros((len(quad), edges.size - 1))
    for i, (t, w) in enumerate(quad):
        w = w / w.sum() if abs(w.sum() - 1.0) > 1e-12 else w      # a deflated probe's weights: its trace share
        np.add.at(out[i], np.clip(np.searchsorted(edges, t, side="right") - 1, 0, edges.size - 2), w)
    return out


def density(quad, edges: np.ndarray) -> np.ndarray:
    """Spectral mass per bin of ``edges`` (nodes clipped into the range), averaged over probes; sums to 1."""
    return _masses(quad, edges).mean(0)


def density_se(quad, edges: np.ndarray) -> np.ndarray:
    """Standard error over probes of ``density``, per bin: the sample standard deviation of the probes'
    masses / √V (fraction). NaN for fewer than 2 probes."""
    m = _masses(quad, edges)
    return m.std(0, ddof=1) / np.sqrt(len(quad)) if len(quad) > 1 else np.full(edges.size - 1, np.nan)
