"""Per-token reward: the reward head read at every position of the response, and a lens over positions.

``response_starts(tokenizer, pairs, encoded)`` gives, per pair and side, the index of the first
response token: the first token after the longest common prefix of the side's full (untruncated)
encoding with the same template's encoding of an empty response (a token that merges the template's
last character with the response's first counts as response); a truncated side keeps its response
length, so its start moves left by the tokens cut.

``prefix_pass(lm, encoded, starts, lens=...)`` runs every distinct token sequence once (left-padded,
``batch_size`` rows of similar length per forward, as the capture pass batches them) with hooks
that read, at every position from the response start to the readout token:
  reward  the model's head on the final-norm output h_t: ``W·h_t + b`` (a gated head with its gate:
          ``g(h_t)`` for a readout gate, the row's captured gate for ArmoRM's prompt gate)
  lens    (``lens=True``) the same head on ``N(x_{l,t})``, ``N`` the model's final norm, for the
          embedding output and every ``resid_post`` (layer −1 … L−1), without the bias ``b``
Only these scalars leave a batch (never positions × d_model), so memory is
O(pairs × positions × (layers + 1)) for the results and O(batch × tokens × d_model) while a batch
runs. The readout token is the last position, so the last position's reward is the reward.
Returns float64 arrays: reward (pair, side, position, output) and lens (pair, side, layer,
position, output), NaN beyond each side's response length.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from ..models.formatting import common_prefix, encode_text
from ..models.head import first_output, get_module
from ..models.padding import batches_by_length, pad_batch
from ..models.placement import input_device


def response_starts(tokenizer, pairs, encoded) -> np.ndarray:
    """First response token per (pair, side): int array (pair, side); see the module doc."""
    by_id = {p.id: p for p in pairs}
    out = np.zeros((len(encoded.pair_ids), 2), np.int64)
    for i, pid in enumerate(encoded.pair_ids):
        pair = by_id[pid]
        for s, (ids, resp) in enumerate(((encoded.chosen[i], pair.chosen), (encoded.rejected[i], pair.rejected))):
            prompt = pair.prompt if s == 0 or pair.prompt_rejected is None else pair.prompt_rejected
            full = ids if len(ids) < encoded.max_length else encode_text(tokenizer, prompt, resp, encoded.fmt,
                                                                     encoded.template)
            n_prompt = common_prefix(encode_text(tokenizer, prompt, "", encoded.fmt, encoded.template), full)
            out[i, s] = min(max(len(ids) - (len(full) - n_prompt), encoded.bos_count), len(ids) - 1)
    return out


def _head_at(lm, h: np.ndarray, gate, bias: bool) -> np.ndarray:
    """The head on vectors h (rows, positions, d_model) → (rows, positions, output), float64 math."""
    head = lm.head
    h64 = np.asarray(h, np.float64)
    if not head.gated:
        out = np.einsum("rtd,kd->rtk", h64, head.W.astype(np.float64))
    elif head.context_gate:                 # the gated direction (the head's own), then one dot product
        out = np.einsum("rtd,rd->rt", h64, head.directions(h64[:, 0], gate)[:, 0])[..., None]
    else:
        out = np.einsum("rtd,rtd->rt", h64, head.directions(h64)[..., 0, :])[..., None]
    return out + head.b.astype(np.float64) if bias else out


@torch.inference_mode()
def prefix_pass(lm, encoded, starts, *, lens: bool = False, batch_size: int = 16, padding_side: str = "left",
                gate=None):
    """Per-position rewards (and lens) of every side's response; see the module doc."""
    seqs = [s for pair in zip(encoded.chosen, encoded.rejected) for s in pair]
    n = len(encoded.pair_ids)
    P = int(max(len(s) - st for s, st in zip(seqs, starts.reshape(-1))))
    K, L = lm.head.n_outputs, lm.n_layers
    reward = np.full((2 * n, P, K), np.nan)
    lens_out = np.full((2 * n, L + 1, P, K), np.nan) if lens else None
    gate_rows = None if gate is None else gate.reshape(2 * n, -1)
    first: dict = {}
    owners: dict = {}
    for r, sq in enumerate(seqs):
        owners.setdefault(first.setdefault(tuple(sq), r), []).append(r)
    uniq = list(owners)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    dev = input_device(lm.model)
    layers = get_module(lm.model, lm.family.layers)
    norm_copy = copy.deepcopy(lm.norm.module)             # no hooks: the model's own norm, applied again
    got: dict = {}

    def keep(key, pre=False):
        def hook(mod, args, *rest):
            x = (args[0] if args else next(iter(rest[0].values()))) if pre else first_output(rest[0])
            got[key] = x
        return hook
    handles = [layers[0].register_forward_pre_hook(keep(-1, pre=True), with_kwargs=True)] if lens else []
    if lens:
        handles += [layer.register_forward_hook(keep(l)) for l, layer in enumerate(layers)]
    handles.append(lm.norm.module.register_forward_hook(keep("h")))
    try:
        for b in batches_by_length([len(seqs[u]) for u in uniq], batch_size):
            rows = [uniq[i] for i in b]
            ids, mask, pos, _ = pad_batch([seqs[r] for r in rows], pad, padding_side)
            T = ids.shape[1]
            lm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
            g = None if gate_rows is None else gate_rows[rows]
            # column of position t of row j's response: left padding shifts every row to end at T − 1
            cols = []
            for j, r in enumerate(rows):
                first_col = T - len(seqs[r]) if padding_side == "left" else 0
                cols.append(first_col + np.arange(int(starts.reshape(-1)[r]), len(seqs[r])))
            outs = {"h": _head_at(lm, got["h"].float().cpu().numpy(), g, bias=True)}
            if lens:
                for l in range(-1, L):
                    outs[l] = _head_at(lm, norm_copy(got[l]).float().cpu().numpy(), g, bias=False)
            for j, r in enumerate(rows):
                c = cols[j]
                for o in owners[r]:
                    reward[o, :len(c)] = outs["h"][j, c]
                    if lens:
                        for l in range(-1, L):
                            lens_out[o, l + 1, :len(c)] = outs[l][j, c]
            got.clear()
    finally:
        for h in handles:
            h.remove()
    reward = reward.reshape(n, 2, P, K)
    return reward, None if lens_out is None else lens_out.reshape(n, 2, L + 1, P, K)
