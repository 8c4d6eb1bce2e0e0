"""ablate: replace one site's activation at the readout token on both sides, re-read the margin.

Grid: pair × layer × component (component ∈ {resid, attn, mlp}, ``over: component``) or
pair × layer × head (head h's slice of the o_proj input, ``over: head``) — the sites the patch
grids know. ``mode``:
  zero      the activation is set to 0
  mean      set to its mean over the run's dataset: every pair, both sides, at the readout token
  resample  set to a donor's activation: for each (pair, side) a donor side drawn uniformly from
            the other pairs' sides (``seed``; the same donor at every site). Needs ≥ 2 pairs.
Output ``effect`` = Δ_ablated − Δ, with Δ = r_chosen − r_rejected (reward units; b cancels).
Sources: zero/mean ablation (Heimersheim & Nanda 2024, "How to use and interpret activation
patching"); resample ablation (Chan et al. 2022, "Causal scrubbing"). Exact: both sides re-run
copies of the readout token over the cached prefix (``engine.interventions.set_readout``).
``observable.layers``, ``observable.components`` and ``observable.pairs`` restrict the grid.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice, first_pairs, grid_layers, need_site, objective_dims, result
from .base import INVARIANT, Operator

COMPONENT_SITES = {"resid": "resid_post", "attn": "attn_out", "mlp": "mlp_out"}
MODES = ("zero", "mean", "resample")


@dataclass(frozen=True)
class AblateParams:
    mode: str = "mean"
    over: str = "component"        # "component" | "head"
    components: tuple = ("resid", "attn", "mlp")
    seed: int = 0


def resample_donors(n_pairs: int, seed: int) -> np.ndarray:
    """Donor ``(pair, side)`` per ``(pair, side)``: int array (pair, side, 2), donor pair ≠ pair (PCG64)."""
    if n_pairs < 2:
        raise SpecError("observable.steps.mode", "resample ablation needs at least 2 pairs (a donor must "
                        "come from another pair).", fix="add pairs, or use mode: mean | zero.")
    rng = np.random.Generator(np.random.PCG64(seed))
    p = np.arange(n_pairs)[:, None]
    donor = (p + 1 + rng.integers(0, n_pairs - 1, size=(n_pairs, 2))) % n_pairs
    return np.stack([donor, rng.integers(0, 2, size=(n_pairs, 2))], -1)


@OPERATORS.register
class Ablate(Operator):
    """Zero, mean or resample ablation at the readout token; effect on the margin (pair × layer × component|head)."""

    name = "ablate"
    dims = "() → pair × layer × component|head [× objective]"
    per_pair = True
    needs_all_pairs = True         # mean / resample read every pair's capture: the run is one chunk
    Params = AblateParams
    n_inputs = 0
    reruns = True

    def _comps(self, info):
        return tuple(info.components) if info.components else tuple(self.p.components)

    def sites(self, info):
        if self.p.over == "head":
            return {"attn_z"}
        return {COMPONENT_SITES[c] for c in self._comps(info) if c in COMPONENT_SITES}

    def prefix_rows(self, info, n_pairs):
        n = n_pairs if info.pairs is None else min(info.pairs, n_pairs)
        return {(p, s) for p in range(n) for s in (0, 1)}

    def out_dims(self, in_dims, info, where):
        grid_layers(info, where)
        choice(self.p.mode, MODES, where + ".mode")
        choice(self.p.over, ("component", "head"), where + ".over")
        if self.p.over == "component":
            for c in self._comps(info):
                choice(c, tuple(COMPONENT_SITES), "observable.components")
        for s in self.sites(info):
            need_site(info, s, where)
        return ("pair", "layer", self.p.over) + objective_dims(info)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def _targets(self, ctx, layers):
        if self.p.over == "head":
            from ..engine.attn_heads import n_heads
            H = n_heads(ctx.lm.model.config)
            return [("head", l, h) for l in layers for h in range(H)], list(range(H))
        comps = self._comps(ctx.info)
        return [(COMPONENT_SITES[c], l, 0) for l in layers for c in comps], list(comps)

    def _acts(self, ctx, site):
        """(pair, side, layer, width) activations at the readout token for ``site``."""
        return ctx.capture.sites["attn_z" if site == "head" else site]

    def values(self, ctx, targets):
        """``values(t, pairs, side)``: the replacement activations, (len(pairs), width)."""
        from ..engine.interventions import head_dim
        hd = head_dim(ctx.lm) if self.p.over == "head" else None
        donors = resample_donors(len(ctx.encoded.pair_ids), self.p.seed) if self.p.mode == "resample" else None

        def values(t, pairs, side):
            site, l, h = targets[t]
            a = self._acts(ctx, site)[:, :, l]
            if hd is not None:
                a = a[..., h * hd:(h + 1) * hd]
            if self.p.mode == "zero":
                return np.zeros((len(pairs), a.shape[-1]), np.float32)
            if self.p.mode == "mean":
                m = a.astype(np.float64).mean((0, 1))
                return np.broadcast_to(m, (len(pairs), m.size))
            d = donors[pairs, side]
            return a[d[:, 0], d[:, 1]]
        return values

    def run(self, ctx):
        from ..engine.interventions import set_readout
        layers, pidx = grid_layers(ctx.info, self.name), first_pairs(ctx)
        targets, names = self._targets(ctx, layers)
        key = (self.name, self.p.mode, self.p.seed, tuple(targets), len(pidx))
        if key not in ctx.memo:
            vf = self.values(ctx, targets)
            r = []
            for side in (0, 1):
                got, counts = set_readout(ctx.lm, ctx.encoded, ctx.capture, targets,
                                          lambda t, pairs, side=side: vf(t, pairs, side), pidx, base_side=side)
                ctx.add_counts(self.name, counts)
                r.append(got)
            ctx.memo[key] = r[0] - r[1]                                   # ablated margin, pair × target × output
        rewards = ctx.lm.head.rewards(ctx.capture.h[pidx]).astype(np.float64)
        margin = (rewards[:, 0] - rewards[:, 1])[:, None]
        data = (ctx.memo[key] - margin).reshape(len(pidx), len(layers), len(names), -1)
        return result(ctx, data, pidx, ("layer", self.p.over), {"layer": list(layers), self.p.over: names},
                      "reward", f"{self.p.mode} ablation effect on the margin at the readout token")
