"""ablate_rescue: ablate a site at the readout token, then restore exactly its activation; re-read the margin.

Grid: pair × layer × component|head, as ``ablate`` (same ``mode``: zero | mean | resample, same
``over``, ``seed``, ``observable.layers/components/pairs``). Two re-runs per target and side:
  ablated   the site's activation at the readout token replaced (``ablate``'s values)
  rescued   the same site set back to its clean activation from the capture pass (the ablated
            component's own activation, restored at the hook that ablated it): one extra forward
With Δ = r_chosen − r_rejected (reward units; b cancels) from the capture's ``W·h + b``:
  effect          Δ_ablated − Δ                      (reward units; what ``ablate`` reports)
  rescued_effect  Δ_rescued − Δ                      (reward units; the perturbation's own damage:
                                                     0 up to float rounding when the intervention
                                                     touches nothing but the ablated activation)
  rescue_fraction (Δ_rescued − Δ_ablated) / (Δ − Δ_ablated)   (fraction; NaN where the ablation
                                                     moves no margin)
So a knock-out's effect is separated from the damage of the perturbation itself: a rescue fraction
of 1 says the whole effect went through the ablated activation. Exact identity: restoring the very
component ablated gives the clean margin to float tolerance (``tests/test_rescue.py``).
Source: knock-out and rescue (the lesion/rescue logic of causal mediation; Vig et al. 2020,
"Causal mediation analysis for interpreting neural NLP"; Heimersheim & Nanda 2024 for the ablations).
Errors: ``SpecError`` for an unknown ``quantity``, ``mode``, ``over`` or component (plan time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..registry import register
from ._grid import choice, first_pairs, grid_layers, result
from .ablate import Ablate, AblateParams

QUANTITIES = ("effect", "rescued_effect", "rescue_fraction")


@dataclass(frozen=True)
class AblateRescueParams(AblateParams):
    quantity: str = "rescue_fraction"


@register
class AblateRescue(Ablate):
    """Ablation then rescue (the ablated activation restored) at the readout token (pair × layer × component|head)."""

    name = "ablate_rescue"
    dims = "() → pair × layer × component|head [× objective]"
    Params = AblateRescueParams
    restricted_by = ("layers", "components", "pairs")

    def out_dims(self, in_dims, info, where):
        choice(self.p.quantity, QUANTITIES, where + ".quantity")
        return super().out_dims(in_dims, info, where)

    def _clean(self, ctx, targets):
        """``values(t, pairs, side)``: the captured clean activation of target ``t`` (the rescue)."""
        from ..models.interventions import head_dim
        hd = head_dim(ctx.lm) if self.p.over == "head" else None

        def values(t, pairs, side):
            site, l, h = targets[t]
            a = self._acts(ctx, site)[pairs, side, l]
            return a if hd is None else a[..., h * hd:(h + 1) * hd]
        return values

    def _margins(self, ctx, targets, vf, pidx):
        from ..models.interventions import set_readout
        r = []
        for side in (0, 1):
            got, counts = set_readout(ctx.lm, ctx.encoded, ctx.capture, targets,
                                      lambda t, pairs, side=side: vf(t, pairs, side), pidx, base_side=side)
            ctx.add_counts(self.name, counts)
            r.append(got)
        return r[0] - r[1]                                                    # pair × target × output

    def run(self, ctx):
        layers, pidx = grid_layers(ctx.info, self.name), first_pairs(ctx)
        targets, names = self._targets(ctx, layers)
        key = (self.name, self.p.mode, self.p.over, self.p.seed, tuple(targets), len(pidx))
        if key not in ctx.memo:
            ctx.memo[key] = (self._margins(ctx, targets, self.values(ctx, targets), pidx),
                             self._margins(ctx, targets, self._clean(ctx, targets), pidx))
        ablated, rescued = ctx.memo[key]
        rewards = ctx.lm.head.rewards(ctx.capture.h[pidx]).astype(np.float64)
        clean = (rewards[:, 0] - rewards[:, 1])[:, None]
        if self.p.quantity == "effect":
            data, units = ablated - clean, "reward"
        elif self.p.quantity == "rescued_effect":
            data, units = rescued - clean, "reward"
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                data = np.where(ablated != clean, (rescued - ablated) / (clean - ablated), np.nan)
            units = "fraction"
        data = data.reshape(len(pidx), len(layers), len(names), -1)
        out = result(ctx, data, pidx, ("layer", self.p.over), {"layer": list(layers), self.p.over: names}, units,
                     f"{self.p.mode} ablation with rescue at the readout token: {self.p.quantity}")
        out.attrs.update(mode=self.p.mode, quantity=self.p.quantity)
        return out
