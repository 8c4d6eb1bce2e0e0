"""final_norm: apply the model's final norm, or freeze it at the readout token.

mode=apply   N(x) for every residual x (the normed reward lens; at the last
             layer it reproduces h exactly, so the lens ends at the margin).
mode=frozen  (exact linear attribution) take each side's scale s (and mean μ,
             for LayerNorm) from ``reference`` — that side's final residual at the
             readout token — and map every component c to ``g ⊙ (c − mean(c)) · s``
             (RMSNorm: ``(offset + g) ⊙ c · s``). Summed over components this is
             N(x_final) − β, so after ``project`` and ``diff`` the components sum to
             the margin exactly (β and b cancel). Standard "frozen LayerNorm"
             direct attribution (Elhage et al. 2021; Nanda's TransformerLens
             ``apply_ln_to_stack``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from .base import Operator, need_dim


@dataclass(frozen=True)
class FinalNormParams:
    mode: str = "apply"
    reference: Optional[str] = None


@OPERATORS.register
class FinalNorm(Operator):
    """Apply the final norm, or freeze its scale at the readout token (linear attribution)."""

    name = "final_norm"
    per_pair = True
    dims = "x (…, d_model) [, reference (…, d_model)] → same dims"
    Params = FinalNormParams
    extra_inputs = ("reference",)

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "d_model", where, "the norm acts on vectors")
        if self.p.mode not in ("apply", "frozen"):
            raise SpecError(where + ".mode", f"unknown mode '{self.p.mode}'.", value=self.p.mode,
                            options=["apply", "frozen"])
        if self.p.mode == "frozen":
            if self.p.reference is None:
                raise SpecError(where + ".reference", "mode=frozen needs the final residual to freeze at.",
                                fix="add a select step (resid at layer: last) and name it in 'reference'.")
            need_dim(in_dims[0], "side", where, "each side has its own frozen scale")
            if set(in_dims[1]) != {"pair", "side", "d_model"}:
                raise SpecError(where + ".reference", f"reference must be pair × side × d_model, got {in_dims[1]}.",
                                fix="name a select step of the final residual (resid at layer: last), "
                                    "which is pair × side × d_model.")
        return in_dims[0]

    def run(self, ctx, x, ref=None):
        norm = ctx.lm.norm
        out = x.copy()
        if self.p.mode == "apply":
            out.values = norm.apply(x.values)
        else:
            scale, _ = norm.frozen(ref.transpose("pair", "side", "d_model").values)
            vals = np.asarray(x.transpose("pair", "side", ..., "d_model").values, np.float64)
            extra = vals.ndim - 3
            shp = scale.shape + (1,) * extra
            if norm.kind == "layer":
                vals = vals - vals.mean(axis=-1, keepdims=True)   # Σ_c (c − mean c) = x − μ
            vals = vals * norm.gain * scale.reshape(shp + (1,))
            out = x.transpose("pair", "side", ..., "d_model").copy(data=vals.astype(np.float64))
        out.attrs = dict(x.attrs)
        return out
