"""combine and scale: element-wise arithmetic between steps, or by a constant.

combine: ``input <how> other`` with how ∈ {add, sub, mul, div} (xarray
broadcasting by dim name; e.g. a per-component sum divided by the margin gives
each component's share). scale: ``input / by`` where ``by`` is a number or
``n_layers`` (e.g. crystallization layer → fraction of depth).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..registries import OPERATORS
from .base import Operator

# point ± vector is a point, point − point a vector, vector ± vector a vector (frames.express)
_AFFINE = {("sub", "point", "point"): "vector", ("sub", "point", "vector"): "point", ("add", "point", "vector"): "point",
           ("add", "vector", "point"): "point", ("add", "vector", "vector"): "vector", ("sub", "vector", "vector"): "vector"}
_HOW = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


@dataclass(frozen=True)
class CombineParams:
    other: str
    how: str = "div"
    units: str = ""


@OPERATORS.register
class Combine(Operator):
    """Element-wise input (add|sub|mul|div) another step, broadcasting by dim name."""

    name = "combine"
    per_pair = True
    dims = "x, other → x's dims + other's extra dims (broadcast by name)"
    Params = CombineParams
    extra_inputs = ("other",)

    def out_dims(self, in_dims, info, where):
        if self.p.how not in _HOW:
            raise SpecError(where + ".how", f"unknown operation '{self.p.how}'.", value=self.p.how, options=_HOW)
        return in_dims[0] + tuple(d for d in in_dims[1] if d not in in_dims[0])

    def gauge(self, in_gauges, info):
        return in_gauges[0] if in_gauges[0] == in_gauges[1] else "mixed:" + "|".join(sorted(set(in_gauges)))

    def run(self, ctx, x, y):
        out = _HOW[self.p.how](x, y)
        units = self.p.units or (x.attrs.get("units", "") if self.p.how in ("add", "sub") else
                                 f"{x.attrs.get('units', '')}{'·' if self.p.how == 'mul' else '/'}{y.attrs.get('units', '')}")
        out.attrs = {"units": units, "gauge": self.gauge([x.attrs.get("gauge"), y.attrs.get("gauge")], None)}
        affine = _AFFINE.get((self.p.how, x.attrs.get("affine"), y.attrs.get("affine")))
        if affine:
            out.attrs["affine"] = affine
        return out


@dataclass(frozen=True)
class ScaleParams:
    by: Any
    units: str = ""


@OPERATORS.register
class Scale(Operator):
    """Divide by a constant or by the model's n_layers."""

    name = "scale"
    per_pair = True
    dims = "x → same dims"
    Params = ScaleParams

    def out_dims(self, in_dims, info, where):
        if not (self.p.by == "n_layers" or (isinstance(self.p.by, (int, float)) and self.p.by != 0)):
            raise SpecError(where + ".by", f"must be a non-zero number or 'n_layers', got {self.p.by!r}.",
                            fix="e.g. by: 2, or by: n_layers.")
        return in_dims[0]

    def run(self, ctx, x):
        by = ctx.info.n_layers if self.p.by == "n_layers" else self.p.by
        out = x / by
        out.attrs = {**x.attrs, "units": self.p.units or x.attrs.get("units", "")}
        if out.attrs.get("affine") == "point":
            del out.attrs["affine"]                     # a scaled position is neither (frames.express)
        return out
