"""patch_heads and attribution_patch_heads: activation patching per attention head at the readout token.

Grid: pair × layer × head. ``mode=denoise`` runs the rejected side with head h's slice of
layer l's o_proj input ``z_h`` (captured site ``attn_z``) swapped for the chosen side's;
``noise`` the reverse. Quantities, as for ``patch``:
  effect    r_patched − r_base (reward units)
  restored  (r_patched − r_base) / (r_source − r_base)  (fraction; NaN for a zero margin)
Exact patching re-runs copies of the readout token over the cached prefix, one copy per
(layer, head), batched like the component grid (``engine.interventions.set_readout``).
Attribution is ``∇_{z_h} r_base · Δz_h`` (gradient × difference, approximate); summed over
heads it equals ``attribution_patch``'s attn effect (o_proj is affine). Exact per-head effects
need not sum to the attn effect (heads interact through later layers and the final norm).
Source: Elhage et al. 2021 (per-head writes); Heimersheim & Nanda 2024 (activation patching);
Syed et al. 2023 (attribution patching). ``observable.layers`` and ``observable.pairs`` restrict it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..registries import OPERATORS
from ._grid import choice, first_pairs, grid_layers, need_site, objective_dims, result
from .base import INVARIANT, Operator


@dataclass(frozen=True)
class HeadPatchParams:
    quantity: str = "effect"
    mode: str = "denoise"


class _HeadPatchBase(Operator):
    Params = HeadPatchParams
    per_pair = True                # re-runs each pair's readout token over its own cached prefix
    n_inputs = 0
    reruns = True
    approximate = False

    def sites(self, info):
        return {"attn_z"}

    def out_dims(self, in_dims, info, where):
        grid_layers(info, where)
        need_site(info, "attn_z", where)
        choice(self.p.quantity, ("effect", "restored"), where + ".quantity")
        choice(self.p.mode, ("denoise", "noise"), where + ".mode")
        return ("pair", "layer", "head") + objective_dims(info)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        from ..engine.attn_heads import n_heads
        layers, pidx = grid_layers(ctx.info, self.name), first_pairs(ctx)
        H = n_heads(ctx.lm.model.config)
        key = (self.name, self.p.mode, layers, len(pidx))
        if key not in ctx.memo:
            ctx.memo[key], counts = self._compute(ctx, layers, H, pidx)
            ctx.add_counts(self.name, counts)
        data = ctx.memo[key]                                            # pair × layer × head × output
        base_side = 1 if self.p.mode == "denoise" else 0
        rewards = ctx.lm.head.rewards(ctx.capture.h[pidx]).astype(np.float64)
        base, src = rewards[:, base_side][:, None, None], rewards[:, 1 - base_side][:, None, None]
        if not self.approximate:
            data = data - base
            # patching a head slice with a bitwise-identical one (e.g. a side into itself) is the identity
            # intervention: its effect is exactly 0, not the rerun's rounding against the capture (as ``patch``)
            from ..engine.interventions import head_dim
            hd, z = head_dim(ctx.lm), ctx.capture.sites["attn_z"]
            zl = z[pidx][:, :, list(layers)]                                # pair × side × layer × H·hd
            zl = zl.reshape(zl.shape[:3] + (H, hd))
            same = np.all(zl[:, 0] == zl[:, 1], axis=-1)                   # pair × layer × head
            data = np.where(same[..., None], 0.0, data)
        if self.p.quantity == "restored":
            with np.errstate(divide="ignore", invalid="ignore"):
                data = np.where(src != base, data / (src - base), np.nan)
        return result(ctx, data, pidx, ("layer", "head"), {"layer": list(layers), "head": np.arange(H)},
                      "reward" if self.p.quantity == "effect" else "fraction",
                      f"{self.p.mode} {'attribution ' if self.approximate else ''}head patch {self.p.quantity} "
                      "at the readout token",
                      "approximate: gradient × activation difference" if self.approximate else "exact")


@OPERATORS.register
class PatchHeads(_HeadPatchBase):
    """Exact activation patching of each head's o_proj input at the readout token (pair × layer × head)."""

    name = "patch_heads"
    dims = "() → pair × layer × head [× objective]"

    def prefix_rows(self, info, n_pairs):
        n = n_pairs if info.pairs is None else min(info.pairs, n_pairs)
        return {(p, 1 if self.p.mode == "denoise" else 0) for p in range(n)}

    def _compute(self, ctx, layers, H, pidx):
        from ..engine.interventions import head_dim, set_readout
        base_side = 1 if self.p.mode == "denoise" else 0
        hd, z = head_dim(ctx.lm), ctx.capture.sites["attn_z"]
        targets = [("head", l, h) for l in layers for h in range(H)]

        def values(t, pairs):
            _, l, h = targets[t]
            return z[pairs, 1 - base_side, l, h * hd:(h + 1) * hd]
        r, counts = set_readout(ctx.lm, ctx.encoded, ctx.capture, targets, values, pidx, base_side=base_side)
        return r.reshape(len(pidx), len(layers), H, -1), counts


@OPERATORS.register
class AttributionPatchHeads(_HeadPatchBase):
    """Attribution patching per head (gradient × o_proj-input difference; approximate)."""

    name = "attribution_patch_heads"
    dims = "() → pair × layer × head [× objective]"
    approximate = True

    def _compute(self, ctx, layers, H, pidx):
        from ..engine.interventions import head_attribution
        return head_attribution(ctx.lm, ctx.encoded, ctx.capture, layers, pidx, mode=self.p.mode)
