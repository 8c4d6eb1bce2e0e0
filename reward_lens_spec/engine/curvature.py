"""Hessian-vector products of a reward (or margin) with respect to the residual at the readout token.

``site_hvp(lm, seqs, signs, layer, objective)`` returns ``(value, grad, hvp)`` for
``f(δ) = Σ_i signs[i] · r_k(seq_i ; resid_post[layer] at the readout token + δ)``: one forward per
sequence (unpadded, batch of one, so the readout token is the last), the gradient with
``create_graph``, then each ``hvp(v)`` = ∂(∇f · v)/∂δ is one double backward through that graph
(Pearlmutter 1994; ``torch.autograd.grad``). ``signs = (1,)``: one side's reward; ``(1, −1)`` over
(chosen, rejected): the margin under a shift δ shared by both sides. ``r_k`` is the head module's
output row ``objective`` at the readout token (reward units). Only the readout token's own later
computation sees δ (earlier tokens do not attend to it).
"""
from __future__ import annotations

import numpy as np
import torch

from ..models.head import first_output, get_module
from ..models.placement import input_device


def site_hvp(lm, seqs, signs, layer: int, objective: int = 0):
    """``(f(0) float, ∇f(0) (d,) float64, hvp: (d,) float64 → (d,) float64)``; see the module docstring."""
    dev = input_device(lm.model)
    dtype = next(lm.model.parameters()).dtype
    block = get_module(lm.model, lm.family.layers)[layer]
    head = get_module(lm.model, lm.family.head)
    with torch.inference_mode(False), torch.enable_grad():
        delta = torch.zeros(lm.d_model, dtype=dtype, device=dev, requires_grad=True)
        kept: dict = {}

        def shift(m, a, o):
            x = first_output(o)
            x = torch.cat([x[:, :-1], (x[:, -1] + delta)[:, None]], 1)
            return (x,) + tuple(o[1:]) if isinstance(o, tuple) else x

        total = 0.0
        for ids, s in zip(seqs, signs):
            hs = [block.register_forward_hook(shift),
                  head.register_forward_hook(lambda m, a, o: kept.__setitem__("r", first_output(o)))]
            try:
                lm.model(input_ids=torch.tensor([list(ids)], device=dev), use_cache=False)
            finally:
                for h in hs:
                    h.remove()
            total = total + s * kept["r"][0, -1, objective].float()
        (g,) = torch.autograd.grad(total, delta, create_graph=True)
    value, grad = float(total.detach()), g.detach().double().cpu().numpy()

    def hvp(v: np.ndarray) -> np.ndarray:
        if not g.requires_grad:                       # f is linear in δ: a zero Hessian
            return np.zeros(np.shape(v))
        with torch.inference_mode(False), torch.enable_grad():
            vt = torch.as_tensor(np.asarray(v), dtype=g.dtype, device=dev)
            (hv,) = torch.autograd.grad(g, delta, grad_outputs=vt, retain_graph=True)
        return hv.detach().double().cpu().numpy()
    return value, grad, hvp
