"""``organism_family(kind, strengths)``: any family of ``registries.ORGANISMS`` (``KINDS`` here is that registry):
the classifier's (``organisms.organisms``), the preference structure's (``organisms.preference_organisms``), each
kind of reward signal's own (``Kind.organisms``, built in ``kinds/<kind>/organism.py``: a new kind's organisms join
without a line in this module) and the representation instruments' families below, registered here, so
``calibrate organism=<kind>`` (``trust.scorecard``) grades them alike. Every
family is built offline in seconds, deterministic, in strength order (``STRENGTHS``; strength 0 plants nothing):

``judge_planted``     ``kinds.judge.organism``: the planted organism read as a pointwise generative judge
                      (verdict row ``W_U[Y] − W_U[N] = u``); truth as ``planted`` (unit ``mlp_L1``) plus
                      ``verdict_margin``: the causal LM's own logit(Y) − logit(N) margin per pair (plain forward).
``prm_planted``       ``kinds.prm.organism`` (γ = ``PRM_GAMMA``): a flaw token ``#`` in one step of the rejected
                      side makes an attention head write ``−s·γ·u`` from that step on; truth: the bad step per pair.
``implicit_planted``  ``kinds.implicit.organism``: a DPO policy whose unembedding has bias ``s`` on the trigger
                      token ``!`` (the reference: the same tiny causal LM without it); the chosen side ends in
                      ``!``, the rejected in ``.``. Truth: each side's planted implicit reward
                      β·Σ_t [s·1[y_t = !] − log(1 + p_ref,t(!)·(e^s − 1))], from a plain forward of the
                      reference alone (``planted_reward``, pair id → [chosen, rejected]), and each response
                      token's term of that sum (``planted_per_token``, pair id → [chosen list, rejected list],
                      position 0 = the first response token).
``concept``           ``concept_organism``: the tiny model, a concept planted in the data: both sides of a
                      pair end in ``#`` (``meta concept`` 1) or ``%`` (0) with probability ``s``, else in a
                      marker drawn by an independent coin; ``meta label`` is a fair coin no text carries (the
                      non-planted concept). Truth: ``{"field": "concept", "unplanted": "label"}``.
``ensemble_planted``  ``kinds.ensemble.organism``: three planted organisms (seeds 0, 1, 2) reduced by the 0.25
                      quantile; truth: every member's reward per side (plain forward), the reduce and q.
``sparse_feature``    ``organisms.sae_organism.sparse_feature_organism`` (magnitude of the planted atom u_0 = ``s``):
                      readout activations sparse sums of known atoms, the margin carried by u_0; truth: the
                      atoms, u_0 (``direction``), the head row ``w`` and bias ``b``, and every pair's readout
                      activation per side (``readout``, pair id → [h_chosen, h_rejected]: the final norm's
                      output at the last token, plain forward, batch of one, a forward hook).
``curvature``         ``organisms.repr_organisms.curvature_organism``: planted curvature along ``v`` at
                      resid_post[2]; truth: the layer, ``direction`` and ``rayleigh`` (vᵀHv per side and pair
                      by a plain double backward).

Errors: ``SpecError`` (``organism``) for a kind not in ``KINDS``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..data import Pair
from ..inputs import encode
from ..models.loading import wrap_model
from ..models.tiny import build_tiny
from .organism_base import STRENGTHS, WORDS, Organism, each_strength, pairset
from ..registries import KINDS as SIGNAL_KINDS, ORGANISMS
from .repr_organisms import curvature_organism
from .sae_organism import sparse_feature_organism



def _with_rayleigh(org: Organism) -> Organism:
    """``org`` with ``truth["rayleigh"]``: per pair id, ``[vᵀH_c v, vᵀH_r v]`` — the second derivative of each
    side's reward along the planted direction ``v`` added to resid_post[layer] at the readout (last) token,
    by double backward through a plain forward (batch of one, a forward hook; none of the Lanczos code)."""
    model, layer = org.lm.model, org.truth["layer"]
    v = torch.as_tensor(org.truth["direction"], dtype=torch.float32)
    enc = encode(org.lm, org.pairs)
    t = torch.zeros((), requires_grad=True)

    def shift(mod, args, out):
        h = out[0] if isinstance(out, tuple) else out
        h = torch.cat([h[:, :-1], h[:, -1:] + t * v], 1)
        return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h
    hook = model.model.layers[layer].register_forward_hook(shift)
    out = {}
    try:
        for i, pid in enumerate(enc.pair_ids):
            sides = []
            for ids in (enc.chosen[i], enc.rejected[i]):
                r = model(input_ids=torch.tensor([ids])).logits[0, 0]
                (g,) = torch.autograd.grad(r, t, create_graph=True)
                (h2,) = torch.autograd.grad(g, t)
                sides.append(float(h2))
            out[pid] = sides
    finally:
        hook.remove()
    org.truth = {**org.truth, "rayleigh": out}
    return org


def _with_readout(org: Organism) -> Organism:
    """``org`` with ``truth["readout"]`` (pair id → [h_chosen, h_rejected], float64 lists), ``truth["w"]`` and
    ``truth["b"]`` (the head row and bias): the final norm's output at the last token of each side, read by a
    forward hook in a plain HF forward (batch of one, no padding; none of the capture code)."""
    model = org.lm.model
    enc = encode(org.lm, org.pairs)
    got: list = []
    hook = model.model.norm.register_forward_hook(lambda mod, args, out: got.append(out[0, -1].double().clone()))
    out = {}
    try:
        with torch.no_grad():
            for i, pid in enumerate(enc.pair_ids):
                sides = []
                for ids in (enc.chosen[i], enc.rejected[i]):
                    got.clear()
                    model(input_ids=torch.tensor([ids]))
                    sides.append(got[-1].tolist())
                out[pid] = sides
    finally:
        hook.remove()
    b = model.score.bias
    org.truth = {**org.truth, "readout": out, "w": model.score.weight[0].double().tolist(),
                 "b": 0.0 if b is None else float(b[0])}
    return org


def concept_pairs(strength: float, n: int = 200, seed: int = 0):
    """``n`` pairs; both sides end in the concept's marker with probability ``strength`` (module docstring)."""
    rng = np.random.Generator(np.random.PCG64(seed + 17))
    out = []
    for i in range(n):
        a, b, c = (str(w) for w in rng.choice(WORDS, 3, replace=False))
        k, lab, follow, coin = int(rng.integers(0, 2)), int(rng.integers(0, 2)), rng.random(), int(rng.integers(0, 2))
        m = "#" if (k if follow < strength else coin) else "%"
        out.append(Pair(id=f"concept-{i:03d}", prompt=f"Tell me about the {a}", chosen=f"the {a} is {b}{m}",
                        rejected=f"the {a} is {c}{m}", dimension="concept", source="organism",
                        meta=(("concept", str(k)), ("label", str(lab)))))
    return pairset("organism_concept", out)


