"""preference_rank: does a skew-symmetric (intransitive) pair model beat a scalar reward on held-out labels?

On readout activations h (pair × side × d_model), split by prompt cluster (``fit.split``), with
φ = h projected on the top ``n_components`` principal axes of the TRAIN split's h (both sides),
centred and divided by one scale so that the mean variance per axis is 1, two pair models are
fitted to the labels (chosen over rejected):

  transitive  s(x, y) = w·(φ(x) − φ(y))                                 (a scalar reward)
  skew        s(x, y) = w·(φ(x) − φ(y)) + φ(x)ᵀ A φ(y),  A = U Vᵀ − V Uᵀ   (rank 2k, Aᵀ = −A)

both with P(x ≻ y) = σ(s(x, y)) and s(y, x) = −s(x, y) by construction (to rounding); A = 0 is the
transitive model, so the skew model nests it. The rank-2k skew form is the blade–chest /
general-preference embedding (Chen & Joachims 2016, "Modeling intransitivity in matchup and
comparison data"; Zhang et al. 2024, "Beyond Bradley–Terry models: a general preference model");
a skew matrix's rank is even (Balduzzi et al. 2018, "Re-evaluating evaluation"). Fit: mean
softplus(−s) + λ/2·(‖w‖² + ‖U‖² + ‖V‖²) by L-BFGS with the exact gradient, p·(1 + 2k) parameters
(never a p²-sized system); U, V start small and seeded, w at the transitive fit (every λ from that
start); λ per model from ``l2_grid`` by DEV log-loss; both models are fitted by this one routine
(k = 0 is the transitive one), so they share penalty and optimizer.

``quantity: statistics`` → ``rank_statistic × bound`` (estimate, ci_low, ci_high) on the TEST
split: transitive_/skew_ accuracy (ties ½) and log_loss (nats), ``cyclic_gain`` = transitive
minus skew mean log-loss (nats per pair; > 0: the labels hold structure no linear scalar reward of
φ fits — a cycle, or a reward direction that depends on the shared prompt), ``accuracy_gain``;
95% cluster-bootstrap CIs over test prompt clusters (``stats``); counts n_train, n_test,
n_effective, n_components (bounds repeat the count). Gauge invariant.
``quantity: singular_values`` → ``singular`` (2k): singular values of A in φ coordinates (they
come in equal pairs), units 1/φ² (φ: the scaled PCA coordinates), gauge ``frame:native:<model>``
(PCA picks its axes in that basis). Both quantities share one fit (memoised per run). Reduces
over pairs.
Errors: ``SpecError`` at plan time for an input without pair/side/d_model, rank < 1, bad
n_components/l2_grid/quantity; at run time (``fit.fractions``) when a split part is empty.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr
from scipy.optimize import minimize
from scipy.special import expit, log_expit

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_readout_sides
from ..data.checksum import prompt_cluster_key
from ..fit.split import split_by_prompt
from ..stats import accuracy, correct, mean_with_ci, n_eff

QUANTITIES = ("statistics", "singular_values")
BOUND = ["estimate", "ci_low", "ci_high"]
STATS = ["transitive_accuracy", "skew_accuracy", "accuracy_gain", "transitive_log_loss", "skew_log_loss",
         "cyclic_gain", "n_train", "n_test", "n_effective", "n_components"]


@dataclass(frozen=True)
class PreferenceRankParams:
    quantity: str = "statistics"
    rank: int = 1
    n_components: int = 256
    l2_grid: tuple = (10.0, 1.0, 0.1, 0.01, 0.001)
    fractions: tuple = (0.6, 0.1, 0.3)
    seed: int = 0
    n_boot: int = 1000
    max_iter: int = 500


def pair_scores(theta: np.ndarray, a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """s(a_i, b_i) per row for θ = (w, U, V) flattened (p + 2·p·k); a, b: (n × p)."""
    p = a.shape[1]
    w, U, V = theta[:p], theta[p:p + p * k].reshape(p, k), theta[p + p * k:].reshape(p, k)
    return (a - b) @ w + ((a @ U) * (b @ V)).sum(1) - ((a @ V) * (b @ U)).sum(1)


def _objective(theta, a, b, k, lam):
    p = a.shape[1]
    w, U, V = theta[:p], theta[p:p + p * k].reshape(p, k), theta[p + p * k:].reshape(p, k)
    P, Q, R, S = a @ U, b @ V, a @ V, b @ U
    s = (a - b) @ w + (P * Q).sum(1) - (R * S).sum(1)
    n = len(s)
    g = -expit(-s) / n                                     # d mean softplus(−s) / ds
    gw = (a - b).T @ g
    gU = a.T @ (g[:, None] * Q) - b.T @ (g[:, None] * R)
    gV = b.T @ (g[:, None] * P) - a.T @ (g[:, None] * S)
    loss = -log_expit(s).mean() + 0.5 * lam * (theta @ theta)
    return loss, np.concatenate([gw, gU.ravel(), gV.ravel()]) + lam * theta


def fit_pair_model(a, b, a_dev, b_dev, k: int, l2_grid, *, init_w=None, seed: int = 0, max_iter: int = 500):
    """Fit the rank-2k skew model (k = 0: transitive) on train rows; λ by dev log-loss. Returns (θ, λ)."""
    p = a.shape[1]
    rng = np.random.Generator(np.random.PCG64(seed))
    theta0 = np.concatenate([np.zeros(p) if init_w is None else np.asarray(init_w, np.float64),
                            0.01 * rng.standard_normal(2 * p * k)])
    best = None
    for lam in sorted({float(x) for x in l2_grid}, reverse=True):
        # every λ from the same start: warm-starting after a strong λ would leave U, V at the saddle 0
        res = minimize(_objective, theta0, args=(a, b, k, lam), jac=True, method="L-BFGS-B",
                       options={"maxiter": max_iter})
        theta = res.x
        dev = float(-log_expit(pair_scores(theta, a_dev, b_dev, k)).mean())
        if best is None or dev < best[0]:
            best = (dev, theta.copy(), lam)
    return best[1], best[2]


def skew_singular_values(theta: np.ndarray, p: int, k: int) -> np.ndarray:
    """Singular values of A = U Vᵀ − V Uᵀ (2k, descending) via the QR of [U V], never forming A."""
    U, V = theta[p:p + p * k].reshape(p, k), theta[p + p * k:].reshape(p, k)
    Q, R = np.linalg.qr(np.concatenate([U, V], 1))
    J = np.block([[np.zeros((k, k)), np.eye(k)], [-np.eye(k), np.zeros((k, k))]])
    return np.linalg.svd(R @ J @ R.T, compute_uv=False)


def _pca(h_train: np.ndarray, n_components: int):
    """φ(x) = (x − μ) V_q / c: the top-q principal axes of the train h, one scale c (mean variance 1)."""
    mu = h_train.mean(0)
    _, sv, vt = np.linalg.svd(h_train - mu, full_matrices=False)
    q = min(int((sv > sv[0] * 1e-8).sum()) if sv.size else 0, n_components)
    c = np.sqrt((sv[:q] ** 2).mean() / len(h_train))
    return lambda x: ((x - mu) @ vt[:q].T) / c, q


def _fit(ctx, p: PreferenceRankParams, h: xr.DataArray) -> dict:
    ids = list(ctx.encoded.pair_ids)
    H = np.asarray(h.sel(pair=ids).transpose("pair", "side", "d_model").values, np.float64)
    by_id = {q.id: q for q in ctx.pairs}
    split = split_by_prompt([by_id[i] for i in ids], fractions=p.fractions, seed=p.seed)
    pos = {i: n for n, i in enumerate(ids)}
    part = {name: np.array([pos[i] for i in split.ids(name)], np.int64) for name in ("train", "dev", "test")}
    if len(part["test"]) == 0:
        raise SpecError("fit.fractions", f"the test part is empty ({len(ids)} pairs).",
                        fix="give more pairs or a larger test share (fractions: [0.6, 0.1, 0.3]).")
    phi, q = _pca(H[part["train"]].reshape(-1, H.shape[-1]), p.n_components)
    A, B = phi(H[:, 0]), phi(H[:, 1])
    tr, dv, te = part["train"], part["dev"], part["test"]
    w_t, lam_t = fit_pair_model(A[tr], B[tr], A[dv], B[dv], 0, p.l2_grid, seed=p.seed, max_iter=p.max_iter)
    th_s, lam_s = fit_pair_model(A[tr], B[tr], A[dv], B[dv], p.rank, p.l2_grid, init_w=w_t, seed=p.seed,
                                 max_iter=p.max_iter)
    s_t, s_s = pair_scores(w_t, A[te], B[te], 0), pair_scores(th_s, A[te], B[te], p.rank)
    groups = np.array([prompt_cluster_key(by_id[ids[i]].prompt) for i in te], dtype=object)
    kw = dict(groups=groups, n_boot=p.n_boot, seed=p.seed)
    lt, ls = -log_expit(s_t), -log_expit(s_s)
    trip = lambda d: (d["estimate"], d["ci_low"], d["ci_high"])  # noqa: E731
    count = lambda n: (float(n),) * 3                            # noqa: E731
    stats = {"transitive_accuracy": trip(accuracy(s_t, **kw)), "skew_accuracy": trip(accuracy(s_s, **kw)),
             "accuracy_gain": trip(mean_with_ci(correct(s_s) - correct(s_t), **kw)),
             "transitive_log_loss": trip(mean_with_ci(lt, **kw)), "skew_log_loss": trip(mean_with_ci(ls, **kw)),
             "cyclic_gain": trip(mean_with_ci(lt - ls, **kw)), "n_train": count(len(tr)), "n_test": count(len(te)),
             "n_effective": count(n_eff(groups, len(te))), "n_components": count(q)}
    return {"stats": stats, "singular": skew_singular_values(th_s, q, p.rank), "l2": (lam_t, lam_s),
            "split": split.summary()}


@OPERATORS.register
class PreferenceRank(Operator):
    """Transitive vs rank-2k skew-symmetric pair model on readout h: held-out cyclic_gain with CI."""

    name = "preference_rank"
    dims = "x (pair × side × d_model) → rank_statistic × bound (statistics) | singular"
    Params = PreferenceRankParams

    def out_dims(self, in_dims, info, where):
        need_readout_sides(in_dims[0], where)
        if self.p.quantity not in QUANTITIES:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=QUANTITIES)
        for key, lo in (("rank", 1), ("n_components", 1), ("n_boot", 1), ("max_iter", 1)):
            if getattr(self.p, key) < lo:
                raise SpecError(f"{where}.{key}", f"must be ≥ {lo}, got {getattr(self.p, key)}.",
                                fix=f"set {key}: {lo} or more in the step.")
        grid = list(self.p.l2_grid)
        if not grid or any(not np.isfinite(float(x)) or float(x) < 0 for x in grid):
            raise SpecError(where + ".l2_grid", f"need one or more finite λ ≥ 0, got {grid}.",
                            fix="e.g. [1, 0.1, 0.01].")
        return ("rank_statistic", "bound") if self.p.quantity == "statistics" else ("singular",)

    def gauge(self, in_gauges, info):
        return INVARIANT if self.p.quantity == "statistics" else info.native_frame

    def run(self, ctx, h):
        key = ("preference_rank", tuple((k, v if not isinstance(v, list) else tuple(v))
                                        for k, v in asdict(self.p).items() if k != "quantity"))
        if key not in ctx.memo:
            ctx.memo[key] = _fit(ctx, self.p, h)
        fit = ctx.memo[key]
        attrs = {"l2_transitive": float(fit["l2"][0]), "l2_skew": float(fit["l2"][1]), "rank": int(self.p.rank),
                 "split": fit["split"]}
        if self.p.quantity == "statistics":
            data = np.array([fit["stats"][s] for s in STATS], np.float64)
            arr = xr.DataArray(data, dims=("rank_statistic", "bound"), coords={"rank_statistic": STATS, "bound": BOUND})
            out = labelled(arr, "statistic", INVARIANT, "held-out transitive vs skew pair model (nats, fractions)")
        else:
            arr = xr.DataArray(fit["singular"], dims=("singular",), coords={"singular": np.arange(2 * self.p.rank)})
            out = labelled(arr, "1/phi^2", ctx.info.native_frame,
                           "singular values of the skew matrix A (scaled PCA coordinates of h)")
        out.attrs.update(attrs)
        return out
