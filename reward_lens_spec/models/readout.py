"""``ReadoutHead``: a model's reward head as plain float32 arrays (``models.head`` reads it off a model).

Kept apart from ``models.head`` so that the head kinds (``models.gated_head``, ``models.armorm``) can
build one while ``models.head`` dispatches to them: no import cycle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from ..errors import CaptureError


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
