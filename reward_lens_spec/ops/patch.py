"""patch and attribution_patch: intervene at the readout token and re-read the margin.

Grid: pair × layer × component, component ∈ {resid, attn, mlp} (resid =
``resid_post``). ``mode=denoise`` runs the rejected side with the chosen side's
activation patched in; ``noise`` the reverse. Quantities:
  effect    r_patched − r_base (reward units)
  restored  (r_patched − r_base) / (r_source − r_base)  (fraction; NaN for a zero margin)
``observable.layers``, ``observable.components`` and ``observable.pairs`` (first
N pairs) restrict the grid. ``positions: all`` (opt-in) patches every position
instead, allowed only for pairs whose sides tokenize to equal length: a
misaligned pair is an error, never a silent truncation. Exact patching re-runs only the readout token
against the cached prefix (see ``engine.patching``); attribution patching is
gradient × activation difference, first order, labelled approximate.
Both steps of one grid share one set of re-runs (memoised per run).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled

_COMP = {"resid": "resid_post", "attn": "attn_out", "mlp": "mlp_out"}


@dataclass(frozen=True)
class PatchParams:
    quantity: str = "effect"
    mode: str = "denoise"
    components: tuple = ("resid", "attn", "mlp")
    positions: str = "readout"      # "readout" | "all" (every position; sides must tokenize to equal length)


class _PatchBase(Operator):
    Params = PatchParams
    n_inputs = 0
    reruns = True
    per_pair = True                # observable.pairs counts from the run's first pair (chunks get their share)
    approximate = False
    restricted_by = ("layers", "components", "pairs")

    def _grid(self, info):
        comps = tuple(info.components) if info.components else tuple(self.p.components)
        layers = tuple(info.layers) if info.layers is not None else tuple(range(info.n_layers))
        return layers, comps

    def sites(self, info):
        return {_COMP[c] for c in self._grid(info)[1] if c in _COMP}

    def out_dims(self, in_dims, info, where):
        layers, comps = self._grid(info)
        for c in comps:
            if c not in _COMP:
                raise SpecError("observable.components", f"unknown component '{c}' for {self.name}.",
                                value=c, options=_COMP)
        bad = [l for l in layers if not 0 <= l < info.n_layers]
        if bad:
            raise SpecError("observable.layers", f"layer(s) {bad} out of range for {where}; "
                            f"valid range is 0..{info.n_layers - 1}.",
                            fix=f"set observable.layers to layers in 0..{info.n_layers - 1}, or drop it (every layer).")
        if self.p.quantity not in ("effect", "restored"):
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.",
                            value=self.p.quantity, options=["effect", "restored"])
        if self.p.positions not in ("readout", "all"):
            raise SpecError(where + ".positions", f"unknown position mode '{self.p.positions}'.",
                            value=self.p.positions, options=["readout", "all"])
        if self.p.positions == "all" and self.approximate:
            raise SpecError(where + ".positions", "attribution patching reads the readout position only.",
                            fix="use positions: readout, or op: patch (exact) for positions: all.")
        if self.p.mode not in ("denoise", "noise"):
            raise SpecError(where + ".mode", f"unknown mode '{self.p.mode}'.", value=self.p.mode,
                            options=["denoise", "noise"])
        return ("pair", "layer", "component") + (("objective",) if info.n_outputs > 1 else ())

    def gauge(self, in_gauges, info):
        return INVARIANT

    def _compute(self, ctx, targets, pidx):
        raise NotImplementedError

    def run(self, ctx):
        layers, comps = self._grid(ctx.info)
        n = len(ctx.encoded.pair_ids) if ctx.info.pairs is None else min(ctx.info.pairs, len(ctx.encoded.pair_ids))
        pidx = list(range(n))
        targets = [(_COMP[c], l) for l in layers for c in comps]
        key = (self.name, self.p.mode, self.p.positions, tuple(targets), n)
        if n == 0:                             # a chunk past observable.pairs: every pair stays NaN
            ctx.memo[key] = np.zeros((0, len(layers), len(comps), ctx.lm.head.n_outputs))
        if key not in ctx.memo:
            ctx.memo[key], counts = self._compute(ctx, targets, pidx)
            ctx.add_counts(self.name, counts)
        patched = ctx.memo[key].reshape(n, len(layers), len(comps), ctx.lm.head.n_outputs)
        base_side = 1 if self.p.mode == "denoise" else 0
        # W·h + b of the captured h (the patched rewards' read-off), not the model's own head output,
        # which differs by its rounding in bfloat16/float16
        gate = None if ctx.capture.gate is None else ctx.capture.gate[pidx]
        rewards = ctx.lm.head.rewards(ctx.capture.h[pidx], gate).astype(np.float64)  # (pair, side, output)
        base = rewards[:, base_side][:, None, None, :]
        src = rewards[:, 1 - base_side][:, None, None, :]
        data = patched if self.approximate else patched - base   # attribution returns the estimated effect
        if not self.approximate and self.p.positions == "readout":
            # patching an activation with a bitwise-identical one (e.g. a side into itself) is the identity
            # intervention: its effect is exactly 0, not the rerun's rounding against the capture
            same = np.stack([np.stack([np.all(ctx.capture.sites[_COMP[c]][pidx, 0, l] ==
                                              ctx.capture.sites[_COMP[c]][pidx, 1, l], axis=-1) for c in comps], -1)
                             for l in layers], 1)                                   # (pair, layer, component)
            data = np.where(same[..., None], 0.0, data)
        if self.p.quantity == "restored":
            with np.errstate(divide="ignore", invalid="ignore"):
                data = np.where(src != base, data / (src - base), np.nan)
        # pairs beyond observable.pairs stay NaN, so every variable of a run shares one pair axis
        n_all = len(ctx.encoded.pair_ids)
        full = np.full((n_all,) + data.shape[1:], np.nan)
        full[pidx] = data
        data = full
        coords = ctx.pair_coords()
        dims = ("pair", "layer", "component")
        if data.shape[-1] > 1:
            arr = xr.DataArray(data, dims=dims + ("objective",),
                               coords={**coords, "layer": list(layers), "component": list(comps),
                                       "objective": list(ctx.lm.head.objectives)})
        else:
            arr = xr.DataArray(data[..., 0], dims=dims, coords={**coords, "layer": list(layers), "component": list(comps)})
        units = "reward" if self.p.quantity == "effect" else "fraction"
        out = labelled(arr, units, INVARIANT, f"{self.p.mode} {'attribution ' if self.approximate else ''}patch "
                                                 f"{self.p.quantity} at the readout token")
        out.attrs["method"] = "approximate: gradient × activation difference" if self.approximate else "exact"
        return out


@OPERATORS.register
class Patch(_PatchBase):
    """Exact activation patching at the readout token (pair × layer × component)."""

    name = "patch"
    dims = "() → pair × layer × component [× objective]"

    def prefix_rows(self, info, n_pairs):
        if self.p.positions != "readout":
            return set()
        n = n_pairs if info.pairs is None else min(info.pairs, n_pairs)
        return {(p, 1 if self.p.mode == "denoise" else 0) for p in range(n)}

    def _compute(self, ctx, targets, pidx):
        from ..engine.patching import patch_all_positions, patch_readout
        if self.p.positions == "all":
            return patch_all_positions(ctx.lm, ctx.encoded, ctx.capture, targets, pidx, mode=self.p.mode)
        return patch_readout(ctx.lm, ctx.encoded, ctx.capture, targets, pidx, mode=self.p.mode)


@OPERATORS.register
class AttributionPatch(_PatchBase):
    """Attribution patching (gradient × activation difference; approximate)."""

    name = "attribution_patch"
    dims = "() → pair × layer × component [× objective]"
    approximate = True

    def _compute(self, ctx, targets, pidx):
        from ..engine.patching import attribution_patch
        return attribution_patch(ctx.lm, ctx.encoded, ctx.capture, targets, pidx, mode=self.p.mode)
