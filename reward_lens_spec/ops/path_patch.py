"""path_patch: split a sender's patch effect at the readout token into its direct and indirect paths.

Grid: pair × layer × component (attn, mlp senders) × path. With ``Δa`` = the sender's output at the
readout token, source side minus base side (``mode=denoise``: base = rejected), ``x`` the base
side's last residual (final-norm input) and ``x'`` that residual when the sender is patched
(everything downstream recomputed), ``r(x) = W·N(x) + b``:
  total     r(x') − r(x)              exact activation patching of the sender (as ``patch``)
  direct    r(x + Δa) − r(x)          sender → readout only: every other component frozen at its
                                      base value (path patching, Wang et al. 2022, "Interpretability
                                      in the Wild"; Goldowsky-Dill et al. 2023, "Localizing Model
                                      Behavior with Path Patching")
  indirect  r(x' − Δa) − r(x)         sender → later components → readout, its own direct write blocked
The direct path needs no forward (the final norm and head in closed form, ``FinalNorm.apply``); the
total and indirect paths share one batched re-run of readout-token copies
(``engine.interventions.set_readout``). ``total`` ≠ ``direct + indirect`` in general (the final norm
is not linear). Units: reward. Gauge: invariant. ``observable.layers``/``components``/``pairs`` restrict it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..registries import OPERATORS
from ._grid import choice, first_pairs, grid_layers, need_site, objective_dims, result
from .base import INVARIANT, Operator

_COMP = {"attn": "attn_out", "mlp": "mlp_out"}
PATHS = ("total", "direct", "indirect")


@dataclass(frozen=True)
class PathPatchParams:
    mode: str = "denoise"
    components: tuple = ("attn", "mlp")


@OPERATORS.register
class PathPatch(Operator):
    """Direct vs indirect path of each attn/mlp sender's patch effect on the reward (pair × layer × component × path)."""

    name = "path_patch"
    dims = "() → pair × layer × component × path [× objective]"
    per_pair = True                # re-runs each pair's readout token over its own cached prefix
    Params = PathPatchParams
    n_inputs = 0
    reruns = True

    def _comps(self, info):
        return tuple(c for c in (info.components or self.p.components) if c in _COMP) or tuple(self.p.components)

    def sites(self, info):
        return {_COMP[c] for c in self._comps(info)} | {"resid_post"}

    def prefix_rows(self, info, n_pairs):
        n = n_pairs if info.pairs is None else min(info.pairs, n_pairs)
        return {(p, 1 if self.p.mode == "denoise" else 0) for p in range(n)}

    def out_dims(self, in_dims, info, where):
        grid_layers(info, where)
        choice(self.p.mode, ("denoise", "noise"), where + ".mode")
        for c in self._comps(info):
            choice(c, tuple(_COMP), "observable.components")
            need_site(info, _COMP[c], where)
        return ("pair", "layer", "component", "path") + objective_dims(info)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        from ..engine.interventions import set_readout
        layers, pidx, comps = grid_layers(ctx.info, self.name), first_pairs(ctx), self._comps(ctx.info)
        b = 1 if self.p.mode == "denoise" else 0
        cap, lm = ctx.capture, ctx.lm
        targets = [(_COMP[c], l, 0) for l in layers for c in comps]
        key = (self.name, self.p.mode, tuple(targets), len(pidx))
        if key not in ctx.memo:
            _, counts, xp = set_readout(lm, ctx.encoded, cap, targets,
                                        lambda t, pairs: cap.sites[targets[t][0]][pairs, 1 - b, targets[t][1]],
                                        pidx, base_side=b, keep_final=True)
            ctx.add_counts(self.name, counts)
            ctx.memo[key] = xp                                             # pair × target × d_model
        xp = ctx.memo[key].astype(np.float64)
        x = cap.sites["resid_post"][pidx, b, lm.n_layers - 1].astype(np.float64)[:, None]   # pair × 1 × d
        da = np.stack([cap.sites[s][pidx, 1 - b, l] - cap.sites[s][pidx, b, l] for s, l, _ in targets], 1)
        r = lambda y: lm.head.rewards(lm.norm.apply(y)).astype(np.float64)   # noqa: E731  (…, output)
        base = lm.head.rewards(cap.h[pidx, b]).astype(np.float64)[:, None]
        data = np.stack([r(xp) - base, r(x + da) - base, r(xp - da) - base], 2)   # pair × target × path × out
        # a sender patched with a bitwise-identical activation (e.g. a side into itself) is the identity
        # intervention: every path's effect is exactly 0, not rounding against the capture (as ``patch``)
        same = np.stack([np.all(cap.sites[s][pidx, 1 - b, l] == cap.sites[s][pidx, b, l], axis=-1)
                         for s, l, _ in targets], 1)                        # pair × target
        data = np.where(same[:, :, None, None], 0.0, data)
        data = data.reshape(len(pidx), len(layers), len(comps), len(PATHS), -1)
        out = result(ctx, data, pidx, ("layer", "component", "path"),
                     {"layer": list(layers), "component": list(comps), "path": list(PATHS)}, "reward",
                     f"{self.p.mode} path patching at the readout token: total, direct and indirect paths")
        return out
