"""One capture pass: both sides of every pair, batched by length, all sites at once.

Hooks slice the readout position inside the graph, so a capture keeps
``pair × side × layer × d_model`` floats per site, never the full sequences.
After each batch a self-check compares ``W·h + b`` (float32, from the captured
final-norm output ``h``) with the model's own head output at the readout token
and, where HF's pad-id pooling picks the same token, with its pooled logits.
A mismatch or a non-finite score stops the run (``CaptureError``) naming the
model and the pair ids; nothing is returned to be stored.

Sites (TransformerLens vocabulary): ``resid_pre``/``resid_post`` (layer),
``attn_out``/``mlp_out`` (what each component adds to the residual stream),
``embed`` = ``resid_pre`` of layer 0 (stored with a layer axis of length 1).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import CaptureError
from .head import get_module
from .padding import batches_by_length, pad_batch

LAYER_SITES = ("embed", "resid_pre", "resid_post", "attn_out", "mlp_out", "attn_z")
SIDES = ("chosen", "rejected")
_TOL = {"float32": 1e-4, "bfloat16": 6e-2, "float16": 1e-2}


@dataclass
class CaptureResult:
    """Activations at the readout token.

    ``h``: pair × side × d_model (final-norm output); ``logits``: pair × side ×
    objective (the model's own head output); ``sites[name]``: pair × side ×
    layer × d_model, float32. ``counts``: forward passes and tokens processed.
    """

    pair_ids: list[str]
    h: np.ndarray
    logits: np.ndarray
    lengths: np.ndarray
    sites: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    prefixes: dict = field(default_factory=dict)    # token ids (tuple) -> KV cache of all but the last token


def _first(x):
    return x[0] if isinstance(x, tuple) else x


class _Recorder:
    """Registers hooks that keep ``out[row, readout[row]]`` for the current batch."""

    def __init__(self, lm, sites):
        self.lm, self.sites, self.handles, self.index, self.buf, self.active = lm, sites, [], None, {}, True
        layers = get_module(lm.model, lm.family.layers)
        if "embed" in sites:
            self._pre(layers[0], ("embed", 0))
        for layer_idx, layer in enumerate(layers):
            if "resid_pre" in sites:
                self._pre(layer, ("resid_pre", layer_idx))
            if "resid_post" in sites:
                self._post(layer, ("resid_post", layer_idx))
            if "attn_out" in sites:
                self._post(get_module(layer, lm.family.attn), ("attn_out", layer_idx))
            if "mlp_out" in sites:
                self._post(get_module(layer, lm.family.mlp), ("mlp_out", layer_idx))
            if "attn_z" in sites:
                self._pre(get_module(layer, lm.family.o_proj), ("attn_z", layer_idx))
        self._post(lm.norm.module, ("h", 0))
        self._post(get_module(lm.model, lm.family.head), ("logits", 0))

    def start(self, readout: torch.Tensor, device) -> None:
        """Begin a batch: (row, readout) index pair built once, used by every hook."""
        self.index = (torch.arange(readout.shape[0], device=device), readout.to(device))
        self.buf = {}

    def _take(self, t):
        return t[self.index].detach().float().cpu()

    def _pre(self, module, key):
        def hook(mod, args, kwargs):
            if self.active:
                x = args[0] if args else next(iter(kwargs.values()))
                self.buf[key] = self._take(x)
        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def _post(self, module, key):
        def hook(mod, args, out):
            if self.active:
                self.buf[key] = self._take(_first(out))
        self.handles.append(module.register_forward_hook(hook))

    def close(self):
        for h in self.handles:
            h.remove()


def _width(lm, site: str) -> int:
    if site != "attn_z":
        return lm.d_model
    o = get_module(get_module(lm.model, lm.family.layers)[0], lm.family.o_proj)
    return int(o.weight.shape[0] if lm.family.o_proj_conv1d else o.weight.shape[1])


def hf_pooled_index(input_ids: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """The token HF's sequence classifiers pool (rightmost token not equal to the pad id)."""
    if pad_id is None:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] - 1, dtype=torch.long)
    idx = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    return (idx * (input_ids != pad_id)).argmax(-1)


