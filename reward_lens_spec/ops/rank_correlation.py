"""rank_correlation: Spearman's ρ between two variables over shared dims.

``over``: the dims whose cells are ranked (e.g. [layer, component]); the two
inputs are aligned on their shared coordinates first (inner join) and NaN
cells dropped. ``per: pair`` gives one ρ per pair; ``per: null`` pools every
cell. Faithfulness of an observational attribution (DLA) to a causal one
(activation patching) is this number; it is often near zero on real models.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import xarray as xr
from scipy.stats import spearmanr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_dim


@dataclass(frozen=True)
class RankCorrelationParams:
    other: str
    over: tuple = ("layer", "component")
    per: Optional[str] = "pair"


def _rho(a, b):
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return np.nan
    return float(spearmanr(a[ok], b[ok]).statistic)


@OPERATORS.register
class RankCorrelation(Operator):
    """Spearman rank correlation of two variables over dims, per pair or pooled."""

    name = "rank_correlation"
    dims = "x, other (pair × over…) → per (pair) or () pooled"
    Params = RankCorrelationParams
    extra_inputs = ("other",)

    def out_dims(self, in_dims, info, where):
        for dims in in_dims[:2]:
            for d in list(self.p.over) + ([self.p.per] if self.p.per else []):
                need_dim(dims, d, where, "ranked or grouped dim")
        extra = set(in_dims[0]) - set(self.p.over) - {self.p.per}
        if extra:
            raise SpecError(where, f"input has dims {sorted(extra)} not in over/per.", fix="reduce or select them first.")
        return (self.p.per,) if self.p.per else ()

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x, y):
        x, y = xr.align(x, y, join="inner")
        over = list(self.p.over)
        if self.p.per:
            xs = x.transpose(self.p.per, *over).values.reshape(x.sizes[self.p.per], -1)
            ys = y.transpose(self.p.per, *over).values.reshape(y.sizes[self.p.per], -1)
            data = np.array([_rho(a, b) for a, b in zip(xs, ys)])
            out = xr.DataArray(data, dims=(self.p.per,), coords={k: v for k, v in x.coords.items()
                                                                   if v.dims == (self.p.per,)})
        else:
            out = xr.DataArray(_rho(x.values.ravel(), y.transpose(*x.dims).values.ravel()))
        return labelled(out, "spearman_rho", INVARIANT)
