"""Organisms for the representation instruments (issue 29): planted curvature and a planted concept.
Built offline in seconds from ``tiny_llama`` (PCG64 weights), deterministic.

**curvature** (``curvature_organism``): layer ``layer + 1``'s MLP gets one hidden unit ``j`` with
``gate_j = up_j = c·v`` (v a unit direction ⟂ the head row u), writing ``s·κ·u`` through its
down-projection column. Its activation silu(a)·a, a = c·v·x̂, is ≈ a²/2 near 0, so the reward gains a
term ∝ s·(v·x̂)²: the Hessian of the reward w.r.t. resid_post[layer] at the readout token gets a large
eigenvalue along v (projected off x). Truth: ``{"layer", "direction": v}``; ``s = 0`` plants nothing.

**concept** (``concept_organism``): the tiny model unchanged, the concept planted in the data: pairs
with ``meta["concept"]`` 1 or 0 (seeded coin), written into the text — both sides of a concept-1 pair
end with the token ``#``, a concept-0 pair's with ``%`` (the readout token), so a linear probe reads it
from the residual at the readout token; ``meta["label"]`` is a second fair coin no text carries (a
concept that is not there: erasing it barely moves the activation). Truth: ``{"field": "concept"}``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..data import Pair
from ..models.loading import wrap_model
from .organism_base import WORDS, Organism, pairset
from ..models.tiny import build_tiny


def _unit(rng, d, against=()):
    x = rng.normal(size=d)
    for a in against:
        x -= (x @ a) * a
    return x / np.linalg.norm(x)


def _t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)


def _pairs(name, n, seed, end_c="!", end_r="."):
    rng = np.random.Generator(np.random.PCG64(seed + 7))
    out = []
    for i in range(n):
        a, b, c = (str(w) for w in rng.choice(WORDS, 3, replace=False))
        body = f"the {a} and the {b} are {c}"
        out.append(Pair(id=f"{name}-{i:03d}", prompt=f"Tell me about the {a}", chosen=body + end_c,
                        rejected=body + end_r, dimension=name, source="organism"))
    return pairset(f"organism_{name}", out)


@torch.no_grad()
def curvature_organism(strength: float, *, layer: int = 2, gain: float = 1.0, kappa: float = 2.0, seed: int = 0,
                       n_pairs: int = 6) -> Organism:
    """Tiny reward model with planted curvature along ``v`` at resid_post[``layer``] (module docstring)."""
    model, tok = build_tiny("tiny_llama", seed=seed)
    d = model.config.hidden_size
    rng = np.random.Generator(np.random.PCG64(seed + 3000))
    u = _unit(rng, d)
    v = _unit(rng, d, (u,))
    model.score.weight.copy_(_t(u[None, :]))
    mlp = model.model.layers[layer + 1].mlp
    mlp.gate_proj.weight[0] = _t(gain * v)
    mlp.up_proj.weight[0] = _t(gain * v)
    mlp.down_proj.weight[:, 0] = _t(strength * kappa * u)
    lm = wrap_model(f"organism_curvature_L{layer}_s{strength:g}", model, tok)
    return Organism("curvature", float(strength), lm, _pairs("curvature", n_pairs, seed),
                    {"layer": layer, "direction": v.tolist()},
                    {"seed": seed, "gain": gain, "kappa": kappa, "n_pairs": n_pairs})


def concept_pairs(n: int = 24, seed: int = 0):
    """``n`` pairs with a planted ``concept`` (the end marker of both sides) and an unplanted ``label``."""
    rng = np.random.Generator(np.random.PCG64(seed + 11))
    out = []
    for i in range(n):
        a, b, c = (str(w) for w in rng.choice(WORDS, 3, replace=False))
        k, lab = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        m = "#" if k else "%"
        out.append(Pair(id=f"concept-{i:03d}", prompt=f"Tell me about the {a}", chosen=f"the {a} is {b}{m}",
                        rejected=f"the {a} is {c}{m}", dimension="concept", source="organism",
                        meta=(("concept", str(k)), ("label", str(lab)))))
    return pairset("organism_concept", out)


def concept_organism(*, seed: int = 0, n_pairs: int = 24) -> Organism:
    """The tiny model with ``concept_pairs`` (module docstring)."""
    model, tok = build_tiny("tiny_llama", seed=seed)
    lm = wrap_model("organism_concept", model, tok)
    return Organism("concept", 1.0, lm, concept_pairs(n_pairs, seed), {"field": "concept", "unplanted": "label"},
                    {"seed": seed, "n_pairs": n_pairs})
