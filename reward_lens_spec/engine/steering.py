"""Steering at every response token: add a vector to one layer's resid_post over the whole response.

``steer_response(lm, encoded, starts, layer, shifts, rows, gate=...)`` runs each requested (pair,
side) sequence once per shift, in full (left-padded batches of similar length, as the capture pass
batches them), with a forward hook on decoder layer ``layer`` that adds ``shifts[a]`` (a d_model
vector) to its output at every position from the side's response start (``per_token.response_starts``)
to the readout token, and reads the reward at the readout token: the model's head on its own
final-norm output there (``lm.head.rewards``; a context-gated head with the row's captured gate,
since the gating token precedes the response and a causal model leaves it unchanged).

Returns ``(rewards, counts)``: float64 rewards of shape (row, shift, output), reward units, in the
order of ``rows``, and the forward passes and (padded) tokens run.
Positions before the response start are never changed, so a shift of 0 reproduces the captured
reward (the caller checks it). Cost: one forward per (distinct sequence, shift).
Source: activation addition over all positions (Turner et al. 2023, "Activation Addition").
"""
from __future__ import annotations

import numpy as np
import torch

from ..models.head import first_output, get_module
from ..models.padding import batches_by_length, pad_batch
from ..models.placement import input_device


@torch.inference_mode()
def steer_response(lm, encoded, starts: np.ndarray, layer: int, shifts: np.ndarray, rows: list[tuple[int, int]],
                   *, gate: np.ndarray | None = None, batch_size: int = 16, padding_side: str = "left"
                   ) -> tuple[np.ndarray, dict]:
    """Readout rewards with ``shifts`` (shift, d_model) added over each row's response; see the module doc."""
    seqs = [list(encoded.chosen[p] if s == 0 else encoded.rejected[p]) for p, s in rows]
    begin = [int(starts[p, s]) for p, s in rows]
    K = lm.head.n_outputs
    out = np.full((len(rows), len(shifts), K), np.nan)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    dev = input_device(lm.model)
    dtype = next(lm.model.parameters()).dtype
    target = get_module(lm.model, lm.family.layers)[layer]
    state: dict = {}
    counts = {"forward_passes": 0, "tokens": 0}

    def add(mod, args, output):
        x = first_output(output) + state["delta"]         # (rows, T, d_model): zero outside each response
        return (x,) + tuple(output[1:]) if isinstance(output, tuple) else x

    def keep(mod, args, output):
        state["h"] = first_output(output)

    handles = [target.register_forward_hook(add), lm.norm.module.register_forward_hook(keep)]
    try:
        for b in batches_by_length([len(s) for s in seqs], batch_size):
            ids, mask, pos, readout = pad_batch([seqs[i] for i in b], pad, padding_side)
            T = ids.shape[1]
            on = torch.zeros(len(b), T, 1, dtype=dtype, device=dev)
            for j, i in enumerate(b):
                first = T - len(seqs[i]) if padding_side == "left" else 0
                on[j, first + begin[i]:first + len(seqs[i])] = 1
            g = None if gate is None else np.stack([gate[rows[i]] for i in b])
            for a, v in enumerate(shifts):
                state["delta"] = on * torch.as_tensor(v, dtype=dtype, device=dev)
                lm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
                h = state["h"][torch.arange(len(b), device=dev), readout.to(dev)].float().cpu().numpy()
                out[b, a] = lm.head.rewards(h, g).astype(np.float64)
                counts["forward_passes"] += 1
                counts["tokens"] += int(ids.numel())
    finally:
        for h in handles:
            h.remove()
    return out, counts
