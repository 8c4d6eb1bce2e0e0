"""Activation patching at the readout position, and its gradient approximation.

Exact patching (Meng et al. 2022, "Locating and Editing Factual Associations";
Heimersheim & Nanda 2024, "How to use and interpret activation patching"):
run the *base* side with one site's activation at the readout token replaced
by the *source* side's, and re-read the reward. The readout token is the last
token, so under causal attention a patch there changes nothing at earlier
positions: prefixes run once, batched and KV-cached (``engine.prefix``; the capture
pass keeps them, ``capture(keep_prefix=)``), then only copies of the readout token run
again, one per patched site. Without a sliding window, one forward covers a group of
pairs: per pair one sequence of copies, all at the readout position, under a 4-D
attention mask letting each copy see its own prefix and itself only, and layers below a
copy's patch run copy 0 only (``engine.copy_skip``). Models with sliding-window layers
(their caches drop old keys) run the copies of one pair as rows over a repeated cache
instead. The first and last copies are unpatched and must reproduce the captured base
reward — a self-check that also fails if copies could see each other.

Attribution patching (Nanda 2023; Syed et al. 2023, "Attribution Patching
Outperforms Automated Circuit Discovery"): ``∇_a r_base · (a_src − a_base)``,
one backward per batch; first-order, labelled approximate.

Targets are ``(site, layer)`` with site ∈ {resid_post, attn_out, mlp_out, readout}
(``readout`` = the final-norm output h, where reward is exactly linear).
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..errors import CaptureError
from .capture import TOL
from .copy_skip import CopySkip, start_layer
from .prefix import run_prefix, sliding
from ..models.head import first_output, get_module, module_for
from ..models.padding import batches_by_length, pad_batch
from ..models.placement import input_device
from ..errors import SpecError
from transformers.utils import logging as hf_logging


def _source_act(cap, site, layer, pair, side):
    if site == "readout":
        return cap.h[pair, side]
    return cap.sites[site][pair, side, layer]


@torch.inference_mode()
def patch_readout(lm, encoded, cap, targets, pair_indices, *, mode: str = "denoise", chunk: int = 64,
                  group: int = 16):
    """Patched rewards, array (pair, target, objective) in reward units, plus counts.

    ``mode="denoise"``: base = rejected, source = chosen; ``"noise"``: the reverse. Pairs run in
    groups sharing one batched prefix cache (the capture's kept batches, else ``group`` pairs by
    length); each forward re-runs ``chunk`` targets' copies of every pair in the group.
    Raises ``CaptureError`` if an unpatched copy disagrees with the capture, or if a base side
    is a single token (no prefix).
    """
    base_side = 1 if mode == "denoise" else 0
    dev = input_device(lm.model)
    dtype = next(lm.model.parameters()).dtype
    packed = not sliding(lm)
    seqs = {p: list((encoded.rejected if base_side else encoded.chosen)[p]) for p in pair_indices}
    out = np.zeros((len(pair_indices), len(targets), lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "tokens": 0, "copy_layers": 0, "copy_layers_unskipped": 0}
    for pb, prow, members in patch_groups(lm, cap, encoded, seqs, pair_indices, group if packed else 1, dev, counts):
        for start in range(0, len(targets), chunk):
            part = targets[start:start + chunk]
            n = len(part) + 2                            # unpatched copies first and last
            vals = {}
            for row, (site, layer) in enumerate(part, start=1):
                v = np.stack([_source_act(cap, site, layer, p, 1 - base_side) for _, p in members])
                vals.setdefault((site, layer), []).append((row, torch.as_tensor(v)))   # (pair, width)
            cache, pmask, lengths = pb.take(prow)
            last = torch.tensor([seqs[p][-1] for _, p in members], device=dev)
            gate = _gate(cap, [p for _, p in members], base_side)       # (pair, 1, objective) or None
            if packed:
                r = _run_packed(lm, part, vals, cache, pmask, lengths, last, n, dtype, dev, counts, gate)
            else:
                r = _run_rows(lm, vals, cache, pmask, lengths, last, n, dev, None if gate is None else gate[0])
            keep_checked_rows(lm, cap, encoded, members, r, n, base_side, out, start, counts)
    return out, counts


def keep_checked_rows(lm, cap, encoded, members, r, n: int, base_side: int, out, start: int, counts) -> None:
    """One batch of copies done: count it, check each member's two unpatched copies (rows 0 and ``n − 1``)
    against its captured base reward (``check_unpatched``), and keep the patched rows ``r[b, 1:-1]`` in
    ``out[pair, start:…]``. ``members``: (row in ``out``, pair index) per batch row."""
    counts["forward_passes"] += 1
    counts["tokens"] += n * len(members)
    for b, (pi, p) in enumerate(members):
        ref = base_reward(lm, cap, p, base_side)
        for row in (0, n - 1):
            check_unpatched(lm, r[b, row], ref, encoded.pair_ids[p])
        out[pi, start:start + r.shape[1] - 2] = r[b, 1:-1]


def patch_groups(lm, cap, encoded, seqs, pair_indices, group, dev, counts):
    """Yield ``(PrefixBatch, its rows, [(output index, pair)])``: kept capture batches first, then
    prefix batches built here for the other pairs, ``group`` pairs each, by length."""
    kept: dict[int, list] = {}
    rest = []
    for pi, p in enumerate(pair_indices):
        loc = cap.prefixes.get(tuple(seqs[p]))
        if loc is None:
            rest.append((pi, p))
        else:
            kept.setdefault(loc[0], []).append((loc[1], (pi, p)))
    for k, items in kept.items():
        for i in range(0, len(items), group):
            part = items[i:i + group]
            yield cap.prefix_batches[k], [r for r, _ in part], [m for _, m in part]
    rest.sort(key=lambda m: (len(seqs[m[1]]), m[0]))
    for i in range(0, len(rest), group):
        part = rest[i:i + group]
        names = [f"{encoded.pair_ids[p]}/base side" for _, p in part]
        pb = run_prefix(lm, [seqs[p] for _, p in part], dev, names)
        counts["forward_passes"] += 1
        counts["tokens"] += int(pb.lengths.sum()) - len(part)
        yield pb, list(range(len(part))), part


def _gate(cap, pairs, side):
    """Captured gate weights of a context-gated head (ArmoRM) for ``pairs``' ``side``: (pair, 1, objective)."""
    return None if cap.gate is None else cap.gate[pairs, side][:, None]


