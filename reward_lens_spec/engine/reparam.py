"""Exact re-parameterization of a reward model: the same function in a rotated residual basis.

``rotate_residual(model, Q)`` rewrites a Llama-style sequence classifier (RMSNorm pre-norm
blocks; q/k/v, o, gate/up/down projections without writer biases) in place so that every
residual-stream vector x becomes x Qᵀ (Q orthogonal, d_model × d_model), with outputs unchanged:

1. fold each RMSNorm gain into the linear maps that read it (W ← W diag(g)) and set the gain
   to 1 — RMSNorm without a gain commutes with rotations, since ‖x Qᵀ‖ = ‖x‖;
2. writers into the residual (token embeddings, o_proj, down_proj) map their output by Q
   (W ← Q W, embeddings E ← E Qᵀ); readers (q/k/v, gate/up, the score head) by Qᵀ (W ← W Qᵀ).

This is the computational invariance used by SliceGPT (Ashkboos et al. 2024, "SliceGPT:
Compress Large Language Models by Deleting Rows and Columns", ICLR). Margins, rewards and
every readout are unchanged (to float rounding); activations and the head row w_r change
basis — the gauge freedom the frames in ``reward_lens_spec.frames`` exist for.
Raises ``SpecError`` for a model without that structure or a non-orthogonal / mis-sized Q.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import SpecError

_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_READ_ATTN = ("q_proj", "k_proj", "v_proj")
_READ_MLP = ("gate_proj", "up_proj")


def _check(model, Q) -> torch.Tensor:
    base = getattr(model, "model", None)
    if getattr(model.config, "model_type", None) not in _TYPES or base is None or not hasattr(model, "score"):
        raise SpecError("model", f"{type(model).__name__} is not a Llama-style sequence classifier "
                        f"of type {_TYPES}.", fix="use a Llama, Mistral, Qwen2 or Qwen3 reward model.")
    d = model.config.hidden_size
    Qn = np.asarray(Q, np.float64)
    if Qn.shape != (d, d) or not np.allclose(Qn @ Qn.T, np.eye(d), atol=1e-8):
        raise SpecError("Q", f"need an orthogonal {d} × {d} matrix, got shape {Qn.shape}.",
                        fix="e.g. scipy.stats.ortho_group.rvs(d_model, random_state=0).")
    for layer in base.layers:
        for name in ("o_proj", "down_proj"):
            mod = getattr(layer.self_attn if name == "o_proj" else layer.mlp, name)
            if mod.bias is not None:
                raise SpecError("model", f"{name} has a bias; a writer bias would need rotating as well.",
                                fix="use a model whose residual writers have no bias.")
    return torch.as_tensor(Qn, dtype=torch.float64)


def _fold(norm, readers) -> None:
    g = norm.weight.double()
    for lin in readers:
        lin.weight.copy_((lin.weight.double() * g).to(lin.weight.dtype))
    norm.weight.fill_(1.0)


def _mul(p: torch.nn.Parameter, left=None, right=None) -> None:
    w = p.double()
    w = left @ w if left is not None else w
    w = w @ right if right is not None else w
    p.copy_(w.to(p.dtype))


@torch.no_grad()
def rotate_residual(model, Q) -> None:
    """Rewrite ``model`` in place to compute the same function in the basis x ↦ x Qᵀ (module doc)."""
    q = _check(model, Q)
    base = model.model
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        _fold(layer.input_layernorm, [getattr(attn, n) for n in _READ_ATTN])
        _fold(layer.post_attention_layernorm, [getattr(mlp, n) for n in _READ_MLP])
        for lin in [getattr(attn, n) for n in _READ_ATTN] + [getattr(mlp, n) for n in _READ_MLP]:
            _mul(lin.weight, right=q.T)
        _mul(attn.o_proj.weight, left=q)
        _mul(mlp.down_proj.weight, left=q)
    _fold(base.norm, [model.score])
    _mul(model.score.weight, right=q.T)
    _mul(base.embed_tokens.weight, right=q.T)
