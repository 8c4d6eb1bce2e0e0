"""capture: activations at the readout token, from the run's one shared capture pass.

Sites (TransformerLens vocabulary):
  readout     final-norm output h            pair × side × d_model
  resid       embed, then resid_post[l]      pair × side × layer × d_model   (layer −1 = embedding)
  components  what each component wrote      pair × side × layer × component × d_model
              (component ∈ {embed, attn, mlp}; NaN where a layer has no such component; a model
              with ``resid_post`` interventions (``model.interventions``) has a fourth, ``intervention``:
              what they add to a layer's output, NaN at the layers they leave alone; so the
              components still sum to the last residual. An ``attn_out``/``mlp_out`` intervention
              is part of what that block wrote)
  heads       what each attention head wrote pair × side × layer × head × d_model
              (see ``engine.attn_heads``; Σ over heads = attn_out minus any o_proj bias)
  resid_pre | resid_post | attn_out | mlp_out                pair × side × layer × d_model
Gauge: activations live in the model's native frame (``frame:native:<model>``). ``affine`` attr:
``point`` for positions in the residual stream (readout, resid*), ``vector`` for what components
wrote (components, heads, attn_out, mlp_out); ``frames.express`` centres points only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..arrays import new_array
from ..errors import SpecError
from ..models.artifacts import resid_layers
from ..registries import OPERATORS
from .base import Operator, labelled

_SITES = ("readout", "resid", "components", "heads", "resid_pre", "resid_post", "attn_out", "mlp_out")
_WRITES = ("components", "heads", "attn_out", "mlp_out")
_RUNTIME = {"readout": set(), "resid": {"embed", "resid_post"}, "components": {"embed", "attn_out", "mlp_out", "intervention"},
            "heads": {"attn_z"}}


@dataclass(frozen=True)
class CaptureParams:
    site: str


@OPERATORS.register
class Capture(Operator):
    """Activations at the readout token at one site (pair × side × [layer ×] d_model)."""

    name = "capture"
    per_pair = True
    dims = "() → pair × side × d_model (readout) | pair × side × layer × d_model | + component (components) | + head (heads)"
    Params = CaptureParams
    n_inputs = 0

    def sites(self, info):
        return _RUNTIME.get(self.p.site, {self.p.site})

    def out_dims(self, in_dims, info, where):
        site = self.p.site
        if site not in _SITES:
            raise SpecError(where + ".site", f"unknown site '{site}'.", value=site, options=_SITES)
        for s in self.sites(info):
            if s not in ("embed", "intervention") and not info.family.has_site(s):
                raise SpecError(where + ".site", f"model family '{info.family.name}' has no site '{s}'.",
                                options=info.family.sites)
        if site == "readout":
            return ("pair", "side", "d_model")
        if site == "components":
            return ("pair", "side", "layer", "component", "d_model")
        if site == "heads":
            return ("pair", "side", "layer", "head", "d_model")
        return ("pair", "side", "layer", "d_model")

    def gauge(self, in_gauges, info):
        return info.native_frame

    def run(self, ctx):
        cap, site = ctx.capture, self.p.site
        coords = ctx.pair_coords()
        side = ["chosen", "rejected"]
        if site == "readout":
            arr = new_array(cap.h, ("pair", "side", "d_model"), {**coords, "side": side})
        elif site == "resid":
            data = np.concatenate([cap.sites["embed"], cap.sites["resid_post"]], axis=2)
            arr = xr.DataArray(data, dims=("pair", "side", "layer", "d_model"),
                               coords={**coords, "side": side, "layer": np.arange(-1, data.shape[2] - 1)})
        elif site == "components":
            L = cap.sites["attn_out"].shape[2]
            n, _, _, d = cap.sites["attn_out"].shape
            written = resid_layers(getattr(ctx.lm, "interventions", None)) if "intervention" in cap.sites else ()
            comps = ["embed", "attn", "mlp"] + (["intervention"] if written else [])
            data = np.full((n, 2, L + 1, len(comps), d), np.nan, np.float32)
            data[:, :, 0, 0] = cap.sites["embed"][:, :, 0]
            data[:, :, 1:, 1] = cap.sites["attn_out"]
            data[:, :, 1:, 2] = cap.sites["mlp_out"]
            for k, l in enumerate(written):
                data[:, :, l + 1, 3] = cap.sites["intervention"][:, :, k]
            unit = np.array([[("embed" if l < 0 else "") if c == "embed" else
                              (f"{c}_L{l}" if l >= 0 and (c != "intervention" or l in written) else "")
                              for c in comps] for l in range(-1, L)], dtype=object).astype(str)
            arr = xr.DataArray(data, dims=("pair", "side", "layer", "component", "d_model"),
                               coords={**coords, "side": side, "layer": np.arange(-1, L),
                                       "component": comps, "unit": (("layer", "component"), unit)})
        elif site == "heads":
            from ..engine.attn_heads import head_contributions
            data = head_contributions(ctx.lm, cap.sites["attn_z"])
            arr = xr.DataArray(data, dims=("pair", "side", "layer", "head", "d_model"),
                               coords={**coords, "side": side, "layer": np.arange(data.shape[2]),
                                       "head": np.arange(data.shape[3])})
        else:
            data = cap.sites[site]
            arr = xr.DataArray(data, dims=("pair", "side", "layer", "d_model"),
                               coords={**coords, "side": side, "layer": np.arange(data.shape[2])})
        out = labelled(arr, "activation", ctx.info.native_frame, f"{site} at the readout token")
        out.attrs["affine"] = "vector" if site in _WRITES else "point"
        return out
