"""cumsum: running sum along a dim (e.g. DLA accumulated over ``layer``); NaN counts as 0."""
from __future__ import annotations

from dataclasses import dataclass

from ..registries import OPERATORS
from .base import Operator, need_dim


@dataclass(frozen=True)
class CumsumParams:
    dim: str = "layer"


@OPERATORS.register
class Cumsum(Operator):
    """Cumulative sum along a dim."""

    name = "cumsum"
    per_pair = True
    dims = "x (…, dim, …) → same dims"
    Params = CumsumParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], self.p.dim, where, "the dim to accumulate along", param="dim")
        return in_dims[0]

    def run(self, ctx, x):
        out = x.fillna(0).cumsum(self.p.dim)
        out.attrs = dict(x.attrs)
        if out.attrs.get("affine") == "point":
            del out.attrs["affine"]                     # running sums of positions are neither (frames.express)
        return out
