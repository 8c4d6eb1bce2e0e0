"""first_crossing: the first coordinate along ``dim`` where a curve reaches a fraction of its end.

Sign-aware: with end value F, the first point x where ``sign(F)·x ≥ fraction·|F|``.
With ``fraction=0.5`` on the normed reward lens this is the crystallization
layer (the depth at which half the final margin has formed). Pairs with F = 0
give NaN. Output: the coordinate value (e.g. a layer index, −1 = embedding).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registry import register
from .base import INVARIANT, Operator, labelled, need_dim, without


@dataclass(frozen=True)
class FirstCrossingParams:
    dim: str = "layer"
    fraction: float = 0.5


@register
class FirstCrossing(Operator):
    """First coordinate along a dim reaching `fraction` of the final value (sign-aware)."""

    name = "first_crossing"
    dims = "x (…, dim, …) → x without dim"
    Params = FirstCrossingParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], self.p.dim, where, "the curve's axis")
        if not 0 < self.p.fraction <= 1:
            raise SpecError(where + ".fraction", f"must be in (0, 1], got {self.p.fraction}.")
        return without(in_dims[0], self.p.dim)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x):
        x = x.transpose(..., self.p.dim)
        v = np.asarray(x.values, np.float64)
        final = v[..., -1:]
        reached = np.sign(final) * v >= self.p.fraction * np.abs(final)
        first = np.argmax(reached, axis=-1)
        coord = np.asarray(x[self.p.dim].values, np.float64)[first]
        coord = np.where((final[..., 0] == 0) | ~np.isfinite(final[..., 0]), np.nan, coord)
        dims = without(x.dims, self.p.dim)
        out = xr.DataArray(coord, dims=dims, coords={k: c for k, c in x.coords.items() if self.p.dim not in c.dims})
        return labelled(out, self.p.dim, INVARIANT, f"first {self.p.dim} reaching {self.p.fraction} of the final value")
