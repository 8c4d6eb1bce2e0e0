"""The reward head and the final norm, read off a loaded model as plain arrays.

Reward ``r = W·h + b`` with ``W`` (objective × d_model) and ``b`` (objective),
always in float32 whatever the model dtype. ``h`` is the final-norm output at
the readout token. The final norm is described exactly enough to (a) apply it
to any residual (normed reward lens) and (b) freeze its scale at the readout
token so that attribution becomes linear (direct linear attribution).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .families import Family


@dataclass(frozen=True)
class ReadoutHead:
    """``W``: float32 (objective, d_model); ``b``: float32 (output,); ``objectives``: row names.

    Linear heads output every row (``n_outputs = K``). A gated head (ArmoRM style:
    a per-objective regression layer and a softmax gate over objectives, both
    reading the pooled vector h) outputs one score ``Σ_k g_k(h) · W_k·h + b``;
    ``gate(h)`` gives the weights (..., objective).
    """

    W: np.ndarray
    b: np.ndarray
    objectives: tuple[str, ...]
    gate: Callable[[np.ndarray], np.ndarray] | None = None
    T: np.ndarray | None = None          # context gate: reward transform (objective × objective)
    context_gate: bool = False           # gate weights come from elsewhere in the sequence (ArmoRM)

    @property
    def n_objectives(self) -> int:
        return self.W.shape[0]

    @property
    def gated(self) -> bool:
        return self.gate is not None or self.context_gate

    @property
    def n_outputs(self) -> int:
        return 1 if self.gated else self.W.shape[0]

    def _weights(self, h, g):
        if not self.context_gate:
            return self.gate(h)
        if g is None:
            from ..errors import CaptureError
            raise CaptureError("this head's gate reads another token of the sequence (ArmoRM); its captured gate "
                               "weights (CaptureResult.gate) must be passed with h.")
        return np.asarray(g, np.float64)

    def directions(self, h: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        """Effective reward direction(s) at ``h`` (..., d_model): (..., output, d_model).

        Linear: the rows of W. Gated: ``g(h)ᵀW`` — the gate frozen at ``h``. Context-gated (ArmoRM):
        ``gᵀ Tᵀ W`` with ``g`` (..., objective) the gate weights captured for each row.
        """
        if not self.gated:
            return np.broadcast_to(self.W, np.shape(h)[:-1] + self.W.shape)
        rows = np.asarray(self.W if self.T is None else self.T.T @ self.W, np.float64)
        # Σ_k g_k · rows_k summed in a fixed order, so the direction does not depend on the batch's shape
        return (self._weights(h, g)[..., :, None] * rows).sum(-2)[..., None, :]

    def rewards(self, h: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        """The model's own outputs at ``h`` (..., d_model) → (..., output), reward units, float32 math.

        ``g``: a context-gated head's gate weights (..., objective); ignored by other heads.
        """
        h = np.asarray(h, np.float32)
        if not self.gated:
            return h @ self.W.T + self.b
        r = h @ self.W.T
        if self.T is not None:
            r = r @ self.T.astype(np.float32)
        return ((self._weights(h, g) * r).sum(-1, keepdims=True) + self.b).astype(np.float32)


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
        p = next(self.module.parameters())
        out = self.module(torch.as_tensor(np.asarray(x), dtype=p.dtype, device=p.device))
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
        from .armorm import read_armorm_head
        return read_armorm_head(model, objectives)
    lin = _get(model, family.head)
    if hasattr(lin, "regression") and hasattr(lin, "gating"):
        from .gated_head import read_gated
        return read_gated(lin, objectives)
    W = lin.weight.detach().float().cpu().numpy().copy()
    b = (lin.bias.detach().float().cpu().numpy().copy() if getattr(lin, "bias", None) is not None
         else np.zeros(W.shape[0], np.float32))
    names = tuple(objectives) if objectives else (
        ("reward",) if W.shape[0] == 1 else tuple(f"objective_{k}" for k in range(W.shape[0])))
    if len(names) != W.shape[0]:
        from ..errors import SpecError
        raise SpecError("model.objectives", f"{len(names)} names given for a head with {W.shape[0]} rows.",
                        fix=f"list exactly {W.shape[0]} names, or leave it empty.")
    return ReadoutHead(W=W, b=b, objectives=names)


def read_final_norm(model, family: Family) -> FinalNorm:
    """Describe the family's final norm module (see ``FinalNorm``)."""
    mod = _get(model, family.final_norm)
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
