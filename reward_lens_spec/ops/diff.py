"""diff: chosen minus rejected along ``side`` — the pair-shaped move every margin starts from.

Under Bradley–Terry only differences are identified, so the head bias and any
constant shift cancel here. Gauge is kept (a difference of activations is
still in the activations' frame).
"""
from __future__ import annotations

from ..registries import OPERATORS
from .base import NoParams, Operator, need_dim, without


@OPERATORS.register
class Diff(Operator):
    """Chosen − rejected over the side dim (side dim dropped)."""

    name = "diff"
    per_pair = True
    dims = "x (…, side, …) → x without side"
    Params = NoParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "side", where, "chosen minus rejected")
        return without(in_dims[0], "side")

    def run(self, ctx, x):
        out = x.sel(side="chosen", drop=True) - x.sel(side="rejected", drop=True)
        out.attrs = dict(x.attrs)
        if "affine" in out.attrs:
            out.attrs["affine"] = "vector"              # point − point is a displacement
        return out
