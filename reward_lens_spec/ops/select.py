"""select: pick coordinates along one dim (``index: last|first|<int>`` drops the dim; ``values`` keeps it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import SpecError
from ..registries import OPERATORS
from .base import Operator, need_dim, without


@dataclass(frozen=True)
class SelectParams:
    dim: str
    index: Optional[Any] = None      # "last" | "first" | integer position
    values: Optional[list] = None    # coordinate labels to keep


@OPERATORS.register
class Select(Operator):
    """Select along a dim by position (dim dropped) or by labels (dim kept)."""

    name = "select"
    per_pair = True
    dims = "x (…, dim, …) → without dim (index) or same dims (values)"
    Params = SelectParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], self.p.dim, where, "the dim to select along", param="dim")
        if (self.p.index is None) == (self.p.values is None):
            raise SpecError(where, "give exactly one of 'index' or 'values'.")
        if self.p.index is not None and not (self.p.index in ("last", "first") or isinstance(self.p.index, int)):
            raise SpecError(where + ".index", f"index must be last, first or an integer, got {self.p.index!r}.")
        return without(in_dims[0], self.p.dim) if self.p.index is not None else in_dims[0]

    def run(self, ctx, x):
        if self.p.values is not None:
            out = x.sel({self.p.dim: list(self.p.values)})
        else:
            pos = {"last": -1, "first": 0}.get(self.p.index, self.p.index)
            out = x.isel({self.p.dim: pos}, drop=True)
        out.attrs = dict(x.attrs)
        return out
