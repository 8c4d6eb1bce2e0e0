"""scalar_cost: how much per-objective preference a scalar reward summary throws away.

Input: per-objective margins Δ_ik (``pair × objective``; ``project direction: objectives`` then
``diff``) and, optionally, ``scalar``: the model's own scalar margin Δ_i (``pair``; for a gated
head ``project direction: head`` then ``diff``); without it the scalar is the mean over
objectives. Output ``scalar_cost_statistic × bound`` (estimate, ci_low, ci_high; 95% cluster
bootstrap over prompt clusters, ``stats``), gauge invariant:

  sign_disagreement           share of pairs on which some two objectives' margins have
                              opposite signs (Δ_ij·Δ_ik < 0; a zero margin never disagrees, as in
                              ``conflicts``)
  sign_disagreement_weighted  the same, each pair weighted by m_i = Σ_k |Δ_ik|
  overruled_preference        Σ_ik |Δ_ik|·[Δ_ik·Δ_i < 0] / Σ_ik |Δ_ik|: the share of the
                              per-objective preference mass that points against the scalar's verdict
  mean_pairwise_disagreement  mean over objective pairs j < k of ``conflicts``' sign_disagreement
  n_pairs, n_effective        counts (bounds repeat the count)
Pairs with a non-finite margin are left out. Reduces over pairs.
Errors: ``SpecError`` at plan time for a margin without ``pair``/``objective``, a head with one row,
or a ``scalar`` step that is not a per-pair margin.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled
from .conflicts import pairwise
from ..data.checksum import prompt_cluster_key
from ..stats import bootstrap_ci, n_eff

STATS = ["sign_disagreement", "sign_disagreement_weighted", "overruled_preference", "mean_pairwise_disagreement",
         "n_pairs", "n_effective"]
BOUND = ["estimate", "ci_low", "ci_high"]


@dataclass(frozen=True)
class ScalarCostParams:
    scalar: Optional[str] = None
    n_boot: int = 1000
    seed: int = 0


def cost_statistics(D: np.ndarray, s: np.ndarray) -> dict:
    """The four fractions (see module doc) of per-objective margins ``D`` (n × K) and scalar ``s`` (n,)."""
    pos, neg = (D > 0).any(1), (D < 0).any(1)
    dis = pos & neg
    mass = np.abs(D).sum(1)
    against = (np.abs(D) * (D * s[:, None] < 0)).sum(1)
    K = D.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"sign_disagreement": float(dis.mean()) if len(D) else np.nan,
                "sign_disagreement_weighted": float((mass * dis).sum() / mass.sum()),
                "overruled_preference": float(against.sum() / mass.sum()),
                "mean_pairwise_disagreement": float(pairwise(D, "sign_disagreement")[np.triu_indices(K, 1)].mean())}


@OPERATORS.register
class ScalarCost(Operator):
    """Per-objective preference a scalar loses: sign disagreement (plain, margin-weighted), overruled mass."""

    name = "scalar_cost"
    dims = "margins (pair × objective) [, scalar (pair)] → scalar_cost_statistic × bound"
    Params = ScalarCostParams
    extra_inputs = ("scalar",)

    def out_dims(self, in_dims, info, where):
        if "pair" not in in_dims[0] or "objective" not in in_dims[0] or set(in_dims[0]) != {"pair", "objective"}:
            raise SpecError(where + ".input", f"needs per-objective margins (pair × objective), got {in_dims[0]}.",
                            fix="project with direction: objectives, then diff.")
        if info.n_objectives < 2:
            raise SpecError(where, f"the model has {info.n_objectives} head row; a scalar summary loses nothing.",
                            fix="use a model with model.num_labels ≥ 2 (or a gated head).")
        if len(in_dims) > 1 and tuple(in_dims[1]) != ("pair",):
            raise SpecError(where + ".scalar", f"needs the scalar margin (pair,), got {in_dims[1]}.",
                            fix="project with direction: head on a gated model, then diff.")
        return ("scalar_cost_statistic", "bound")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, margins, scalar=None):
        ids = list(ctx.encoded.pair_ids)
        D = np.asarray(margins.sel(pair=ids).transpose("pair", "objective").values, np.float64)
        s = D.mean(1) if scalar is None else np.asarray(scalar.sel(pair=ids).values, np.float64)
        ok = np.isfinite(D).all(1) & np.isfinite(s)
        D, s = D[ok], s[ok]
        by_id = {p.id: p for p in ctx.pairs}
        g = np.array([prompt_cluster_key(by_id[i].prompt) for i, k in zip(ids, ok) if k], dtype=object)
        est = cost_statistics(D, s)
        kw = dict(groups=g, n_boot=self.p.n_boot, seed=self.p.seed)
        rows = {k: [v, *bootstrap_ci(lambda idx, k=k: cost_statistics(D[idx], s[idx])[k], len(D), **kw)]
                for k, v in est.items()}
        rows |= {"n_pairs": [float(len(D))] * 3, "n_effective": [float(n_eff(g, len(g)))] * 3}
        arr = xr.DataArray(np.array([rows[k] for k in STATS], np.float64), dims=("scalar_cost_statistic", "bound"),
                           coords={"scalar_cost_statistic": STATS, "bound": BOUND})
        out = labelled(arr, "fraction", INVARIANT, "per-objective preference lost by the scalar (counts: pairs)")
        out.attrs["scalar"] = "mean over objectives" if scalar is None else str(self.p.scalar)
        return out
