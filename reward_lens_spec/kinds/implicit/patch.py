"""Patching a DPO policy on its implicit reward: re-run the policy with one site taken from the reference.

The implicit reward ``β·Σ_t [log π − log π_ref]`` is a nonlinear function of the policy's activations at every
response position, so a patch re-runs the policy with one site's output replaced at every position and
recomputes the reward. The source of the patched activation is the reference model on the same tokens
(positions align exactly, whatever the two responses' lengths): patching site ``s`` asks how much of the
implicit reward the policy's change at ``s`` carries. Patching every site gives the reference, whose implicit
reward against itself is 0. Sites (``target = (site, layer)``): ``resid_post`` (the layer's output),
``attn_out``, ``mlp_out`` (what the layer's attention / MLP adds), the family tables' modules.

``patch_rewards``: exact — for every row (pair, side), the implicit reward unpatched and with each target
patched, computed in the same batches (so an identical activation patched in changes nothing, bit for bit).
``attribution_rewards``: first order — ``Σ_{t,d} ∂r/∂a_{t,d} · (a^ref_{t,d} − a_{t,d})`` over every real
position, one forward and backward of the policy per batch (Syed et al. 2023, attribution patching).
Both need a reference with the policy's architecture; ``SpecError`` (``model.implicit.reference``) otherwise.
"""
from __future__ import annotations

import numpy as np
import torch

from ...errors import SpecError
from ...models.head import first_output, get_module
from .model import scored_positions, token_logprobs
from ...models.padding import batches_by_length, pad_batch


def _module(clm, site: str, layer: int):
    lay = clm.layers[layer]
    if site == "resid_post":
        return lay
    return get_module(lay, clm.family.attn if site == "attn_out" else clm.family.mlp)


def _swap(out, new):
    return (new,) + tuple(out[1:]) if isinstance(out, tuple) else new


def check_patchable(lm) -> None:
    """A reference with the policy's architecture (same family, layers, widths); ``SpecError`` otherwise."""
    if lm.reference is None:
        raise SpecError("model.implicit.reference", "patching the policy takes each site's activation from the "
                        "reference model, and this run is reference-free.",
                        fix="set model.implicit.reference, or drop the patch steps.")
    p, r = lm.policy.model.config, lm.reference.model.config
    if (p.model_type, p.hidden_size, lm.policy.n_layers) != (r.model_type, r.hidden_size, lm.reference.n_layers):
        raise SpecError("model.implicit.reference", "patching needs a reference of the policy's architecture "
                        f"({p.model_type}, d={p.hidden_size}, {lm.policy.n_layers} layers); got {r.model_type}, "
                        f"d={r.hidden_size}, {lm.reference.n_layers} layers.", fix="drop the patch steps.")


def readout_difference(lm) -> str | None:
    """Why the policy and reference do not share a readout (final norm, unembedding, logit soft-cap), or None.

    With one shared readout, patching the last layer's output from the reference makes the policy's run the
    reference's (implicit margin 0), so ``(m − m_patched) / m`` is a share of the margin; otherwise no site
    patched reaches the reference and that ratio is not a share of anything (it can exceed 1 or be negative).
    """
    pol, ref = lm.policy, lm.reference
    parts = (("final norm", pol.final_norm, ref.final_norm), ("unembedding", pol.unembed, ref.unembed))
    for what, a, b in parts:
        sa, sb = a.state_dict(), b.state_dict()
        if sa.keys() != sb.keys() or any(not torch.equal(sa[k], sb[k]) for k in sa):
            return f"the policy's and the reference's {what} differ"
    caps = [getattr(m.model.config, "final_logit_softcapping", None) for m in (pol, ref)]
    if caps[0] != caps[1]:
        return f"the policy's and the reference's final logit soft-caps differ ({caps[0]} vs {caps[1]})"
    return None


def _rows(encoded, pidx):
    seqs, starts = [], []
    for i in pidx:
        for side, ids in enumerate((encoded.chosen[i], encoded.rejected[i])):
            seqs.append(ids)
            starts.append(max(1, int(encoded.starts[i][side])))
    return seqs, starts


def _reward(lm, lp, lr, valid):
    d = np.where(valid, lp - lr, 0.0)
    n = valid.sum(-1)
    return lm.beta * d.sum(-1) / (n if lm.length_normalize else 1.0)


