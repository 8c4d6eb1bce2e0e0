"""Skip the layers below each patched site when the readout token's copies run as one sequence.

In ``engine.patching``'s packed forward every copy of the readout token starts from the same
embedding, and a copy patched at layer ``l`` is identical to the unpatched copy 0 until that
layer. So layer ``l`` runs only the *active* copies (copy 0, the last unpatched copy, and copies
whose patch sits at or below ``l``); every other copy leaves the layer holding copy 0's output,
which is exactly what it would have computed. Compute falls to about half for a full
layer × component grid; the result is the same up to float rounding.

How: a forward pre-hook on each decoder layer slices the per-copy inputs to the active copies —
hidden states and any ``(B, n, …)`` or ``(1, n, …)`` tensor (position ids, rotary cos/sin), and
the 4-D ``(B, 1, n, P + n)`` additive mask by rows and by the active copies' key columns (each layer's
KV cache then holds the ``P`` prefix keys and the active copies' keys, in order). A forward hook
scatters the layer's output back to all ``n`` copies. Start layers: unpatched copies 0;
``attn_out``/``mlp_out`` at ``l``: ``l`` (their hooks see active copies only, see ``local_rows``);
``resid_post`` at ``l``: ``l + 1`` (its hook runs after the scatter, on all copies); ``readout``:
never inside a layer. The two unpatched copies run every layer, so the caller's self-check
(they must reproduce the captured reward) covers this slicing.
"""
from __future__ import annotations

import numpy as np
import torch

from ..models.head import get_module


def start_layer(site: str, layer: int, n_layers: int) -> int:
    """First decoder layer at which a copy patched at ``(site, layer)`` differs from copy 0."""
    return {"attn_out": layer, "mlp_out": layer, "resid_post": layer + 1}.get(site, n_layers)


class CopySkip:
    """Pre/post hooks on every decoder layer for one packed forward: ``batch`` sequences (pairs) of
    ``starts.size`` copies each.

    ``starts``: int array (copy,), the first layer each copy must run (0 for unpatched copies,
    copy 0 among them), the same for every pair; ``prefix``: the number ``P`` of cached key
    positions (padding included).
    """

    def __init__(self, lm, starts: np.ndarray, prefix: int, batch: int = 1):
        self.layers = get_module(lm.model, lm.family.layers)
        self.n, self.P, self.B, self.handles = int(starts.size), prefix, batch, []
        if starts[0] != 0:
            raise ValueError("copy 0 must be unpatched (start layer 0): it stands in for every inactive copy.")
        self.active = [np.flatnonzero(starts <= layer) for layer in range(len(self.layers))]

    def local_rows(self, layer: int, rows) -> list[int]:
        """Positions of copies ``rows`` among layer ``layer``'s active copies (all must be active)."""
        act = self.active[layer]
        return [int(np.searchsorted(act, r)) for r in rows] if act.size < self.n else list(rows)

    def attach(self) -> None:
        """Register the hooks (before any patch hook on a decoder layer, so the scatter runs first)."""
        for layer, block in enumerate(self.layers):
            act = self.active[layer]
            if act.size == self.n:
                continue
            idx = torch.as_tensor(act)
            cols = torch.cat([torch.arange(self.P), self.P + idx])
            self.handles.append(block.register_forward_pre_hook(self._slicer(idx, cols), with_kwargs=True))
            self.handles.append(block.register_forward_hook(self._scatter(idx)))

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _slice(self, v, idx, cols):
        if isinstance(v, tuple):
            return tuple(self._slice(x, idx, cols) for x in v)
        if not torch.is_tensor(v) or v.ndim < 2:
            return v
        if v.ndim == 4 and v.shape[1] == 1 and tuple(v.shape[-2:]) == (self.n, self.P + self.n):
            return v[:, :, idx.to(v.device)][..., cols.to(v.device)]          # rows, then key columns
        if v.shape[0] in (1, self.B) and v.shape[1] == self.n:
            return v[:, idx.to(v.device)]
        return v

    def _slicer(self, idx, cols):
        def hook(mod, args, kwargs):
            return (tuple(self._slice(a, idx, cols) for a in args),
                    {k: self._slice(v, idx, cols) for k, v in kwargs.items()})
        return hook

    def _scatter(self, idx):
        def hook(mod, args, output):
            x = output[0] if isinstance(output, tuple) else output             # (pair, active, d)
            full = x[:, :1].expand(-1, self.n, -1).clone()                     # copy 0 is active: position 0
            full[:, idx.to(x.device)] = x
            return (full,) + tuple(output[1:]) if isinstance(output, tuple) else full
        return hook