def _run_packed(lm, part, vals, cache, pmask, lengths, last, n, dtype, dev, counts, gate=None):
    """Copies as one sequence per pair under a 4-D mask, layers below each patch skipped; (pair, copy, output)."""
    B, P = pmask.shape
    skip = CopySkip(lm, np.array([0] + [start_layer(s, l, lm.n_layers) for s, l in part] + [0]), P, B)
    hooks = [(module_for(lm, site, layer), replacer(local_items(skip, site, layer, items), packed=True))
             for (site, layer), items in vals.items()]
    skip.attach()
    try:
        r = patched_rewards(lm, hooks, input_ids=last[:, None].expand(B, n), attention_mask=copies_mask(
            pmask, n, dtype), position_ids=torch.as_tensor(lengths - 1, device=dev)[:, None].expand(B, n),
            cache=cache, use_cache=True, packed=True, gate=gate)
    finally:
        skip.close()
    counts["copy_layers"] += B * int(sum(a.size for a in skip.active))
    counts["copy_layers_unskipped"] += B * n * lm.n_layers
    return r


def _run_rows(lm, vals, cache, pmask, lengths, last, n, dev, gate=None):
    """Copies as batch rows over a repeated cache (sliding-window models; one pair): (1, copy, output)."""
    cache.batch_repeat_interleave(n)
    mask = torch.cat([pmask, torch.ones((1, 1), dtype=pmask.dtype, device=dev)], 1).expand(n, -1)
    hooks = [(module_for(lm, site, layer), replacer(items)) for (site, layer), items in vals.items()]
    r = patched_rewards(lm, hooks, input_ids=last[:, None].expand(n, 1), attention_mask=mask,
                         position_ids=torch.full((n, 1), int(lengths[0]) - 1, device=dev), cache=cache,
                         use_cache=True, gate=gate)
    return r[None]


def local_items(skip, site, layer, items):
    """``items`` with copy indices as the hooked module sees them (active copies only, inside a layer)."""
    if site not in ("attn_out", "mlp_out"):
        return items
    return list(zip(skip.local_rows(layer, [r for r, _ in items]), [v for _, v in items]))


def copies_mask(pmask: torch.Tensor, n: int, dtype) -> torch.Tensor:
    """Additive 4-D mask (B, 1, n, P + n): copy j sees its row's real prefix keys and its own key only."""
    B, P = pmask.shape
    lo = torch.finfo(dtype).min
    mask = torch.full((B, 1, n, P + n), lo, dtype=dtype, device=pmask.device)
    mask[:, 0, :, :P] = torch.where(pmask.bool(), 0.0, lo)[:, None, :]
    j = torch.arange(n, device=pmask.device)
    mask[:, 0, j, P + j] = 0
    return mask


@contextlib.contextmanager
def quiet_transformers():
    """Silence HF's note that pad detection is off with inputs_embeds: our readout comes from the mask."""
    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)


def replacer(items, packed: bool = False):
    """Hook writing ``items`` ((copy, values (pair, width)) pairs) into copies: positions of every
    pair's sequence (``packed``) or rows of one pair (last token)."""
    rows = [r for r, _ in items]
    vals = torch.stack([v for _, v in items], 1)         # (pair, copy, width)

    def hook(mod, args, output):
        x = first_output(output).clone()
        if packed:
            x[:, rows] = vals.to(x.dtype).to(x.device)
        else:
            x[rows, -1] = vals[0].to(x.dtype).to(x.device)
        return (x,) + tuple(output[1:]) if isinstance(output, tuple) else x
    return hook


