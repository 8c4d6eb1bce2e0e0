"""Batched prefix KV caches: every token of a sequence but its last, for re-running the readout token.

Activation patching at the readout token (``engine.patching``) changes nothing at earlier
positions under causal attention, so each patched sequence's prefix runs once, here, batched
and left-padded, and only copies of its last token run again over the cache. The capture pass
builds these for the rows it is told to keep (``capture(keep_prefix=)``), then runs the last
tokens over a copy of the cache; patching builds the rest itself.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import CaptureError
from ..models.padding import pad_batch


@dataclass
class PrefixBatch:
    """KV cache of ``B`` left-padded prefixes.

    ``cache``: the model's cache (batch ``B``, ``P`` key positions); ``mask``: ``LongTensor[B, P]``
    (1 = real prefix token, 0 = padding); ``lengths``: int array (B,), tokens per whole sequence
    (prefix + readout token), so the readout token's position id is ``lengths − 1``.
    """

    cache: object
    mask: torch.Tensor
    lengths: np.ndarray

    def take(self, rows) -> tuple[object, torch.Tensor, np.ndarray]:
        """A private copy of the cache for ``rows`` (repeats allowed), with their mask and lengths."""
        c = copy.deepcopy(self.cache)
        rows = list(rows)
        if rows != list(range(len(self.lengths))):
            c.batch_select_indices(torch.as_tensor(rows, device=self.mask.device))
        return c, self.mask[rows], self.lengths[rows]


def run_prefix(lm, seqs: list[list[int]], device, names=None) -> PrefixBatch:
    """One forward of ``[s[:-1] for s in seqs]``, left-padded, ``use_cache=True``.

    Raises ``CaptureError`` for a sequence of one token (it has no prefix to cache), naming it
    by ``names`` (pair/side labels) when given.
    """
    short = [i for i, s in enumerate(seqs) if len(s) < 2]
    if short:
        which = [names[i] for i in short] if names else short
        raise CaptureError(f"{lm.name}: {which} tokenize to a single token, so patching at the readout token "
                           "has no prefix to keep; drop these pairs (or use a template that adds a prompt).")
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    ids, mask, pos, _ = pad_batch([s[:-1] for s in seqs], pad, "left")
    out = lm.model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                   use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    return PrefixBatch(cache=cache, mask=mask.to(device), lengths=np.array([len(s) for s in seqs]))


def sliding(lm) -> bool:
    """Whether any layer attends over a sliding window (its cache drops old keys)."""
    cfg = lm.model.config
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        return True
    return getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True) is not False
