"""mean_direction: the mean chosen − rejected difference of an activation, a fitted direction.

Input: an activation with ``pair``, ``side`` and ``d_model`` dims (e.g. ``capture``), any others
(``layer``, ``component``) kept. Output: ``mean over pairs of (x_chosen − x_rejected)``, dims the
input's minus ``pair`` and ``side``; with ``by: <pair coord>`` (e.g. ``dimension``) one mean per
group, ``by`` replacing ``pair``. ``normalize: true`` scales each direction to unit norm. The
difference-of-means direction (e.g. Marks & Tegmark 2023, "The Geometry of Truth"; Arditi et al.
2024, refusal directions). Units: activation. Gauge: the input's frame (a direction is basis-dependent);
``affine`` attr ``vector`` (a difference of points).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import Operator, labelled, need_dim, without


@dataclass(frozen=True)
class MeanDirectionParams:
    by: Optional[str] = None
    normalize: bool = False


@OPERATORS.register
class MeanDirection(Operator):
    """Mean of x_chosen − x_rejected over pairs (optionally per group): a d_model direction."""

    name = "mean_direction"
    dims = "x (pair × side × … × d_model) → [by ×] … × d_model"
    Params = MeanDirectionParams

    def out_dims(self, in_dims, info, where):
        for d in ("pair", "side", "d_model"):
            need_dim(in_dims[0], d, where, "a per-pair, per-side activation")
        out = without(in_dims[0], "pair", "side")
        return ((self.p.by,) if self.p.by else ()) + out

    def run(self, ctx, x):
        diff = (x.sel(side="chosen", drop=True) - x.sel(side="rejected", drop=True)).astype(np.float64)
        if self.p.by:
            if self.p.by not in diff.coords or diff.coords[self.p.by].dims != ("pair",):
                raise SpecError("observable.steps.by", f"'{self.p.by}' is not a pair coordinate.",
                                options=[c for c, v in diff.coords.items() if v.dims == ("pair",)])
            out = diff.groupby(self.p.by).mean("pair")
        else:
            out = diff.mean("pair")
        out = out.drop_vars([c for c, v in out.coords.items() if "pair" in v.dims], errors="ignore")
        if self.p.normalize:
            out = out / np.sqrt((out ** 2).sum("d_model"))
        out = labelled(xr.DataArray(out), "activation", x.attrs.get("gauge", ctx.info.native_frame),
                       "mean chosen − rejected difference" + (" (unit norm)" if self.p.normalize else ""))
        out.attrs["affine"] = "vector"
        return out
