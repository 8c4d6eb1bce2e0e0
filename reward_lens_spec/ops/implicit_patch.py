"""implicit_patch and implicit_attribution_patch: which sites of a DPO policy carry its implicit margin.

Grid: pair × layer × component, component ∈ {resid, attn, mlp} (resid = the layer's output, ``resid_post``).
Each cell re-runs the policy (``model.kind=implicit``) on both sides with that site's output replaced, at every
position, by the reference model's output on the same tokens, and recomputes the implicit margin
(``kinds.implicit.patch``). Quantities:
  effect    m_patched − m (reward units): the change of the implicit margin m = r_c − r_r
  fraction  (m − m_patched) / m: the share of the margin the site carries — a share only when the policy and
            the reference share their readout (final norm, unembedding, logit soft-cap: compared weight for
            weight, ``kinds.implicit.patch.readout_difference``), where patching the last layer's output gives
            the reference, whose implicit margin is 0 (fraction 1 there). Otherwise no patched site reaches the
            reference and the ratio is not a share (``tiny_implicit``: 6.27, −2.07 at its last layer): every
            cell is NaN and the ``fraction_refused`` attr says why (read ``effect`` instead). NaN for a zero
            margin. The ``denominator`` attr names the denominator used.
``implicit_attribution_patch`` estimates ``effect`` to first order (gradient × (reference − policy)
activation, summed over positions and d_model; one forward and backward per batch): labelled approximate.
``observable.layers`` / ``observable.components`` / ``observable.pairs`` (first N pairs) restrict the grid.
Gauge: invariant. Cost: exact: (2 + cells) forwards per batch of sides; attribution: 2 forwards + 1 backward.
Source: activation patching (Meng et al. 2022; Heimersheim & Nanda 2024) and attribution patching (Syed et al.
2023), applied to DPO's implicit reward (Rafailov et al. 2023).
Errors: ``SpecError`` for an unknown quantity or component, a reference-free run, a reference of another
architecture, and a model that is not ``model.kind=implicit``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled
from .implicit_reward import implicit_model

_COMP = {"resid": "resid_post", "attn": "attn_out", "mlp": "mlp_out"}
_QUANT = ("effect", "fraction")


@dataclass(frozen=True)
class ImplicitPatchParams:
    quantity: str = "effect"
    components: tuple = ("resid", "attn", "mlp")
    batch_size: int = 16


class _Base(Operator):
    kinds = ("implicit",)
    Params = ImplicitPatchParams
    n_inputs = 0
    reruns = True
    per_pair = True
    approximate = False
    restricted_by = ("layers", "components", "pairs")
    dims = "() → pair × layer × component"

    def _grid(self, info):
        comps = tuple(info.components) if info.components else tuple(self.p.components)
        layers = tuple(info.layers) if info.layers is not None else tuple(range(info.n_layers))
        return layers, comps

    def out_dims(self, in_dims, info, where):
        layers, comps = self._grid(info)
        bad = [c for c in comps if c not in _COMP]
        if bad:
            raise SpecError("observable.components", f"unknown component '{bad[0]}' for {self.name}.", value=bad[0],
                            options=_COMP)
        if self.p.quantity not in _QUANT or (self.approximate and self.p.quantity != "effect"):
            opts = ["effect"] if self.approximate else list(_QUANT)
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=opts)
        if self.p.batch_size < 1:
            raise SpecError(where + ".batch_size", f"must be >= 1, got {self.p.batch_size}.",
                            fix="e.g. batch_size: 8 in the step.")
        return ("pair", "layer", "component")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        lm = implicit_model(ctx, self.name)
        layers, comps = self._grid(ctx.info)
        n_all = len(ctx.encoded.pair_ids)
        n = n_all if ctx.info.pairs is None else min(ctx.info.pairs, n_all)
        targets = [(_COMP[c], l) for l in layers for c in comps]
        key = (self.name, tuple(targets), n, self.p.batch_size)
        if key not in ctx.memo:
            ctx.memo[key] = self._compute(lm, ctx, targets, list(range(n))) if n else None
        full = np.full((n_all, len(layers), len(comps)), np.nan)
        from ..kinds.implicit.patch import readout_difference          # defers torch
        refused = readout_difference(lm) if self.p.quantity == "fraction" else None
        if n and refused is None:
            effect, margin = ctx.memo[key]
            data = effect.reshape(n, len(layers), len(comps))
            if self.p.quantity == "fraction":
                with np.errstate(divide="ignore", invalid="ignore"):
                    data = np.where(margin[:, None, None] != 0, -data / margin[:, None, None], np.nan)
            full[:n] = data
        arr = xr.DataArray(full, dims=("pair", "layer", "component"),
                           coords={**ctx.pair_coords(), "layer": list(layers), "component": list(comps)})
        units = "reward" if self.p.quantity == "effect" else "fraction"
        out = labelled(arr, units, INVARIANT, f"implicit margin {self.p.quantity} of patching each policy site with "
                       "the reference's activation at every position")
        out.attrs["method"] = "approximate: gradient × activation difference" if self.approximate else "exact"
        if self.p.quantity == "fraction" and refused is None:
            out.attrs["denominator"] = "m, the unpatched implicit margin (patching the last layer's output gives " \
                                       "the reference: m_patched = 0, fraction 1)"
        if refused is not None:
            out.attrs["fraction_refused"] = f"{refused}, so no patched site gives the reference and (m − m_patched)" \
                                            "/m is not a share of the margin; read the effect (reward units) instead"
        return out


@OPERATORS.register
class ImplicitPatch(_Base):
    """Exact patching of a DPO policy's sites from its reference, on the implicit margin (pair × layer × component)."""

    name = "implicit_patch"

    def _compute(self, lm, ctx, targets, pidx):
        from ..kinds.implicit.patch import patch_rewards
        base, patched, counts = patch_rewards(lm, ctx.encoded, targets, pidx, batch_size=self.p.batch_size,
                                              padding_side=getattr(lm.tokenizer, "padding_side", "left"))
        ctx.add_counts(self.name, counts)
        margin = base[:, 0] - base[:, 1]
        return (patched[:, 0] - patched[:, 1]) - margin[:, None], margin


@OPERATORS.register
class ImplicitAttributionPatch(_Base):
    """Attribution patching (first order) of a DPO policy's sites from its reference, on the implicit margin."""

    name = "implicit_attribution_patch"
    approximate = True

    def _compute(self, lm, ctx, targets, pidx):
        from ..kinds.implicit.patch import attribution_rewards
        est, counts = attribution_rewards(lm, ctx.encoded, targets, pidx, batch_size=self.p.batch_size,
                                          padding_side=getattr(lm.tokenizer, "padding_side", "left"))
        ctx.add_counts(self.name, counts)
        margin = np.asarray(ctx.capture.logits, np.float64)[pidx, 0, 0] - np.asarray(ctx.capture.logits,
                                                                                      np.float64)[pidx, 1, 0]
        return est[:, 0] - est[:, 1], margin
