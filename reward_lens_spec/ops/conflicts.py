"""conflicts: how often, and how strongly, objectives disagree on the same pairs.

Input: a margin with ``pair`` and ``objective`` dims (e.g. ``project direction: objectives`` then
``diff`` on a model with K > 1 head rows). Output ``objective × objective_b`` (other dims kept):

  statistic: sign_disagreement   fraction of pairs where the two objectives' margins have
                                 opposite signs (Δ_i · Δ_j < 0; a zero margin never disagrees),
                                 over pairs where both are finite. Units ``fraction``.
  statistic: pearson | spearman  correlation of the two objectives' margins over pairs
                                 (Spearman = Pearson of average ranks). Units ``correlation``.

Margins are gauge-invariant, so is the output. A constant margin gives NaN correlations.
Errors: ``SpecError`` at plan time when the input lacks ``pair`` or ``objective`` (fix: a head
with num_labels ≥ 2) or the statistic is unknown.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr
from scipy.stats import rankdata

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, without

STATISTICS = {"sign_disagreement": "fraction", "pearson": "correlation", "spearman": "correlation"}


@dataclass(frozen=True)
class ConflictsParams:
    statistic: str = "sign_disagreement"


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = np.sqrt((a * a).sum() * (b * b).sum())
    return float(np.clip((a * b).sum() / den, -1, 1)) if den > 0 else np.nan


def pairwise(v: np.ndarray, statistic: str) -> np.ndarray:
    """``v`` (n × K) margins → K × K statistic over the pairs where both columns are finite."""
    K = v.shape[1]
    out = np.full((K, K), np.nan)
    for i in range(K):
        for j in range(K):
            ok = np.isfinite(v[:, i]) & np.isfinite(v[:, j])
            a, b = v[ok, i], v[ok, j]
            if statistic == "sign_disagreement":
                out[i, j] = float(np.mean(a * b < 0)) if a.size else np.nan
            elif a.size >= 2:
                out[i, j] = _corr(rankdata(a), rankdata(b)) if statistic == "spearman" else _corr(a, b)
    return out


@OPERATORS.register
class Conflicts(Operator):
    """Objective × objective sign disagreement (or margin correlation) over pairs."""

    name = "conflicts"
    dims = "margin (pair × objective) → objective × objective_b"
    Params = ConflictsParams

    def out_dims(self, in_dims, info, where):
        if self.p.statistic not in STATISTICS:
            raise SpecError(where + ".statistic", f"unknown statistic '{self.p.statistic}'.",
                            value=self.p.statistic, options=STATISTICS)
        if "pair" not in in_dims[0]:
            raise SpecError(where, f"needs an input with a 'pair' dim, got dims {in_dims[0]}.",
                            fix="feed it a per-pair margin (project direction: head, then diff).")
        if info.n_objectives < 2:
            raise SpecError(where, f"the model has {info.n_objectives} head row; conflicts need at least two.",
                            fix="use a model with model.num_labels ≥ 2.")
        if "objective" not in in_dims[0]:
            raise SpecError(where, f"needs an input with an 'objective' dim, got dims {in_dims[0]} "
                            f"(the model has {info.n_objectives} head row(s)).",
                            fix="project with direction: objectives (every head row) before diff.")
        return without(in_dims[0], "pair", "objective") + ("objective", "objective_b")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x):
        rest = [d for d in x.dims if d not in ("pair", "objective")]
        x = x.transpose(*rest, "pair", "objective")
        vals = np.asarray(x.values, np.float64)
        lead = vals.shape[:-2]
        K = vals.shape[-1]
        out = np.empty(lead + (K, K))
        for idx in np.ndindex(*lead):
            out[idx] = pairwise(vals[idx], self.p.statistic)
        names = list(x["objective"].values) if "objective" in x.coords else [str(k) for k in range(K)]
        coords = {k: v for k, v in x.coords.items() if not set(v.dims) & {"pair", "objective"}}
        arr = xr.DataArray(out, dims=tuple(rest) + ("objective", "objective_b"),
                           coords={**coords, "objective": names, "objective_b": names})
        what = ("fraction of pairs whose margins disagree in sign" if self.p.statistic == "sign_disagreement"
                else f"{self.p.statistic} correlation of margins over pairs")
        return labelled(arr, STATISTICS[self.p.statistic], INVARIANT, what)
