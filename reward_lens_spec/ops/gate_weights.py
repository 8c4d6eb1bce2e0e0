"""gate_weights: a gated head's mixture weights over objectives, per side (pair × side × objective).

For ArmoRM (``models.armorm``) these are ``softmax(MLP(h_gate) / temperature) · logit_scale``,
read at the gating token (the prompt's end) in the capture pass; for the readout-gated mimic
(``models.gated_head``) ``g(h)`` at the readout. The gated score is ``Σ_k g_k · (r @ T)_k``.
Units: weight (sums to ``logit_scale`` over objectives). Gauge: invariant. Raises ``SpecError``
(``model.head``) when run on a model without a gated head.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled


@OPERATORS.register
class GateWeights(Operator):
    """A gated head's weights over objectives, per side (pair × side × objective)."""

    name = "gate_weights"
    dims = "() → pair × side × objective"
    per_pair = True                # each pair's gate, from its own capture rows
    n_inputs = 0

    def out_dims(self, in_dims, info, where):
        return ("pair", "side", "objective")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        head, cap = ctx.lm.head, ctx.capture
        if not head.gated:
            raise SpecError("model.head", "gate_weights reads a gated head's weights; this model's head is linear.",
                            fix="use model.head=gated (ArmoRM or a gated checkpoint), or drop the step.")
        g = cap.gate if head.context_gate else head.gate(cap.h)
        arr = xr.DataArray(np.asarray(g, np.float64), dims=("pair", "side", "objective"),
                           coords={**ctx.pair_coords(), "side": ["chosen", "rejected"],
                                   "objective": list(head.objectives)})
        return labelled(arr, "weight", INVARIANT, "gate weights over objectives")
