"""Padding token-id lists into a batch, and grouping rows into length-sorted batches.

Rules:

- The attention mask is the only truth about which tokens are real: the readout index and the
  position ids are computed from it, never from the pad id (pad may equal EOS, and EOS may occur
  inside a prompt).
- ``position_ids = clamp(cumsum(mask) - 1, min=0)``: 0 at the first attended token, for left
  and right padding alike (learned absolute positions included).
- ``readout[b]`` = index of the rightmost attended token of row ``b``.
"""
from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np
import torch

from ..errors import SpecError

SIDES = ("left", "right")


def pad_batch(seqs: list[list[int]], pad_id: int | None, side: str = "left"
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad ``seqs`` to a common length ``T`` = longest row.

    Returns ``(input_ids, attention_mask, position_ids, readout)``: three ``LongTensor[B, T]``
    (dims: batch, token) and ``readout`` ``LongTensor[B]``. ``pad_id=None`` (a tokenizer without
    a pad token) fills with 0; the mask is what matters.

    Raises ``SpecError`` (``model.padding_side``) for a side other than left/right, and
    ``SpecError`` (``model.batch``) for an empty batch or an empty row (no readout token).
    """
    if side not in SIDES:
        raise SpecError("model.padding_side", f"unknown padding side {side!r}.", value=side, options=SIDES)
    if not seqs:
        raise SpecError("model.batch", "cannot pad an empty batch.",
                        fix="give at least one pair (check dataset.limit and dataset.dimensions).")
    if any(len(s) == 0 for s in seqs):
        raise SpecError("model.batch", "a row has no tokens, so it has no readout token.",
                        fix="drop empty pairs before batching.")
    fill = 0 if pad_id is None else int(pad_id)
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    B, T = len(seqs), int(lengths.max())
    first = T - lengths if side == "left" else np.zeros_like(lengths)    # first attended column per row
    offset = np.arange(T) - first[:, None]                    # B × T: token index within the row
    real = (offset >= 0) & (offset < lengths[:, None])
    input_ids = np.full((B, T), fill, dtype=np.int64)
    input_ids[real] = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    mask = real.astype(np.int64)                              # row-major fill keeps each row's token order
    position_ids = np.minimum(np.maximum(offset, 0), (lengths - 1)[:, None])   # = clamp(cumsum(mask) - 1, min=0)
    readout = first + lengths - 1                             # rightmost attended token (every row has one)
    return (torch.from_numpy(input_ids), torch.from_numpy(mask), torch.from_numpy(position_ids),
            torch.from_numpy(readout))


def _positive_int(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(field, f"must be a positive integer, got {value!r}.", value=value,
                        fix=f"set {field} to an integer >= 1.")
    return value


def batches_by_length(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None
                      ) -> list[list[int]]:
    """Group row indices into batches, shortest rows first.

    Indices are sorted by ``(length, index)`` (stable, deterministic) and packed greedily: a batch
    holds at most ``batch_size`` rows and, when ``max_tokens`` is set, ``rows x longest row <=
    max_tokens`` (a single row longer than ``max_tokens`` forms its own batch). Every index
    appears exactly once.

    Raises ``SpecError`` naming ``model.batch_size`` / ``model.max_tokens`` for non-positive values.
    """
    _positive_int(batch_size, "model.batch_size")
    if max_tokens is not None:
        _positive_int(max_tokens, "model.max_tokens")
    order = sorted(range(len(lengths)), key=lambda i: (int(lengths[i]), i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        rows = len(cur) + 1
        longest = int(lengths[i])  # ascending order: the newest row is the longest
        if cur and (rows > batch_size or (max_tokens is not None and rows * longest > max_tokens)):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches
