"""Set activations at the readout token to given values and re-read the reward, batched.

The engine behind head patching, ablations and steering. It is ``engine.patching``'s exact
patching with the values supplied by the caller instead of read from the other side: the
same prefix KV caches (``patch_groups``), the same packed forward (copies of the readout token as
one sequence per pair under a 4-D mask, layers below each copy's intervention skipped,
``engine.copy_skip``), the same rows-over-a-repeated-cache path for sliding-window models and
the same self-check (the first and last copies are unpatched and must reproduce the captured
base reward).

Targets are ``(site, layer, head)``, or a tuple of them set together in one copy (a compound target, e.g. an
ablation and a restore downstream of it; ``values`` then returns one array per setting, in order; no two
settings of one target may name the same module):
  ``resid_post`` | ``attn_out`` | ``mlp_out``  the module's output at the readout token is set
                                             to the value (width d_model); ``head`` is ignored
  ``head``                                   head ``head``'s slice of the attention output
                                             projection's input z (width head_dim) is set: a
                                             forward pre-hook on ``o_proj`` swaps that slice
                                             (Elhage et al. 2021: head h writes W_O[:, h]·z_h)

``head_attribution`` is the gradient × difference estimate per head,
``∇_{z_h} r_base · (z_h,src − z_h,base)`` (Nanda 2023; Syed et al. 2023), one backward per
objective per batch. Over heads it sums to ``∇_z r · Δz = ∇_a r · W_O Δz = ∇_a r · Δa``, the
attention-output attribution (o_proj is affine), up to float rounding.
"""
from __future__ import annotations

import numpy as np
import torch

from .attn_heads import n_heads
from .copy_skip import CopySkip, start_layer
from ..models.head import first_output, get_module, module_for
from ..models.padding import batches_by_length, pad_batch
from .patching import (copies_mask, keep_checked_rows, local_items, patch_groups, patched_rewards,
                       quiet_transformers, replacer)
from .prefix import sliding
from ..models.placement import input_device

SITES = ("resid_post", "attn_out", "mlp_out", "head")


def head_dim(lm) -> int:
    """Width of one head's slice of the o_proj input (n_heads · head_dim = the captured ``attn_z`` width)."""
    o = get_module(get_module(lm.model, lm.family.layers)[0], lm.family.o_proj)
    width = int(o.weight.shape[0] if lm.family.o_proj_conv1d else o.weight.shape[1])
    return width // n_heads(lm.model.config)


def o_proj(lm, layer: int):
    return get_module(get_module(lm.model, lm.family.layers)[layer], lm.family.o_proj)


