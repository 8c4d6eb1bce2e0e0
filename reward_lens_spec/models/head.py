"""The reward head and the final norm, read off a loaded model as plain arrays.

Reward ``r = W·h + b`` with ``W`` (objective × d_model) and ``b`` (objective),
always in float32 whatever the model dtype. ``h`` is the final-norm output at
the readout token (``ReadoutHead`` lives in ``models.readout``, so the ArmoRM and gated
heads can build one without importing this module). The final norm is described exactly enough to (a) apply it
to any residual (normed reward lens) and (b) freeze its scale at the readout
token so that attribution becomes linear (direct linear attribution).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .families import Family
from .readout import ReadoutHead  # noqa: F401  (defined in models.readout; importable from here as before)
from .placement import module_device, materialized
from .gated_head import read_gated
from ..errors import SpecError
from .armorm import read_armorm_head


@dataclass(frozen=True)
class FinalNorm:
    """Final norm parameters: ``kind`` "rms" or "layer", gain ``g``, bias ``beta``, ``eps``, ``offset``.

    RMS: ``N(x) = x / sqrt(mean(x²) + eps) * (offset + g)``;
    Layer: ``N(x) = (x - mean(x)) / sqrt(var(x) + eps) * g + beta``.
    """

    kind: str
    g: np.ndarray
    beta: np.ndarray
    eps: float
    offset: float
    module: torch.nn.Module

    @property
    def gain(self) -> np.ndarray:
        return (self.offset + self.g).astype(np.float64)

    def frozen(self, x_final: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-row frozen ``(scale, mean)`` from final residuals ``x_final`` (..., d_model).

        ``mean`` is 0 for RMSNorm. Both have shape (...,) and are float64.
        """
        x = np.asarray(x_final, np.float64)
        if self.kind == "layer":
            mu = x.mean(-1)
            var = ((x - mu[..., None]) ** 2).mean(-1)
        else:
            mu = np.zeros(x.shape[:-1])
            var = (x ** 2).mean(-1)
        return 1.0 / np.sqrt(var + self.eps), mu

    @torch.no_grad()
    def apply(self, x: np.ndarray) -> np.ndarray:
        """Apply the model's own final-norm module to residuals (..., d_model); float32 out."""
        p = next(self.module.parameters())             # on meta when offloaded: its dtype still holds
        out = self.module(torch.as_tensor(np.asarray(x), dtype=p.dtype, device=module_device(self.module)))
        return out.float().cpu().numpy()


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def read_head(model, family: Family, objectives: tuple[str, ...] | None = None) -> ReadoutHead:
    """Read ``W`` and ``b`` from the family's head module (no bias → zeros).

    A head module with ``regression`` (Linear d→K) and ``gating`` (d→K logits)
    submodules is read as a gated head (see ``models.gated_head``).
    """
    if getattr(model, "is_armorm", False):
        return read_armorm_head(model, objectives)
    lin = _get(model, family.head)
    if hasattr(lin, "regression") and hasattr(lin, "gating"):
        return read_gated(lin, objectives)
    with materialized(lin):                         # offloaded (models.placement): read where it runs
        W = lin.weight.detach().float().cpu().numpy().copy()
        b = (lin.bias.detach().float().cpu().numpy().copy() if getattr(lin, "bias", None) is not None
             else np.zeros(W.shape[0], np.float32))
    names = tuple(objectives) if objectives else (
        ("reward",) if W.shape[0] == 1 else tuple(f"objective_{k}" for k in range(W.shape[0])))
    if len(names) != W.shape[0]:
        raise SpecError("model.objectives", f"{len(names)} names given for a head with {W.shape[0]} rows.",
                        fix=f"list exactly {W.shape[0]} names, or leave it empty.")
    return ReadoutHead(W=W, b=b, objectives=names)


def read_final_norm(model, family: Family) -> FinalNorm:
    """Describe the family's final norm module (see ``FinalNorm``)."""
    mod = _get(model, family.final_norm)
    with materialized(mod):                         # offloaded (models.placement): read where it runs
        return _final_norm(model, family, mod)


def _final_norm(model, family: Family, mod) -> FinalNorm:
    g = (mod.weight.detach().double().cpu().numpy().copy() if getattr(mod, "weight", None) is not None
         else np.ones(model.config.hidden_size))          # a norm without a gain (OLMo)
    beta = (mod.bias.detach().double().cpu().numpy().copy() if getattr(mod, "bias", None) is not None
            else np.zeros_like(g))
    eps = getattr(mod, "eps", None) if family.norm_eps is None else family.norm_eps
    if eps is None:
        eps = getattr(mod, "variance_epsilon", None)
    if eps is None:
        eps = getattr(model.config, family.norm_eps_attr)
    return FinalNorm(kind=family.norm, g=g, beta=beta, eps=float(eps), offset=family.norm_offset, module=mod)


def get_module(model, path: str):
    """Resolve a dotted module path on ``model``."""
    return _get(model, path)


def first_output(x):
    """A module's output tensor: the first element when the module returns a tuple (a decoder layer), else ``x``."""
    return x[0] if isinstance(x, tuple) else x


def module_for(lm, site: str, layer: int):
    """The module of ``lm`` whose output is ``site`` (``resid_post`` | ``attn_out`` | ``mlp_out`` of block
    ``layer``, or ``readout``: the final norm). Raises ``KeyError`` for another site name."""
    if site == "readout":
        return lm.norm.module
    block = get_module(lm.model, lm.family.layers)[layer]
    return {"resid_post": block, "attn_out": get_module(block, lm.family.attn),
            "mlp_out": get_module(block, lm.family.mlp)}[site]
