"""DPO-implicit organisms: a tiny policy/reference pair whose log-ratio is planted by construction.

``unembed_organism(strength, tokens)``: the reference is the tiny causal Llama of ``seed``; the policy is a copy
whose unembedding gains a bias ``strength`` on the ids ``tokens`` (every other weight equal). So at every
position ``t`` the policy's logits are the reference's plus ``strength·1[v ∈ S]``, and the planted log-ratio is

    log π(y_t) − log π_ref(y_t) = strength·1[y_t ∈ S] − log(1 + p_ref,t(S)·(e^strength − 1))

(``p_ref,t(S)``: the reference's probability of the set at that position). ``strength = 0`` gives a zero reward.

``mlp_organism(strength, layer)``: the policy is the reference with ``strength``·N(0, 0.02²) (PCG64(seed + 1))
added to one layer's MLP output projection. Every site upstream of that MLP is identical in both models,
so patching it from the reference changes nothing (effect exactly 0); patching that MLP's output, or the output
of that layer or any later layer, makes the rest of the policy's run the reference's: implicit reward exactly 0
(effect = −margin, fraction 1).
Returns ``(ImplicitModel, planted)``, ``planted`` a dict describing what was planted.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from ..models.causal import CausalLM
from ..models.families import family_for
from ..models.implicit import make_implicit
from ..models.tiny import build_tiny_causal
from ..models.head import get_module


def _pair(name: str, seed: int):
    model, tok = build_tiny_causal(name, seed=seed)
    ref = CausalLM(name=f"{name}_ref", model=model, tokenizer=tok, family=family_for(model.config.model_type))
    pol = copy.deepcopy(model)
    return ref, pol, tok


def unembed_organism(strength: float, tokens, *, name: str = "tiny_llama", seed: int = 0, beta: float = 0.1,
                     length_normalize: bool = False):
    """See the module doc; ``tokens``: token ids in the planted set S."""
    ref, pol, tok = _pair(name, seed)
    old = pol.get_output_embeddings()
    new = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.zero_()
        new.bias[list(tokens)] = float(strength)
    pol.set_output_embeddings(new)
    policy = CausalLM(name=f"{name}_policy", model=pol.eval(), tokenizer=tok, family=ref.family)
    lm = make_implicit(f"implicit_unembed_{strength}", policy, ref, beta=beta, length_normalize=length_normalize)
    return lm, {"kind": "unembed", "strength": float(strength), "tokens": sorted(int(t) for t in tokens)}


def mlp_organism(strength: float, layer: int, *, name: str = "tiny_llama", seed: int = 0, beta: float = 1.0):
    """See the module doc."""
    ref, pol, tok = _pair(name, seed)
    policy = CausalLM(name=f"{name}_policy", model=pol, tokenizer=tok, family=ref.family)
    mlp = policy.layers[layer]
    proj = [m for m in get_module(mlp, ref.family.mlp).modules() if isinstance(m, torch.nn.Linear)][-1]
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    with torch.no_grad():
        proj.weight.add_(torch.from_numpy(strength * rng.normal(0.0, 0.02, size=tuple(proj.weight.shape)))
                         .to(proj.weight.dtype))
    lm = make_implicit(f"implicit_mlp_L{layer}_{strength}", policy, ref, beta=beta)
    return lm, {"kind": "mlp", "strength": float(strength), "layer": int(layer)}