@torch.inference_mode()
def capture(lm, encoded, sites=("resid_post",), *, batch_size: int = 16, max_tokens: int | None = None,
            padding_side: str = "left", readout_fn=None, progress: bool = False, keep_prefix=()) -> CaptureResult:
    """Run every distinct side of ``encoded`` (an ``EncodedPairs``) once; return a ``CaptureResult``.

    Identical token sequences (e.g. a pair whose chosen equals its rejected) run once and
    share their activations, so such a pair's margin is exactly 0 whatever the batching.

    ``sites``: subset of ``LAYER_SITES``. ``readout_fn(attention_mask) -> LongTensor[B]``
    overrides the readout (tests use it to prove the self-check fires).
    ``keep_prefix``: rows (2·pair + side) that activation patching will re-run. Each runs alone as
    its prefix (all tokens but the last, KV-cached) and then its last token; the prefix's cache is
    kept in ``prefixes`` so ``models.patching.patch_readout`` need not recompute it (memory: one
    KV cache per row, so callers keep this list short).
    Raises ``CaptureError`` on a self-check mismatch or a non-finite score.
    """
    sites = tuple(s for s in LAYER_SITES if s in set(sites))
    seqs = [s for pair in zip(encoded.chosen, encoded.rejected) for s in pair]   # row 2i chosen, 2i+1 rejected
    n_pairs, L, d, K = len(encoded.pair_ids), lm.n_layers, lm.d_model, lm.head.n_outputs
    out = CaptureResult(pair_ids=list(encoded.pair_ids), h=np.zeros((n_pairs, 2, d), np.float32),
                        logits=np.zeros((n_pairs, 2, K), np.float32),
                        lengths=np.array([len(s) for s in seqs]).reshape(n_pairs, 2),
                        sites={s: np.zeros((n_pairs, 2, 1 if s == "embed" else L, _width(lm, s)), np.float32)
                               for s in sites},
                        counts={"forward_passes": 0, "tokens": 0, "padded_tokens": 0})
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    device = next(lm.model.parameters()).device
    rec = _Recorder(lm, sites)
    first: dict[tuple, int] = {}
    owners: dict[int, list[int]] = {}
    for r, sq in enumerate(seqs):                        # row -> first row with the same token ids
        owners.setdefault(first.setdefault(tuple(sq), r), []).append(r)
    keep = set() if readout_fn is not None else {tuple(seqs[r]) for r in keep_prefix if len(seqs[r]) > 1}
    solo = [u for u in sorted(owners) if tuple(seqs[u]) in keep]
    uniq = [u for u in sorted(owners) if tuple(seqs[u]) not in keep]
    batches = [[uniq[i] for i in b] for b in batches_by_length([len(seqs[u]) for u in uniq], batch_size, max_tokens)]
    try:
        it = [(False, b) for b in batches] + [(True, [u]) for u in solo]
        if progress:
            from tqdm.auto import tqdm
            it = tqdm(it, desc=f"capture {lm.name}", unit="batch")
        for alone, rows in it:
            if alone:
                ids, mask, res = _prefix_then_last(lm, rec, seqs[rows[0]], device, out)
                last_attended = torch.zeros(1, dtype=torch.long)   # one token: it is the readout
            else:
                ids, mask, pos, readout = pad_batch([seqs[r] for r in rows], pad_id, padding_side)
                last_attended = readout                      # from the mask (padding.pad_batch)
                if readout_fn is not None:
                    readout = readout_fn(mask)
                rec.start(readout, device)
                res = lm.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                               position_ids=pos.to(device), use_cache=False)
            src = np.array([j for j, r in enumerate(rows) for _ in owners[r]])
            dst = np.array([o for r in rows for o in owners[r]])
            pair_idx, side_idx = dst // 2, dst % 2
            h = rec.buf[("h", 0)].numpy()
            _self_check(lm, rows, out.pair_ids, h, rec.buf[("logits", 0)].numpy(), res.logits,
                        hf_pooled_index(ids, lm.model.config.pad_token_id), last_attended)
            out.h[pair_idx, side_idx] = h[src]
            out.logits[pair_idx, side_idx] = rec.buf[("logits", 0)].numpy()[src]
            for (site, layer), val in rec.buf.items():
                if site in out.sites:
                    out.sites[site][pair_idx, side_idx, layer] = val.numpy()[src]
            out.counts["forward_passes"] += 1
            out.counts["tokens"] += int(mask.sum())
            out.counts["padded_tokens"] += int(mask.numel())
    finally:
        rec.close()
    return out


def _prefix_then_last(lm, rec, ids, device, out):
    """Run ``ids`` as a KV-cached prefix (hooks off), then its last token (hooks on); keep the cache."""
    T = len(ids)
    rec.active = False
    try:
        pre = lm.model(input_ids=torch.tensor([ids[:-1]], device=device),
                       position_ids=torch.arange(T - 1, device=device)[None], use_cache=True)
    finally:
        rec.active = True
    cache = pre.cache if hasattr(pre, "cache") else pre.past_key_values
    out.prefixes[tuple(ids)] = cache
    rec.start(torch.zeros(1, dtype=torch.long), device)
    last = torch.tensor([[ids[-1]]])
    res = lm.model(input_ids=last.to(device), attention_mask=torch.ones((1, T), dtype=torch.long, device=device),
                   position_ids=torch.full((1, 1), T - 1, device=device), cache=copy.deepcopy(cache), use_cache=True)
    out.counts["forward_passes"] += 1                    # the prefix; the caller counts the last token
    out.counts["tokens"] += T - 1
    out.counts["padded_tokens"] += T - 1
    return last, torch.ones((1, 1), dtype=torch.long), res


def _self_check(lm, rows, pair_ids, h, head_out, pooled, hf_idx, last_attended):
    names = [f"{pair_ids[r // 2]}/{SIDES[r % 2]}" for r in rows]
    ours = lm.head.rewards(h)
    bad = ~np.isfinite(ours).all(-1) | ~np.isfinite(head_out).all(-1)
    if bad.any():
        raise CaptureError(f"{lm.name}: non-finite reward for {[n for n, b in zip(names, bad) if b]} "
                           f"(dtype {lm.dtype}); nothing was stored. Fix: use model.dtype=float32 or bfloat16.")
    tol = _TOL.get(lm.dtype, 1e-4)
    scale = 1.0 + np.abs(head_out)
    refs = [("head output at the readout token", head_out, np.ones(len(rows), bool))]
    # Where HF's pad-id pooling lands on the last attended token (computed here from the
    # mask, independently of the capture's readout), its pooled logits are a second reference.
    agree = (hf_idx.cpu() == last_attended.cpu()).numpy()
    refs.append(("the model's pooled logits", pooled.detach().float().cpu().numpy(), agree))
    for what, ref, use in refs:
        err = (np.abs(ours - ref) / scale).max(-1)
        wrong = use & (err > tol)
        if wrong.any():
            raise CaptureError(
                f"{lm.name}: self-check failed: W·h + b from captured h differs from {what} "
                f"(max rel. error {err[wrong].max():.3g} > {tol}) for {[n for n, w in zip(names, wrong) if w]}. "
                "The readout position or the head read-off is wrong; nothing was stored.")