@torch.inference_mode()
def set_readout(lm, encoded, cap, targets, values, pair_indices, *, base_side: int, chunk: int = 64,
                group: int = 16, keep_final: bool = False):
    """Rewards with each target's activation at the readout token set: (pair, target, output), plus counts.

    ``targets``: list of ``(site, layer, head)`` (see the module docstring); ``values(t, pairs)``
    → array (len(pairs), width) for target index ``t`` and pair indices ``pairs``; ``base_side``
    0 runs the chosen sides, 1 the rejected sides. ``keep_final``: also return the last layer's
    resid_post of every copy, (pair, target, d_model) float32, as a third value. Raises
    ``CaptureError`` if an unpatched copy disagrees with the capture, or if a side is a single token.
    """
    dev = input_device(lm.model)
    dtype = next(lm.model.parameters()).dtype
    packed = not sliding(lm)
    seqs = {p: list((encoded.rejected if base_side else encoded.chosen)[p]) for p in pair_indices}
    out = np.zeros((len(pair_indices), len(targets), lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "tokens": 0, "copy_layers": 0}
    final = np.zeros((len(pair_indices), len(targets), lm.d_model), np.float32) if keep_final else None
    for pb, prow, members in patch_groups(lm, cap, encoded, seqs, pair_indices, group if packed else 1, dev, counts):
        pairs = [p for _, p in members]
        for start in range(0, len(targets), chunk):
            part = targets[start:start + chunk]
            n = len(part) + 2                            # unpatched copies first and last
            vals = [_tensors(part[i], values(start + i, pairs)) for i in range(len(part))]
            cache, pmask, lengths = pb.take(prow)
            last = torch.tensor([seqs[p][-1] for p in pairs], device=dev)
            run = _run_packed if packed else _run_rows
            gate = None if cap.gate is None else cap.gate[pairs, base_side]          # ArmoRM: frozen at capture
            kept: dict = {}
            h = lm.norm.module.register_forward_pre_hook(lambda m, a: kept.__setitem__("x", a[0])) \
                if keep_final else None        # the final norm's input: after every layer's hooks
            try:
                r = run(lm, part, vals, cache, pmask, lengths, last, n, dtype, dev, counts, gate)
            finally:
                if h is not None:
                    h.remove()
            if keep_final:                          # packed: (pair, copy, d); rows: (copy, 1, d)
                x = kept["x"].float().cpu().numpy()
                x = x if packed else x[:, -1][None]
                for b, (pi, _) in enumerate(members):
                    final[pi, start:start + len(part)] = x[b, 1:-1]
            keep_checked_rows(lm, cap, encoded, members, r, n, base_side, out, start, counts)
    return (out, counts, final) if keep_final else (out, counts)


def settings(target) -> tuple:
    """A target's settings: ``((site, layer, head),)``, or the tuple a compound target lists."""
    return tuple(target) if isinstance(target[0], tuple) else (target,)


def _tensors(target, v) -> tuple:
    """The values of one target as float32 tensors, one per setting."""
    vs = tuple(v) if isinstance(target[0], tuple) else (v,)
    return tuple(torch.as_tensor(np.asarray(x, np.float32)) for x in vs)


def _by_module(part, vals):
    """``{(site, layer): [(copy row, values (pair, width), head)]}``; copy rows start at 1."""
    by: dict = {}
    for row, (t, vs) in enumerate(zip(part, vals), start=1):
        for (site, layer, h), v in zip(settings(t), vs):
            by.setdefault((site, layer), []).append((row, v, h))
    return by


def _head_setter(lm, items, packed: bool):
    """Pre-hook on o_proj setting head slices of its input z: ``items`` = [(copy, values, head)]."""
    hd = head_dim(lm)

    def hook(mod, args):
        z = args[0].clone()
        for row, v, h in items:
            if packed:
                z[:, row, h * hd:(h + 1) * hd] = v.to(z.dtype).to(z.device)
            else:
                z[row, -1, h * hd:(h + 1) * hd] = v[0].to(z.dtype).to(z.device)
        return (z,) + tuple(args[1:])
    return hook


def _hooks(lm, part, vals, skip, packed):
    fwd, pre = [], []
    for (site, layer), items in _by_module(part, vals).items():
        if site == "head":
            rows = [r for r, _, _ in items]
            if skip is not None:
                rows = skip.local_rows(layer, rows)     # o_proj sits inside the layer: active copies only
            pre.append((o_proj(lm, layer), _head_setter(lm, [(r, v, h) for r, (_, v, h) in zip(rows, items)],
                                                         packed)))
        else:
            pv = [(r, v) for r, v, _ in items]
            fwd.append((module_for(lm, site, layer), replacer(local_items(skip, site, layer, pv) if skip else pv,
                                                                 packed=packed)))
    return fwd, pre


def _start(site, layer, n_layers):
    return layer if site == "head" else start_layer(site, layer, n_layers)


def _run_packed(lm, part, vals, cache, pmask, lengths, last, n, dtype, dev, counts, gate=None):
    B, P = pmask.shape
    first = [min(_start(s, l, lm.n_layers) for s, l, _ in settings(t)) for t in part]
    skip = CopySkip(lm, np.array([0] + first + [0]), P, B)
    fwd, pre = _hooks(lm, part, vals, skip, packed=True)
    skip.attach()
    handles = [m.register_forward_pre_hook(h) for m, h in pre]
    try:
        r = patched_rewards(lm, fwd, input_ids=last[:, None].expand(B, n), attention_mask=copies_mask(
            pmask, n, dtype), position_ids=torch.as_tensor(lengths - 1, device=dev)[:, None].expand(B, n),
            cache=cache, use_cache=True, packed=True,
            gate=None if gate is None else np.repeat(gate[:, None], n, 1))
    finally:
        for h in handles:
            h.remove()
        skip.close()
    counts["copy_layers"] += B * int(sum(a.size for a in skip.active))
    return r


def _run_rows(lm, part, vals, cache, pmask, lengths, last, n, dtype, dev, counts, gate=None):
    """Sliding-window models: copies as batch rows over a repeated cache (one pair)."""
    cache.batch_repeat_interleave(n)
    mask = torch.cat([pmask, torch.ones((1, 1), dtype=pmask.dtype, device=dev)], 1).expand(n, -1)
    fwd, pre = _hooks(lm, part, vals, None, packed=False)
    handles = [m.register_forward_pre_hook(h) for m, h in pre]
    try:
        r = patched_rewards(lm, fwd, input_ids=last[:, None].expand(n, 1), attention_mask=mask,
                             position_ids=torch.full((n, 1), int(lengths[0]) - 1, device=dev), cache=cache,
                             use_cache=True, gate=None if gate is None else np.repeat(gate[:1], n, 0))
    finally:
        for h in handles:
            h.remove()
    counts["copy_layers"] += n * lm.n_layers
    return r[None]


def head_attribution(lm, encoded, cap, layers, pair_indices, *, mode: str = "denoise", batch_size: int = 16):
    """Gradient × difference per head: array (pair, layer, head, output), plus counts.

    ``mode="denoise"``: gradient on the rejected side, ``Δz = z_chosen − z_rejected``; ``"noise"``
    the reverse. Needs ``attn_z`` in the capture. Approximate (first order).
    """
    base_side = 1 if mode == "denoise" else 0
    dev = input_device(lm.model)
    H, hd = n_heads(lm.model.config), head_dim(lm)
    seqs = [list((encoded.rejected if base_side else encoded.chosen)[p]) for p in pair_indices]
    z = cap.sites["attn_z"][pair_indices][:, :, list(layers)].astype(np.float64)    # pair × side × layer × H·hd
    dz = (z[:, 1 - base_side] - z[:, base_side]).reshape(len(pair_indices), len(layers), H, hd)
    out = np.zeros((len(pair_indices), len(layers), H, lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "backward_passes": 0}
    for rows in batches_by_length([len(s) for s in seqs], batch_size):
        ids, mask, pos, readout = pad_batch([seqs[r] for r in rows], lm.model.config.pad_token_id, "left")
        kept: dict = {}
        handles = [o_proj(lm, l).register_forward_pre_hook(lambda m, a, i=i: kept.__setitem__(i, a[0]))
                   for i, l in enumerate(layers)]
        head = get_module(lm.model, lm.family.head)
        handles.append(head.register_forward_hook(lambda m, a, o: kept.__setitem__("r", first_output(o))))
        try:
            with torch.enable_grad(), quiet_transformers():
                emb = lm.model.get_input_embeddings()(ids.to(dev)).detach().requires_grad_(True)
                lm.model(inputs_embeds=emb, attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
                ridx, ro = torch.arange(len(rows), device=dev), readout.to(dev)
                r = kept["r"][ridx, ro].float()
                zs = [kept[i] for i in range(len(layers))]
                for k in range(r.shape[-1]):
                    grads = torch.autograd.grad(r[:, k].sum(), zs, retain_graph=k < r.shape[-1] - 1)
                    for i, g in enumerate(grads):
                        gz = g[ridx, ro].double().cpu().numpy().reshape(len(rows), H, hd)
                        out[rows, i, :, k] = np.einsum("bhk,bhk->bh", gz, dz[rows, i])
                    counts["backward_passes"] += 1
            counts["forward_passes"] += 1
        finally:
            for hd_ in handles:
                hd_.remove()
    return out, counts
