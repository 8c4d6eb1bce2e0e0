"""Activation patching at the readout position, and its gradient approximation.

Exact patching (Meng et al. 2022, "Locating and Editing Factual Associations";
Heimersheim & Nanda 2024, "How to use and interpret activation patching"):
run the *base* side with one site's activation at the readout token replaced
by the *source* side's, and re-read the reward. The readout token is the last
token, so under causal attention a patch there changes nothing at earlier
positions: the prefix is run once with a KV cache, then only the readout token
is re-run, once per patched site, all sites of a pair in one forward. Without a sliding
window, that forward is one sequence: the readout token repeated once per site, all at its
position, under a 4-D attention mask letting each copy see the prefix and itself only, so the
prefix's KV cache is read once instead of copied per site. Models with sliding-window layers
(their caches drop old keys) batch the copies as rows over a repeated cache instead. The first
and last copies are unpatched and must reproduce the captured base reward — a self-check that
also fails if copies could see each other. The prefix cache comes from the capture pass when it
kept it (``capture(keep_prefix=)``).

Attribution patching (Nanda 2023; Syed et al. 2023, "Attribution Patching
Outperforms Automated Circuit Discovery"): ``∇_a r_base · (a_src − a_base)``,
one backward per batch; first-order, labelled approximate.

Targets are ``(site, layer)`` with site ∈ {resid_post, attn_out, mlp_out, readout}
(``readout`` = the final-norm output h, where reward is exactly linear).
"""
from __future__ import annotations

import contextlib
import copy

import numpy as np
import torch

from ..errors import CaptureError
from .capture import _first
from .head import get_module
from .padding import batches_by_length, pad_batch


def _module_for(lm, site: str, layer: int):
    if site == "readout":
        return lm.norm.module
    block = get_module(lm.model, lm.family.layers)[layer]
    return {"resid_post": block, "attn_out": get_module(block, lm.family.attn),
            "mlp_out": get_module(block, lm.family.mlp)}[site]


def _source_act(cap, site, layer, pair, side):
    if site == "readout":
        return cap.h[pair, side]
    return cap.sites[site][pair, side, layer]


@torch.inference_mode()
def patch_readout(lm, encoded, cap, targets, pair_indices, *, mode: str = "denoise", chunk: int = 64):
    """Patched rewards, array (pair, target, objective) in reward units, plus counts.

    ``mode="denoise"``: base = rejected, source = chosen; ``"noise"``: the reverse.
    Raises ``CaptureError`` if the unpatched re-run disagrees with the capture.
    """
    base_side = 1 if mode == "denoise" else 0
    dev = next(lm.model.parameters()).device
    dtype = next(lm.model.parameters()).dtype
    packed = not _sliding(lm)
    out = np.zeros((len(pair_indices), len(targets), lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "tokens": 0}
    for pi, p in enumerate(pair_indices):
        ids = list((encoded.rejected if base_side else encoded.chosen)[p])
        T = len(ids)
        cache = cap.prefixes.get(tuple(ids))              # kept by the capture pass (capture(keep_prefix=))
        if cache is None:
            prefix = lm.model(input_ids=torch.tensor([ids[:-1]], device=dev),
                              position_ids=torch.arange(T - 1, device=dev)[None], use_cache=True)
            cache = prefix.cache if hasattr(prefix, "cache") else prefix.past_key_values
            counts["forward_passes"] += 1
            counts["tokens"] += T - 1
        for start in range(0, len(targets), chunk):
            part = targets[start:start + chunk]
            n = len(part) + 2                            # unpatched copies first and last
            c = copy.deepcopy(cache)
            by_module: dict = {}
            for row, (site, layer) in enumerate(part, start=1):
                src = torch.as_tensor(_source_act(cap, site, layer, p, 1 - base_side))
                by_module.setdefault((site, layer), []).append((row, src))
            hooks = [(_module_for(lm, site, layer), _replacer(items, packed)) for (site, layer), items in
                     by_module.items()]
            if packed:
                r = _patched_rewards(lm, hooks, input_ids=torch.tensor([[ids[-1]] * n], device=dev),
                                     attention_mask=_copies_mask(n, T, dtype, dev), position_ids=torch.full(
                                         (1, n), T - 1, device=dev), cache=c, use_cache=True, packed=True)
            else:
                c.batch_repeat_interleave(n)
                r = _patched_rewards(lm, hooks, input_ids=torch.tensor([[ids[-1]]] * n, device=dev),
                                     attention_mask=torch.ones((n, T), dtype=torch.long, device=dev),
                                     position_ids=torch.full((n, 1), T - 1, device=dev), cache=c, use_cache=True)
            counts["forward_passes"] += 1
            counts["tokens"] += n
            for row in (0, n - 1):
                _check_unpatched(lm, r[row], cap.logits[p, base_side], encoded.pair_ids[p])
            out[pi, start:start + len(part)] = r[1:-1]
    return out, counts


def _sliding(lm) -> bool:
    """Whether any layer attends over a sliding window (its cache drops old keys)."""
    cfg = lm.model.config
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        return True
    return getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True) is not False