def _batches(lm, encoded, pidx, batch_size, padding_side):
    seqs, starts = _rows(encoded, pidx)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    dev = next(lm.policy.model.parameters()).device
    for b in batches_by_length([len(s) for s in seqs], batch_size):
        rows = list(b)
        ids, mask, pos, _ = pad_batch([seqs[r] for r in rows], pad, padding_side)
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        cols, valid = scored_positions(seqs, starts, rows, ids.shape[1], padding_side, dev)
        yield rows, ids, mask, pos, cols, ids.gather(1, cols), valid


def _reference_pass(lm, targets, ids, mask, pos, cols, toks):
    """The reference's log-probabilities and its output at every target (full sequences)."""
    acts, handles = {}, []
    for t in targets:
        def hook(mod, args, out, t=t):
            acts[t] = first_output(out).detach()
        handles.append(_module(lm.reference, *t).register_forward_hook(hook))
    try:
        lr = token_logprobs(lm.reference, ids, mask, pos, cols, toks).cpu().numpy()
    finally:
        for h in handles:
            h.remove()
    return lr, acts


@torch.no_grad()
def patch_rewards(lm, encoded, targets, pidx, *, batch_size=16, padding_side="left"):
    """``(base, patched, counts)``: implicit rewards (pair, side) unpatched and (pair, side, target) with each
    target's output taken from the reference at every position. See the module doc."""
    check_patchable(lm)
    n = len(pidx)
    base = np.zeros(2 * n)
    patched = np.zeros((2 * n, len(targets)))
    counts = {"forward_passes": 0}
    for rows, ids, mask, pos, cols, toks, valid in _batches(lm, encoded, pidx, batch_size, padding_side):
        lr, acts = _reference_pass(lm, targets, ids, mask, pos, cols, toks)
        base[rows] = _reward(lm, token_logprobs(lm.policy, ids, mask, pos, cols, toks).cpu().numpy(), lr, valid)
        for k, t in enumerate(targets):
            h = _module(lm.policy, *t).register_forward_hook(lambda mod, a, out, t=t: _swap(out, acts[t]))
            try:
                lp = token_logprobs(lm.policy, ids, mask, pos, cols, toks).cpu().numpy()
            finally:
                h.remove()
            patched[rows, k] = _reward(lm, lp, lr, valid)
        counts["forward_passes"] += 2 + len(targets)
    return base.reshape(n, 2), patched.reshape(n, 2, len(targets)), counts


def attribution_rewards(lm, encoded, targets, pidx, *, batch_size=16, padding_side="left"):
    """``(estimate, counts)``: the first-order estimate (pair, side, target) of each target's patched-minus-base
    implicit reward. See the module doc."""
    check_patchable(lm)
    n = len(pidx)
    est = np.zeros((2 * n, len(targets)))
    counts = {"forward_passes": 0, "backward_passes": 0}
    for rows, ids, mask, pos, cols, toks, valid in _batches(lm, encoded, pidx, batch_size, padding_side):
        with torch.no_grad():
            lr, ref_acts = _reference_pass(lm, targets, ids, mask, pos, cols, toks)
        acts, handles = {}, []
        for t in targets:
            def hook(mod, args, out, t=t):
                acts[t] = first_output(out)
            handles.append(_module(lm.policy, *t).register_forward_hook(hook))
        try:
            with torch.enable_grad():
                lp = token_logprobs(lm.policy, ids, mask, pos, cols, toks)
                w = torch.as_tensor(valid, device=lp.device, dtype=lp.dtype)
                scale = lm.beta / (w.sum(-1) if lm.length_normalize else torch.ones_like(w.sum(-1)))
                r = (lp * w).sum(-1) * scale                      # the reference term has no gradient
                grads = torch.autograd.grad(r.sum(), [acts[t] for t in targets], allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        m = mask[..., None].to(torch.float64)
        for k, (t, g) in enumerate(zip(targets, grads)):
            if g is None:
                continue
            delta = (ref_acts[t] - acts[t].detach()).double()
            est[rows, k] = (g.double() * delta * m).sum((1, 2)).cpu().numpy()
        counts["forward_passes"] += 2
        counts["backward_passes"] += 1
    return est.reshape(n, 2, len(targets)), counts