def attribution_patch(lm, encoded, cap, targets, pair_indices, *, mode: str = "denoise", batch_size: int = 16):
    """First-order patch estimates, array (pair, target, objective); one backward per objective per batch."""
    base_side = 1 if mode == "denoise" else 0
    dev = input_device(lm.model)
    seqs = [list((encoded.rejected if base_side else encoded.chosen)[p]) for p in pair_indices]
    out = np.zeros((len(pair_indices), len(targets), lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "backward_passes": 0}
    modules = [(t, module_for(lm, site, layer)) for t, (site, layer) in enumerate(targets)]
    for rows in batches_by_length([len(s) for s in seqs], batch_size):
        ids, mask, pos, readout = pad_batch([seqs[r] for r in rows], lm.model.config.pad_token_id, "left")
        kept: dict = {}
        handles = [m.register_forward_hook(lambda mod, a, o, t=t: kept.__setitem__(t, first_output(o)))
                   for t, m in modules]
        head = get_module(lm.model, lm.family.head)        # the model's own head: linear or gated
        handles.append(head.register_forward_hook(lambda mod, a, o: kept.__setitem__("r", first_output(o))))
        try:
            with torch.enable_grad(), quiet_transformers():
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
    bad = misaligned_pairs(encoded, pair_indices)
    if bad:
        raise SpecError("observable.positions", f"positions=all needs both sides of a pair to tokenize to equal "
                        f"length; {len(bad)} pair(s) do not: {bad[:10]}.",
                        fix="use positions=readout, or select pairs of equal length (dataset.limit / a filtered file).")
    base_side = 1 if mode == "denoise" else 0
    dev = input_device(lm.model)
    out = np.zeros((len(pair_indices), len(targets), lm.head.n_outputs), np.float64)
    counts = {"forward_passes": 0, "tokens": 0}
    for pi, p in enumerate(pair_indices):
        base = list((encoded.rejected if base_side else encoded.chosen)[p])
        src = list((encoded.chosen if base_side else encoded.rejected)[p])
        T = len(base)
        src_acts: dict = {}
        hooks = [module_for(lm, s, l).register_forward_hook(
            lambda m, a, o, k=(s, l): src_acts.__setitem__(k, first_output(o)[0].clone())) for s, l in set(targets)]
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
            hooks = [(module_for(lm, s, l), _full_replacer(rows, src_acts[(s, l)])) for (s, l), rows in by_module.items()]
            r = patched_rewards(lm, hooks, input_ids=torch.tensor([base] * n, device=dev),
                                 position_ids=torch.arange(T, device=dev)[None].expand(n, T),
                                 gate=None if cap.gate is None else cap.gate[p, base_side])
            counts["forward_passes"] += 1
            counts["tokens"] += n * T
            check_unpatched(lm, r[0], base_reward(lm, cap, p, base_side), encoded.pair_ids[p])
            out[pi, start:start + len(part)] = r[1:]
    return out, counts


def patched_rewards(lm, hooks, packed: bool = False, gate=None, **model_kwargs) -> np.ndarray:
    """One forward with ``(module, hook)`` pairs attached; rewards read at each row's last position,
    (copy, output), or (``packed``) at every position of every pair's sequence, (pair, copy, output)."""
    hbuf: dict = {}
    handles = [m.register_forward_hook(h) for m, h in hooks]
    handles.append(lm.norm.module.register_forward_hook(
        lambda m, a, o: hbuf.__setitem__("h", (first_output(o) if packed else first_output(o)[:, -1]).float().cpu().numpy())))
    try:
        lm.model(**model_kwargs)
    finally:
        for h in handles:
            h.remove()
    return lm.head.rewards(hbuf["h"], gate)          # a context gate frozen at the base side's capture


def base_reward(lm, cap, pair: int, side: int) -> np.ndarray:
    """``W·h + b`` (output,) from the captured ``h``: the same float32 read-off as every patched
    reward, so a no-op patch has effect 0 in any model dtype (the model's own bf16/fp16 head
    output differs from it by its rounding, ~|r|·2⁻⁸ in bf16)."""
    return lm.head.rewards(cap.h[pair, side], None if cap.gate is None else cap.gate[pair, side])


def check_unpatched(lm, got, ref, pair_id) -> None:
    """An unpatched copy must reproduce the captured base reward: within 1e-3 (relative to
    1 + |r|) in float32, within the capture self-check's tolerance in bfloat16/float16.
    Raises ``CaptureError`` naming the pair otherwise. (Public: ``ops.steer`` uses it.)"""
    tol = 1e-3 if lm.dtype == "float32" else TOL.get(lm.dtype, 1e-3)
    if np.abs(got - ref).max() > tol * (1 + np.abs(ref).max()):
        raise CaptureError(f"{lm.name}: the unpatched re-run of pair {pair_id} gives {got} but the capture "
                           f"gave {ref} (tolerance {tol} for {lm.dtype}); patching results would be wrong.")


def _full_replacer(rows, value):
    def hook(mod, args, output):
        x = first_output(output).clone()
        x[rows] = value.to(x.dtype)
        return (x,) + tuple(output[1:]) if isinstance(output, tuple) else x
    return hook
