"""Gated multi-objective heads (ArmoRM style), and a tiny mimic to test them.

ArmoRM (Wang et al. 2024, "Interpretable Preferences via Multi-Objective Reward
Modeling and Mixture-of-Experts") scores K objectives with a linear regression
layer and mixes them with a softmax gate over objectives. In this head spec
both read the pooled vector h (the final-norm output at the readout token):

    r_k = W_k · h,   g = softmax(G h + c),   score = Σ_k g_k r_k (+ b)

The model's reward readout is its own gated score, not a mean of rows. For
attribution the gate is frozen at each side's h, which makes the score a
linear readout along ``g(h)ᵀW`` (so DLA still sums to the margin exactly).
(ArmoRM's gate reads the prompt's last token; this mimic reads h.)
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .readout import ReadoutHead


class GatedRewardHead(nn.Module):
    """Per-token gated score: (batch, token, d_model) → (batch, token, 1)."""

    def __init__(self, d_model: int, n_objectives: int):
        super().__init__()
        self.regression = nn.Linear(d_model, n_objectives, bias=False)
        self.gating = nn.Linear(d_model, n_objectives, bias=True)

    def forward(self, h):
        g = torch.softmax(self.gating(h), dim=-1)
        return (g * self.regression(h)).sum(-1, keepdim=True)


def read_gated(module: GatedRewardHead, objectives: tuple[str, ...] | None) -> ReadoutHead:
    W = module.regression.weight.detach().float().cpu().numpy().copy()
    G = module.gating.weight.detach().double().cpu().numpy().copy()
    c = module.gating.bias.detach().double().cpu().numpy().copy()

    def gate(h):
        z = np.einsum("...d,kd->...k", np.asarray(h, np.float64), G) + c    # the same sums whatever h's shape
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)
    names = tuple(objectives) if objectives else tuple(f"objective_{k}" for k in range(W.shape[0]))
    return ReadoutHead(W=W, b=np.zeros(1, np.float32), objectives=names, gate=gate)


def attach_gated_head(model, n_objectives: int, seed: int = 0):
    """Replace a tiny model's ``score`` with a ``GatedRewardHead`` (PCG64-seeded weights)."""
    d = model.score.in_features
    head = GatedRewardHead(d, n_objectives)
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    with torch.no_grad():
        head.regression.weight.copy_(torch.from_numpy(rng.normal(0, 0.05, (n_objectives, d))))
        head.gating.weight.copy_(torch.from_numpy(rng.normal(0, 0.5, (n_objectives, d))))
        head.gating.bias.copy_(torch.from_numpy(rng.normal(0, 0.1, n_objectives)))
    model.score = head.to(next(model.parameters()).dtype)
    model.config.num_labels = 1
    return model
