"""first_crossing: the first coordinate along ``dim`` where a curve reaches a fraction of its end.

Sign-aware: with end value F, the first point x where ``sign(F)·x ≥ fraction·|F|``.
With ``fraction=0.5`` on the normed reward lens this is the crystallization
layer (the depth at which half the final margin has formed). Pairs with F = 0
(or not finite) give NaN. Output, by ``quantity``:

* ``coordinate`` (default): the coordinate value there (a layer index, −1 = embedding);
* ``depth_fraction``: its position along ``dim`` as a fraction in [0, 1] —
  index / (length − 1), so the first point (the embedding) is 0 and the last
  layer is 1.

Worked values on layers (−1, 0, 1, 2, 3): curve (0, .1, .6, .4, 1) → layer 1,
fraction 0.5; (0, −.6, .2, −.3, −1) → layer 0, fraction 0.25.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_dim, without


@dataclass(frozen=True)
class FirstCrossingParams:
    dim: str = "layer"
    fraction: float = 0.5
    quantity: str = "coordinate"        # "coordinate" | "depth_fraction"


_UNITS = {"coordinate": None, "depth_fraction": "fraction"}


@OPERATORS.register
class FirstCrossing(Operator):
    """First coordinate along a dim reaching `fraction` of the final value (sign-aware)."""

    name = "first_crossing"
    per_pair = True
    dims = "x (…, dim, …) → x without dim"
    Params = FirstCrossingParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], self.p.dim, where, "the curve's axis", param="dim")
        if not 0 < self.p.fraction <= 1:
            raise SpecError(where + ".fraction", f"must be in (0, 1], got {self.p.fraction}.")
        if self.p.quantity not in _UNITS:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=_UNITS)
        return without(in_dims[0], self.p.dim)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x):
        x = x.transpose(..., self.p.dim)
        v = np.asarray(x.values, np.float64)
        final = v[..., -1:]
        reached = np.sign(final) * v >= self.p.fraction * np.abs(final)
        first = np.argmax(reached, axis=-1)
        if self.p.quantity == "depth_fraction":
            coord = first / max(v.shape[-1] - 1, 1)
        else:
            coord = np.asarray(x[self.p.dim].values, np.float64)[first]
        coord = np.where((final[..., 0] == 0) | ~np.isfinite(final[..., 0]), np.nan, coord)
        dims = without(x.dims, self.p.dim)
        out = xr.DataArray(coord, dims=dims, coords={k: c for k, c in x.coords.items() if self.p.dim not in c.dims})
        what = f"first {self.p.dim} reaching {self.p.fraction} of the final value"
        if self.p.quantity == "depth_fraction":
            return labelled(out, "fraction", INVARIANT, what + f", as a fraction of depth (0 = first {self.p.dim}, "
                            f"1 = last)")
        return labelled(out, self.p.dim, INVARIANT, what)
