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

from ...models.causal import CausalLM
from ...models.families import family_for
from .model import make_implicit
from ...models.tiny import build_tiny_causal
from ...models.head import get_module
from ...engine.per_token import response_starts
from ...inputs import encode
from ...organisms.organism_base import Organism
from ...organisms.organisms import TRIGGER, planted_pairs

IMPLICIT_BETA = 0.5


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


def implicit_organism(strength: float, *, seed: int = 0, n_pairs: int = 8, beta: float = IMPLICIT_BETA,
                      base: str = "tiny_llama") -> Organism:
    """The ``implicit_planted`` organism at ``strength`` (module docstring)."""
    pairs = planted_pairs(n_pairs, seed)
    tok_probe = unembed_organism(0.0, (), name=base, seed=seed, beta=beta)[0].tokenizer
    trig = tok_probe(TRIGGER, add_special_tokens=False)["input_ids"]
    lm, planted = unembed_organism(strength, trig, name=base, seed=seed, beta=beta)
    enc = encode(lm, pairs)
    starts = response_starts(lm.tokenizer, pairs, enc)
    truth, per_token = {}, {}
    ref = lm.reference.model
    with torch.no_grad():            # plain forward of the reference, batch of one: the planted log-ratio
        for i, pid in enumerate(enc.pair_ids):
            sides = []
            for s, ids in enumerate((enc.chosen[i], enc.rejected[i])):
                st = max(1, int(starts[i, s]))
                p = torch.softmax(ref(input_ids=torch.tensor([ids])).logits[0].double(), -1)
                p_s = p[st - 1:len(ids) - 1][:, trig].sum(-1).numpy()
                y = np.isin(np.asarray(ids[st:]), trig)
                sides.append((beta * (strength * y - np.log1p(p_s * np.expm1(strength)))).tolist())
            per_token[pid] = sides
            truth[pid] = [float(np.sum(t)) for t in sides]
    return Organism("implicit_planted", float(strength), lm, pairs,
                    {"planted_reward": truth, "planted_per_token": per_token, "tokens": planted["tokens"],
                     "beta": beta, "trigger": TRIGGER},
                    {"base": base, "seed": seed, "n_pairs": n_pairs, "beta": beta})
