"""contested_direction: the direction along which contested pairs differ, and its angle to w_r.

In the whitened frame of this run's readout activations (``objective_geometry.readout_frame``:
``frames.fit_whitened`` on h of both sides, ``shrinkage``), dz = (h_c − h_r) Σ̂^{-1/2} per pair.
Contested / unanimous pairs as in ``contested_margin`` (``unanimous`` threshold). Disagreement
need not have a sign (two camps pulling opposite ways along one axis), so the direction is the
unit v maximising the second-moment contrast

    v·(S_c − S_u)·v,   S = mean dz dzᵀ over a class,

the top eigenvector of S_c − S_u (a quadratic discriminant in the whitened frame; computed from
the QR of the stacked dz, an r × r eigenproblem with r = min(n, d), never a d × d matrix when
n < d). ``contrast`` = that top eigenvalue (whitened variance units); its null permutes the
contested labels over the recorded pairs ``n_perm`` times. The cosine to the reward direction
w_r (the head row ``objective``, mapped into the frame as a covector, ``direction_to_frame``; for
a gated head without ``objective``, the mean over the run's readouts of its effective direction
g(h)ᵀW, the gate frozen at each h) is reported as |cos| (v has no sign) beside a random-direction
null (``frames.compare_directions``: N(0, I) in frame coordinates, ``n_null`` draws).

``quantity: statistics`` → ``direction_statistic``: abs_cosine_w_r, null_abs_cosine_q50,
null_abs_cosine_q95, p_value_cosine (share of null |cos| ≥ observed, +1 corrected), contrast,
contrast_null_q95, p_value_contrast, perm_abs_cosine_q50/q95 (|cos| to w_r of the direction
found with permuted labels: the null that keeps the geometry of dz, which an isotropic random
direction does not when h_c − h_r spans few axes), n_contested, n_unanimous. Read the cosine
only when p_value_contrast is small: without a contrast the direction is noise.
``quantity: direction`` → v (``d_model``, whitened coordinates, sign: largest entry positive).
Both carry the frame's gauge ``frame:whitened:<frame id>`` (``…:<model>`` in the plan) and share
one fit. Reduces over pairs.
Errors: ``SpecError`` at plan time for a non-readout input, a K-row linear head without
``objective``, an unknown ``objective`` or bad params; at run time when agreement is missing or a
class is empty (see contested_margin).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import scipy.linalg
import xarray as xr

from ..errors import SpecError
from ..spec_checks import check_shrinkage
from ..registries import OPERATORS
from .base import Operator, labelled, need_readout_sides
from .contested_margin import check_unanimous, record_classes
from ..frames.compare import compare_directions
from .objective_geometry import readout_frame

QUANTITIES = ("statistics", "direction")
STATS = ["abs_cosine_w_r", "null_abs_cosine_q50", "null_abs_cosine_q95", "p_value_cosine", "contrast",
         "contrast_null_q95", "p_value_contrast", "perm_abs_cosine_q50", "perm_abs_cosine_q95", "n_contested",
         "n_unanimous"]


@dataclass(frozen=True)
class ContestedDirectionParams:
    quantity: str = "statistics"
    objective: Optional[str] = None
    unanimous: float = 1.0
    shrinkage: str = "auto"                 # plain covariance when invertible (exact invariance), else Ledoit–Wolf
    n_perm: int = 200
    n_null: int = 1000
    seed: int = 0


def contrast_top(Z: np.ndarray, contested: np.ndarray, perms: np.ndarray | None = None, against=None):
    """Top eigenpair of Zᵀ diag(c) Z, c = +1/n_c on contested rows and −1/n_u on the rest.

    ``Z`` (n × d). Returns ``(eigenvalue, unit eigenvector (d,))``; with ``perms`` (P × n label
    permutations, boolean) also the P permuted top eigenvalues and, for a unit vector ``against``
    (d,), the P values |cos(permuted eigenvector, against)| (else None). Uses Zᵀ = Q R (economic QR).
    """
    Q, R = np.linalg.qr(Z.T)                               # Q: d × r, R: r × n

    def top(mask):
        c = np.where(mask, 1.0 / mask.sum(), -1.0 / (~mask).sum())
        K = (R * c) @ R.T
        lam, vec = scipy.linalg.eigh(K, subset_by_index=[K.shape[0] - 1, K.shape[0] - 1])
        return float(lam[0]), vec[:, 0]                     # ‖Q vec‖ = 1: Q has orthonormal columns
    lam, vec = top(contested)
    v = Q @ vec
    v = v / np.linalg.norm(v)
    v = v * np.sign(v[np.argmax(np.abs(v))])
    if perms is None:
        return lam, v
    null = [top(m) for m in perms]
    cos = None if against is None else np.abs(np.array([vv for _, vv in null]) @ (Q.T @ against))
    return lam, v, np.array([x for x, _ in null]), cos


def _fit(ctx, p, h):
    rec, cont, _ = record_classes(ctx, p.unanimous)
    frame = readout_frame(ctx, p.shrinkage)
    model = ctx.info.model_name
    H = np.asarray(h.sel(pair=list(ctx.encoded.pair_ids)).transpose("pair", "side", "d_model").values, np.float64)
    Z = frame.to_frame(H[:, 0] - H[:, 1], model, center=False)[rec]
    c = cont[rec]
    rng = np.random.Generator(np.random.PCG64(p.seed))
    perms = np.array([rng.permutation(c) for _ in range(p.n_perm)])
    head = ctx.lm.head
    k = head.objectives.index(p.objective) if p.objective is not None else 0
    if p.objective is None and head.gate is not None:       # gated: the mean effective direction g(h)ᵀW
        w = head.directions(H.reshape(-1, H.shape[-1]))[:, 0].mean(0)
    else:
        w = np.asarray(head.W[k], np.float64)
    wt = frame.direction_to_frame(w, model)
    lam, v, lam_null, cos_null = contrast_top(Z, c, perms, wt / np.linalg.norm(wt))
    v_da = xr.DataArray(v, dims=("d_model",), name="contested_direction", attrs={"gauge": frame.gauge})
    w_da = xr.DataArray(w, dims=("d_model",), name="w_r",
                        attrs={"gauge": ctx.info.native_frame})
    cmp = compare_directions(v_da, w_da, frame, n_null=p.n_null, seed=p.seed)
    q = cmp["null_abs_cosine"]
    stats = {"abs_cosine_w_r": abs(float(cmp["cosine"])), "null_abs_cosine_q50": float(q.sel(quantile=0.5)),
             "null_abs_cosine_q95": float(q.sel(quantile=0.95)), "p_value_cosine": float(cmp["p_value"]),
             "contrast": lam, "contrast_null_q95": float(np.quantile(lam_null, 0.95)),
             "p_value_contrast": float((1 + np.sum(lam_null >= lam - 1e-12)) / (1 + len(lam_null))),
             "perm_abs_cosine_q50": float(np.quantile(cos_null, 0.5)),
             "perm_abs_cosine_q95": float(np.quantile(cos_null, 0.95)),
             "n_contested": float(c.sum()), "n_unanimous": float((~c).sum())}
    gated = p.objective is None and head.gate is not None
    return {"stats": stats, "v": v, "frame": frame, "objective": "gated (mean g(h)ᵀW)" if gated else head.objectives[k]}


@OPERATORS.register
class ContestedDirection(Operator):
    """Direction separating contested from unanimous pairs in whitened h_c − h_r; |cos| to w_r with nulls."""

    name = "contested_direction"
    pair_fields = ("agreement", "votes")
    dims = "x (pair × side × d_model) → direction_statistic (statistics) | d_model (direction)"
    reads_capture = True           # the whitened frame is fitted on every pair's readout h
    Params = ContestedDirectionParams

    def out_dims(self, in_dims, info, where):
        need_readout_sides(in_dims[0], where)
        if self.p.quantity not in QUANTITIES:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=QUANTITIES)
        if self.p.objective is None and info.n_objectives > 1 and not info.gated:
            raise SpecError(where + ".objective", f"the head has {info.n_objectives} rows; name the one to compare.",
                            options=info.objectives)
        if self.p.objective is not None and self.p.objective not in info.objectives:
            raise SpecError(where + ".objective", f"unknown objective '{self.p.objective}'.", value=self.p.objective,
                            options=info.objectives)
        check_unanimous(self.p.unanimous, where + ".unanimous")
        check_shrinkage(self.p.shrinkage, where + ".shrinkage")
        for key in ("n_perm", "n_null"):
            if getattr(self.p, key) < 1:
                raise SpecError(f"{where}.{key}", f"must be ≥ 1, got {getattr(self.p, key)}.",
                                fix=f"e.g. {key}: 1000 in the step.")
        return ("direction_statistic",) if self.p.quantity == "statistics" else ("d_model",)

    def gauge(self, in_gauges, info):
        return f"frame:whitened:{info.model_name}"

    def run(self, ctx, h):
        key = ("contested_direction", tuple((k, v) for k, v in asdict(self.p).items() if k != "quantity"))
        if key not in ctx.memo:
            ctx.memo[key] = _fit(ctx, self.p, h)
        fit = ctx.memo[key]
        if self.p.quantity == "statistics":
            arr = xr.DataArray(np.array([fit["stats"][s] for s in STATS], np.float64), dims=("direction_statistic",),
                               coords={"direction_statistic": STATS})
            out = labelled(arr, "statistic", fit["frame"].gauge, "contested direction: |cos| to w_r, contrast, nulls")
        else:
            out = labelled(xr.DataArray(fit["v"], dims=("d_model",)), "direction", fit["frame"].gauge,
                           "unit direction of largest contested-minus-unanimous second moment (whitened frame)")
        out.attrs.update(frame_id=fit["frame"].id, objective=fit["objective"], unanimous=float(self.p.unanimous))
        return out
