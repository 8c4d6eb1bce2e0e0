"""A planted sparse feature (issue 29 item 6) for ``sae_attribution``: a tiny reward model whose readout
activations are sparse sums of known atoms and whose margin is carried by one of them.
Built offline in seconds from ``tiny_llama`` (PCG64 weights), deterministic.

``sparse_feature_organism``: ``n_atoms`` orthonormal atoms u_0..u_{m−1} (d_model). The embedding of each
of the ``n_ends`` ending characters (the readout token; bytes of ``ENDS``) is set to a sparse sum of
``per_end`` atoms with magnitudes in [1, 2]; the first half of the ends also carry u_0 (the planted
feature) with magnitude ``strength``. Rejected sides end with one of the others; a chosen side ends with
one of the u_0 half with probability ``carry`` (else with one of the others, a pair with Δ ≈ 0). Every layer's writes (attention and MLP output projections) are scaled by ``mix`` (small: the
readout residual is the ending's embedding plus a little context), the final norm's weight is set to 1
and the head row to ``gain``·u_0. So Δ = w·(h_c − h_r) is carried by u_0 alone: an SAE trained on the
readout activations must give its u_0 feature the top attribution, and the other atoms' features —
which also differ between the sides — much less (not exactly none: a trained SAE's features mix in a
little of u_0; ``tests/test_sae.py`` measures how much). Truth: ``{"site": "readout", "direction": u_0,
"atoms": U}``; ``strength = 0`` plants nothing (the margin is then ≈ 0).
"""
from __future__ import annotations

import numpy as np
import torch

from ..data import Pair
from ..models.loading import wrap_model
from .organism_base import WORDS, Organism, pairset
from ..models.tiny import build_tiny

ENDS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _end_codes(rng, n_ends, n_atoms, per_end, strength):
    """(n_ends, n_atoms) sparse codes: ``per_end`` atoms among 1..m−1, plus atom 0 on the first half."""
    C = np.zeros((n_ends, n_atoms))
    for e in range(n_ends):
        C[e, 1 + rng.choice(n_atoms - 1, per_end, replace=False)] = rng.uniform(1.0, 2.0, per_end)
        if e < n_ends // 2:
            C[e, 0] = strength
    return C


def sparse_pairs(n: int, n_ends: int, seed: int, carry: float = 0.5):
    """Rejected sides end without u_0; a chosen side ends with u_0 with probability ``carry``."""
    rng = np.random.Generator(np.random.PCG64(seed + 17))
    half = n_ends // 2
    out = []
    for i in range(n):
        a, b, c = (str(w) for w in rng.choice(WORDS, 3, replace=False))
        ec = ENDS[int(rng.integers(0, half)) if rng.random() < carry else half + int(rng.integers(0, n_ends - half))]
        er = ENDS[half + int(rng.integers(0, n_ends - half))]
        out.append(Pair(id=f"sparse-{i:03d}", prompt=f"Tell me about the {a}", chosen=f"the {a} is {b} {ec}",
                        rejected=f"the {a} is {c} {er}", dimension="sparse", source="organism"))
    return pairset("organism_sparse_feature", out)


@torch.no_grad()
def sparse_feature_organism(strength: float = 1.5, *, n_atoms: int = 12, n_ends: int = 62, per_end: int = 2,
                            mix: float = 0.02, gain: float = 2.0, carry: float = 0.5, seed: int = 0,
                            n_pairs: int = 96) -> Organism:
    """Tiny reward model with a planted sparse feature u_0 carrying the margin (module docstring)."""
    if not 2 <= n_ends <= len(ENDS) or not 1 <= per_end < n_atoms:
        raise ValueError(f"need 2 <= n_ends <= {len(ENDS)} and 1 <= per_end < n_atoms.")
    model, tok = build_tiny("tiny_llama", seed=seed)
    d = model.config.hidden_size
    rng = np.random.Generator(np.random.PCG64(seed + 5000))
    U = np.linalg.qr(rng.normal(size=(d, n_atoms)))[0].T                 # n_atoms × d, orthonormal rows
    C = _end_codes(rng, n_ends, n_atoms, per_end, strength)
    emb = model.get_input_embeddings().weight
    for e, ch in enumerate(ENDS[:n_ends]):
        emb[4 + ord(ch)] = torch.as_tensor(C[e] @ U, dtype=emb.dtype)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(mix)
        layer.mlp.down_proj.weight.mul_(mix)
    model.model.norm.weight.fill_(1.0)
    model.score.weight.copy_(torch.as_tensor(gain * U[:1], dtype=model.score.weight.dtype))
    lm = wrap_model(f"organism_sparse_feature_s{strength:g}", model, tok)
    return Organism("sparse_feature", float(strength), lm, sparse_pairs(n_pairs, n_ends, seed, carry),
                    {"site": "readout", "direction": U[0].tolist(), "atoms": U.tolist()},
                    {"seed": seed, "n_atoms": n_atoms, "n_ends": n_ends, "per_end": per_end, "mix": mix,
                     "gain": gain, "carry": carry, "n_pairs": n_pairs})
