"""Split each layer's attention output at the readout token into per-head contributions.

The attention output is ``W_O · concat_h(z_h) (+ b_O)``, so head h writes
``W_O[:, h] · z_h`` (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits"). ``z`` is captured as the input of the output projection
(site ``attn_z``). Gemma-2 puts an RMSNorm between ``o_proj`` and the residual;
its scale is frozen at the readout token (as the final norm is for DLA), which
keeps the split exact: Σ_h contribution = post-norm attention output. The output
bias ``b_O`` (GPT-2, GPT-NeoX) belongs to no head: Σ_h = attn_out − b_O.
"""
from __future__ import annotations

import numpy as np

from ..models.head import get_module
from ..models.placement import materialized


def n_heads(config) -> int:
    for key in ("num_attention_heads", "n_head"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise ValueError("config has no head count")


def head_contributions(lm, z: np.ndarray) -> np.ndarray:
    """``z``: (..., layer, n_heads·head_dim) → contributions (..., layer, head, d_model), float64."""
    fam, layers = lm.family, get_module(lm.model, lm.family.layers)
    H = n_heads(lm.model.config)
    out = np.zeros(z.shape[:-1] + (H, lm.d_model))
    for l, block in enumerate(layers):
        o = get_module(block, fam.o_proj)
        with materialized(o):                                     # offloaded (models.placement): read it
            W = o.weight.detach().double().cpu().numpy()
        W = W if fam.o_proj_conv1d else W.T                       # (n_heads·head_dim, d_model)
        zl = np.asarray(z[..., l, :], np.float64)
        hd = zl.shape[-1] // H
        zh = zl.reshape(zl.shape[:-1] + (H, hd))
        c = np.einsum("...hk,hkd->...hd", zh, W.reshape(H, hd, -1))
        if fam.attn_post_norm:
            norm = get_module(block, fam.attn_post_norm)
            eps = float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))
            a = c.sum(-2)
            scale = 1.0 / np.sqrt((a ** 2).mean(-1) + eps)
            with materialized(norm):
                gain = fam.norm_offset + norm.weight.detach().double().cpu().numpy()
            c = c * scale[..., None, None] * gain
        out[..., l, :, :] = c
    return out
