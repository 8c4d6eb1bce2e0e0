"""leace_eraser: the LEACE eraser itself, stored so it can be exported and applied (``reward-lens-spec export
what=erase``, ``model.interventions``).

Input: readout-token activations with ``pair``, ``side``, ``d_model`` (and ``layer``, picked by ``layer``),
e.g. ``{op: capture, site: resid_post}``. The eraser r(x) = x − (x − μ)Eᵀ, E = W⁺PW, is fitted exactly as
``leace`` and ``leace_certificate`` fit it (same ``concept``, ``tokens``, ``fit_fraction``, ``seed``: same split,
same closed form, float64; ``ops._leace``; Belrose et al. 2023, "LEACE", Thm. 4.3). ``part``: ``mean`` → μ,
dims ``d_in`` (activation units); ``projection`` → E, dims ``d_out`` × ``d_in`` (fraction: a projection). Both
are in the model's native basis and keep its frame label; their dims are not ``d_model``, so no run frame
re-expresses them (an eraser is applied where it was fitted). Attrs: ``layer``, ``concept``, ``n_fit`` (pairs),
``classes``. Gauge: the input's frame. Errors: ``SpecError`` as ``leace`` (concept, layer, fit_fraction, a fit
split with fewer than two classes) and for an input without those dims.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import xarray as xr

from ..registry import register
from ._grid import choice
from ._leace import FIELDS
from .base import Operator, labelled
from .leace import check_readout_input, readout_eraser


@dataclass(frozen=True)
class LeaceEraserParams:
    layer: Optional[int] = None
    concept: str = "dimension"
    tokens: tuple = ()
    fit_fraction: float = 0.5
    seed: int = 0
    part: str = "projection"          # projection | mean


@register
class LeaceEraser(Operator):
    """The LEACE eraser fitted on one split: its projection E (d_out × d_in) or its mean μ (d_in)."""

    name = "leace_eraser"
    dims = "x (pair × side × [layer ×] d_model) → d_out × d_in (projection) | d_in (mean)"
    Params = LeaceEraserParams
    pair_fields = FIELDS

    def out_dims(self, in_dims, info, where):
        check_readout_input(self.p, in_dims[0], info, where)
        choice(self.p.part, ("projection", "mean"), where + ".part")
        return ("d_out", "d_in") if self.p.part == "projection" else ("d_in",)

    def gauge(self, in_gauges, info):
        return in_gauges[0] if in_gauges else info.native_frame

    def run(self, ctx, x):
        p = self.p
        _, _, fit, y, mu, E = readout_eraser(ctx, p, x)
        if p.part == "projection":
            out = labelled(xr.DataArray(E, dims=("d_out", "d_in")), "fraction", x.attrs.get("gauge", ctx.info.native_frame),
                           f"LEACE projection E of '{p.concept}' (r(x) = x − (x − μ)Eᵀ)")
        else:
            out = labelled(xr.DataArray(mu, dims=("d_in",)), "activation", x.attrs.get("gauge", ctx.info.native_frame),
                           f"LEACE mean μ of the fit split for '{p.concept}'")
        out.attrs.update(layer=-1 if p.layer is None else int(p.layer), concept=p.concept, n_fit=int(fit.sum()),
                         classes=[str(c) for c in np.unique(y[fit])],
                         method="LEACE closed form (Belrose et al. 2023), float64")
        return out