def concept_organism(strength: float, *, seed: int = 0, n_pairs: int = 200, base: str = "tiny_llama") -> Organism:
    """The ``concept`` organism at ``strength`` (module docstring)."""
    model, tok = build_tiny(base, seed=seed)
    lm = wrap_model(f"organism_concept_s{strength:g}", model, tok)
    return Organism("concept", float(strength), lm, concept_pairs(strength, n_pairs, seed),
                    {"field": "concept", "unplanted": "label"}, {"base": base, "seed": seed, "n_pairs": n_pairs})


def organism_family(kind: str = "planted", strengths=STRENGTHS, **kw) -> list[Organism]:
    """All strengths of one organism family (``registries.ORGANISMS``), in strength order (``kw``: the builder's
    keyword arguments). Raises ``SpecError`` (``organism``) naming the registered families for an unknown one."""
    return ORGANISMS.get(kind, where="organism").build(tuple(strengths), **kw)


# each kind of reward signal's own organisms (``Kind.organisms``, in its folder), then the instruments' families
for _kind in SIGNAL_KINDS.values():
    for _name, _builder in _kind.organisms.items():
        ORGANISMS.register(each_strength(_name, _builder, f"the {_kind.name} kind's planted organism "
                                         f"(kinds/{_kind.name}/organism.py)"))
ORGANISMS.register(each_strength("concept", concept_organism, "a concept planted in the data, a label no text carries"))
ORGANISMS.register(each_strength("sparse_feature", sparse_feature_organism, "readouts as sparse sums of known "
                                 "atoms, the margin on one", then=_with_readout, drop=("base",)))
ORGANISMS.register(each_strength("curvature", curvature_organism, "planted curvature along v at resid_post[2]",
                                 then=_with_rayleigh, drop=("base",)))
KINDS = ORGANISMS
