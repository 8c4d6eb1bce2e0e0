"""reduce: mean, sum, median or quantile over a dim, optionally within groups.

``by`` names a non-index coordinate of ``dim`` (e.g. ``dimension`` on ``pair``):
the reduction then runs within each group and ``dim`` is replaced by ``by``.
NaN entries (structurally absent cells) are skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import SpecError
from ..registries import OPERATORS
from .base import Operator, need_dim, without

_HOW = ("mean", "sum", "median", "quantile")


@dataclass(frozen=True)
class ReduceParams:
    dim: str
    how: str = "mean"
    q: Optional[float] = None
    by: Optional[str] = None


@OPERATORS.register
class Reduce(Operator):
    """Reduce over a dim (mean/sum/median/quantile), optionally grouped by a coordinate."""

    name = "reduce"
    dims = "x (…, dim, …) → x without dim [+ by]"
    Params = ReduceParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], self.p.dim, where, "the dim to reduce", param="dim")
        if self.p.how not in _HOW:
            raise SpecError(where + ".how", f"unknown reduction '{self.p.how}'.", value=self.p.how, options=_HOW)
        if self.p.how == "quantile" and not (self.p.q is not None and 0 <= self.p.q <= 1):
            raise SpecError(where + ".q", "how=quantile needs q in [0, 1].")
        out = without(in_dims[0], self.p.dim)
        return (self.p.by,) + out if self.p.by else out

    def acts_per_pair(self) -> bool:
        return self.p.dim != "pair" and not self.p.by

    def run(self, ctx, x):
        target = x.groupby(self.p.by) if self.p.by else x
        kw = {} if self.p.by else {"dim": self.p.dim}
        if self.p.how == "quantile":
            out = target.quantile(self.p.q, **({"dim": self.p.dim} if not self.p.by else {})).drop_vars("quantile")
        elif self.p.how == "sum":
            out = target.sum(**kw, min_count=1)
        else:
            out = getattr(target, self.p.how)(**kw)
        out.attrs = dict(x.attrs)
        if self.p.how == "sum" and out.attrs.get("affine") == "point":
            del out.attrs["affine"]                     # a sum of positions is neither (frames.express)
        return out