def _copies_mask(n: int, T: int, dtype, device) -> torch.Tensor:
    """Additive 4-D mask (1, 1, n, T − 1 + n): copy j sees the T − 1 prefix keys and its own key only."""
    mask = torch.full((1, 1, n, T - 1 + n), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[..., : T - 1] = 0
    j = torch.arange(n, device=device)
    mask[0, 0, j, T - 1 + j] = 0
    return mask


@contextlib.contextmanager
def _quiet_transformers():
    """Silence HF's note that pad detection is off with inputs_embeds: our readout comes from the mask."""
    from transformers.utils import logging as hf_logging
    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)


def _replacer(items, packed: bool = False):
    """Hook writing ``items`` ((copy, value) pairs): copies are rows (last token) or, ``packed``, positions."""
    rows = [r for r, _ in items]
    vals = torch.stack([v for _, v in items])

    def hook(mod, args, output):
        x = _first(output).clone()
        if packed:
            x[0, rows] = vals.to(x.dtype).to(x.device)
        else:
            x[rows, -1] = vals.to(x.dtype).to(x.device)
        return (x,) + tuple(output[1:]) if isinstance(output, tuple) else x
    return hook


def attribution_patch(lm, encoded, cap, targets, pair_indices, *, mode: str = "denoise", batch_size: int = 16):
    """First-order patch estimates, array (pair, target, objective); one backward per objective per batch."""
    base_side = 1 if mode == "denoise" else 0
    dev = next(lm.model.parameters()).device
    seqs = [list((encoded.rejected if base_side else encoded.chosen)[p]) for p in pair_indices]
    out = np.zeros((len(pair_indices), len(targets), lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "backward_passes": 0}
    modules = [(t, _module_for(lm, site, layer)) for t, (site, layer) in enumerate(targets)]
    for rows in batches_by_length([len(s) for s in seqs], batch_size):
        ids, mask, pos, readout = pad_batch([seqs[r] for r in rows], lm.model.config.pad_token_id, "left")
        kept: dict = {}
        handles = [m.register_forward_hook(lambda mod, a, o, t=t: kept.__setitem__(t, _first(o)))
                   for t, m in modules]
        head = get_module(lm.model, lm.family.head)        # the model's own head: linear or gated
        handles.append(head.register_forward_hook(lambda mod, a, o: kept.__setitem__("r", _first(o))))
        try:
            with torch.enable_grad(), _quiet_transformers():
                emb = lm.model.get_input_embeddings()(ids.to(dev)).detach().requires_grad_(True)
                lm.model(inputs_embeds=emb, attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
                ridx, ro = torch.arange(len(rows), device=dev), readout.to(dev)
                r = kept["r"][ridx, ro].float()                 # (batch, output)
                uniq = list(dict.fromkeys(id(kept[t]) for t in range(len(targets))))
                tensors = {id(kept[t]): kept[t] for t in range(len(targets))}
                for k in range(r.shape[-1]):
                    grads = torch.autograd.grad(r[:, k].sum(), [tensors[u] for u in uniq],
                                                retain_graph=k < r.shape[-1] - 1)
                    g_of = dict(zip(uniq, grads))
                    for t, (site, layer) in enumerate(targets):
                        g = g_of[id(kept[t])][ridx, ro].float().cpu().numpy()
                        for j, r in enumerate(rows):
                            p = pair_indices[r]
                            delta = _source_act(cap, site, layer, p, 1 - base_side) - \
                                _source_act(cap, site, layer, p, base_side)
                            out[r, t, k] = float(g[j] @ delta)
                    counts["backward_passes"] += 1
                del r
            counts["forward_passes"] += 1
        finally:
            for hd in handles:
                hd.remove()
    return out, counts


def misaligned_pairs(encoded, pair_indices) -> list[str]:
    """Pairs whose two sides tokenize to different lengths (cannot be patched position by position)."""
    return [encoded.pair_ids[p] for p in pair_indices if len(encoded.chosen[p]) != len(encoded.rejected[p])]


@torch.inference_mode()
def patch_all_positions(lm, encoded, cap, targets, pair_indices, *, mode: str = "denoise", chunk: int = 32):
    """Patch a site at EVERY position (sides must tokenize to equal length): (pair, target, output).

    One forward of the source side keeps each target's full-sequence output; then the
    base side runs once per chunk of targets, row 0 unpatched (checked against the capture).
    Raises ``SpecError`` (``observable.positions``) naming the misaligned pairs.
    """
    from ..errors import SpecError

    bad = misaligned_pairs(encoded, pair_indices)
    if bad:
        raise SpecError("observable.positions", f"positions=all needs both sides of a pair to tokenize to equal "
                        f"length; {len(bad)} pair(s) do not: {bad[:10]}.",
                        fix="use positions=readout, or select pairs of equal length (dataset.limit / a filtered file).")
    base_side = 1 if mode == "denoise" else 0
    dev = next(lm.model.parameters()).device
    out = np.zeros((len(pair_indices), len(targets), lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "tokens": 0}
    for pi, p in enumerate(pair_indices):
        base = list((encoded.rejected if base_side else encoded.chosen)[p])
        src = list((encoded.chosen if base_side else encoded.rejected)[p])
        T = len(base)
        src_acts: dict = {}
        hooks = [_module_for(lm, s, l).register_forward_hook(
            lambda m, a, o, k=(s, l): src_acts.__setitem__(k, _first(o)[0].clone())) for s, l in set(targets)]
        try:
            lm.model(input_ids=torch.tensor([src], device=dev), position_ids=torch.arange(T, device=dev)[None])
        finally:
            for h in hooks:
                h.remove()
        counts["forward_passes"] += 1
        counts["tokens"] += T
        for start in range(0, len(targets), chunk):
            part = targets[start:start + chunk]
            n = len(part) + 1
            by_module: dict = {}
            for row, key in enumerate(part, start=1):
                by_module.setdefault(key, []).append(row)
            hooks = [(_module_for(lm, s, l), _full_replacer(rows, src_acts[(s, l)])) for (s, l), rows in by_module.items()]
            r = _patched_rewards(lm, hooks, input_ids=torch.tensor([base] * n, device=dev),
                                 position_ids=torch.arange(T, device=dev)[None].expand(n, T))
            counts["forward_passes"] += 1
            counts["tokens"] += n * T
            _check_unpatched(lm, r[0], cap.logits[p, base_side], encoded.pair_ids[p])
            out[pi, start:start + len(part)] = r[1:]
    return out, counts


def _patched_rewards(lm, hooks, packed: bool = False, **model_kwargs) -> np.ndarray:
    """One forward with ``(module, hook)`` pairs attached; rewards (copy, output), read at each row's
    last position, or (``packed``) at every position of the one sequence."""
    hbuf: dict = {}
    handles = [m.register_forward_hook(h) for m, h in hooks]
    handles.append(lm.norm.module.register_forward_hook(
        lambda m, a, o: hbuf.__setitem__("h", (_first(o)[0] if packed else _first(o)[:, -1]).float().cpu().numpy())))
    try:
        lm.model(**model_kwargs)
    finally:
        for h in handles:
            h.remove()
    return lm.head.rewards(hbuf["h"])


def _check_unpatched(lm, got, ref, pair_id) -> None:
    """Row 0 of every patched forward is unpatched: it must reproduce the captured base reward."""
    if lm.dtype == "float32" and np.abs(got - ref).max() > 1e-3 * (1 + np.abs(ref).max()):
        raise CaptureError(f"{lm.name}: the unpatched re-run of pair {pair_id} gives {got} but the capture "
                           f"gave {ref}; patching results would be wrong.")


def _full_replacer(rows, value):
    def hook(mod, args, output):
        x = _first(output).clone()
        x[rows] = value.to(x.dtype)
        return (x,) + tuple(output[1:]) if isinstance(output, tuple) else x
    return hook
