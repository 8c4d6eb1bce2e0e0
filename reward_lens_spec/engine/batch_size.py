"""``model.batch_size: auto``: the largest batch the device holds, found before the first chunk.

The start is an estimate of activation memory for the longest batch: per row and token, the residual
stream and the MLP's hidden state of every layer (``(n_layers + 2) · d_model + n_layers · d_ff`` values)
plus one ``n_heads × T`` row of attention scores per layer, in the model's dtype, against the device's
free memory (``torch.cuda.mem_get_info``) or, on CPU, the memory the OS reports available; at most
``MAX_START`` rows and at most the rows there are. The probe then runs the ``size`` longest rows, padded,
through the model once; an out-of-memory error halves ``size`` and tries again. The chosen size is fixed
for the whole run, so every number equals a run with ``model.batch_size=<chosen>`` bit for bit, and it
is recorded in the run's provenance (``batch_size``). Source: the halving search of Hugging Face
Accelerate's ``find_executable_batch_size``, applied once before the run instead of around it.
Raises ``SpecError`` (``model.batch_size``) when one row does not fit.
"""
from __future__ import annotations

import os

import torch

from ..errors import SpecError
from ..models.padding import pad_batch
from ..models.placement import input_device

AUTO = "auto"
MAX_START = 256
HEADROOM = 0.5                   # of the free memory, for weights' temporaries, the allocator and the hooks


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error from any device: ``torch.OutOfMemoryError`` or the CPU allocator's."""
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom) or (isinstance(exc, RuntimeError) and (
        "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower()))


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 2 ** 30


def estimate(lm, longest: int, n_rows: int) -> int:
    """The start of the search: rows of ``longest`` tokens that fit ``HEADROOM`` of the free memory (≥ 1)."""
    cfg = lm.model.config
    heads = int(getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", 1) or 1)
    d_ff = int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * lm.d_model)
    itemsize = torch.finfo(next(lm.model.parameters()).dtype).bits // 8
    per_row = longest * ((lm.n_layers + 2) * lm.d_model + lm.n_layers * (d_ff + heads * longest)) * itemsize
    fit = int(HEADROOM * _free_bytes(input_device(lm.model)) // max(per_row, 1))
    return max(1, min(fit, MAX_START, n_rows))


@torch.inference_mode()
def choose_batch_size(lm, encoded, *, padding_side: str = "left", start: int | None = None) -> int:
    """The batch size a run with ``model.batch_size: auto`` uses (see the module doc). ``encoded``: the run's
    ``EncodedPairs``; ``start``: overrides the estimate (tests)."""
    seqs = sorted((s for pair in zip(encoded.chosen, encoded.rejected) for s in pair), key=len, reverse=True)
    if not seqs:
        return 1
    size = start if start is not None else estimate(lm, len(seqs[0]), len(seqs))
    size = max(1, min(size, len(seqs)))
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    device = input_device(lm.model)
    while True:
        ids, mask, pos, _ = pad_batch(list(seqs[:size]), pad_id, padding_side)
        try:
            lm.model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                     use_cache=False)
            return size
        except Exception as exc:                      # noqa: BLE001 (only out-of-memory is retried)
            if not is_oom(exc):
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if size == 1:
                raise SpecError("model.batch_size", f"auto: one row of {len(seqs[0])} tokens does not fit on "
                                f"{device} (out of memory).", fix="lower model.max_length, use model.dtype="
                                "bfloat16, or a device with more memory.") from None
            size //= 2
