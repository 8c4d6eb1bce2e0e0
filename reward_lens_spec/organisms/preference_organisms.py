"""Organisms for preference structure beyond one scalar (graded by ``trust.scorecard``).

The structure is planted in the LABELS (or the head) of a frozen tiny model whose readout h
tells the planted kinds apart; see each builder. All are deterministic (PCG64) and offline.

* ``planted_cycle``: rock-paper-scissors labels over three responses per prompt (``cycle_pairs``).
* ``annotator_mixture`` / ``annotator_agreement``: annotator panels whose votes split along a
  direction orthogonal to w_r, or where the model's margin is small (``annotator_organisms``).
* ``multi_objective``: a K-row head whose rows are planted in the whitened frame so that the
  participation ratio of their Gram spectrum is known in closed form (``multi_objective_organisms``).

Errors: ``SpecError`` (``organism.*``) for an unknown kind or base model.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import torch

from ..data import Pair, PairSet
from ..data.pairs import make_meta
from ..errors import SpecError
from ..models.loading import wrap_model
from .organism_base import STRENGTHS, WORDS, Organism, OrganismFamily, pairset
from ..models.tiny import TINY_CONFIGS, build_tiny
from ..engine.capture import capture
from ..inputs import encode
from ..frames.fit import fit_whitened
from ..registries import ORGANISMS


CYCLE = ("rock", "paper", "scissors")


def cycle_pairs(strength: float, *, n_groups: int = 96, noise: float = 0.1, seed: int = 0) -> PairSet:
    """Per prompt, three responses ending in ``rock``/``paper``/``scissors``, compared pairwise.

    rock beats paper and paper beats scissors always; scissors beats rock with probability
    ``strength`` (else rock wins: a transitive order at 0, a 3-cycle at 1); then each label is
    flipped with probability ``noise`` (annotator noise). The draws are shared across strengths.
    """
    rng = np.random.Generator(np.random.PCG64(seed + 21))
    out = []
    for g in range(n_groups):
        a, b, c = (str(w) for w in rng.choice(WORDS, 3, replace=False))
        prompt = f"Pick one for the {a} {g}"
        resp = {t: f"the {b} and the {c} say {t}" for t in CYCLE}
        u_cycle, u_noise = rng.random(), rng.random(3)
        won = [("rock", "paper"), ("paper", "scissors"),
               ("scissors", "rock") if u_cycle < strength else ("rock", "scissors")]
        for e, (w, l) in enumerate(won):
            if u_noise[e] < noise:
                w, l = l, w
            out.append(Pair(id=f"cycle-{g:03d}-{e}", prompt=prompt, chosen=resp[w], rejected=resp[l],
                            dimension="cycle", source="organism"))
    return pairset("organism_cycle", out)


def cycle_organisms(strengths=STRENGTHS, *, base: str = "tiny_llama", seed: int = 0, n_groups: int = 96,
                    noise: float = 0.1) -> list[Organism]:
    """The planted-cycle organism: one frozen tiny model, labels with a rock-paper-scissors cycle.

    Strength = probability that a prompt's scissors-vs-rock label closes the cycle (``cycle_pairs``);
    the readout token is the type word's last byte, so h tells the three types apart. Truth:
    ``{"cycle": CYCLE}``. The structure is in the labels; the model only has to represent it.
    """
    if base not in TINY_CONFIGS:
        raise SpecError("organism.base", f"unknown tiny model '{base}'.", value=base, options=TINY_CONFIGS)
    model, tok = build_tiny(base, seed=seed)
    lm = wrap_model(f"organism_cycle_{base}", model, tok)
    params = {"base": base, "seed": seed, "n_groups": n_groups, "noise": noise}
    return [Organism("planted_cycle", float(s), lm, cycle_pairs(s, n_groups=n_groups, noise=noise, seed=seed),
                     {"cycle": list(CYCLE)}, params) for s in strengths]


def _draft_pairs(rng, n: int, tag: str) -> list[Pair]:
    out = []
    for i in range(n):
        ws = [str(w) for w in rng.choice(WORDS, 6)]
        out.append(Pair(id=f"{tag}-{i:03d}", prompt=f"Describe the {ws[0]} {i}", chosen=" ".join(ws[1:3 + i % 2]),
                        rejected=" ".join(ws[3:]), dimension=tag, source="organism"))
    return out


ANNOTATOR_KINDS = ("annotator_mixture", "annotator_agreement")


@torch.no_grad()
def annotator_organisms(kind: str = "annotator_mixture", strengths=STRENGTHS, *, base: str = "tiny_llama",
                        seed: int = 0, n_pairs: int = 240, n_annotators: int = 4) -> list[Organism]:
    """Annotator panels voting on a frozen tiny model's pairs; votes kept in ``Pair.meta["votes"]``.

    With z the readout h in the whitened frame of the run's activations (``frames.fit_whitened``,
    Ledoit–Wolf, as ``objective_geometry`` fits it), dz = z_c − z_r, w̃ the head row in that frame
    and d̃ the unit top principal axis of dz orthogonal to w̃: a = w̃·dz (the model's margin) and
    b = d̃·dz, each scaled to RMS 1. Annotator j votes for the first side when
    ``f·a + g·β_j·b + ε_j > 0`` (β_j = +1, −1, +1, …; ε ~ N(0, 1)); the side most annotators pick is
    the chosen one (ties: the first). ``annotator_mixture``: f = 3, g = 6·strength (two camps who
    disagree along d̃, orthogonal to what the model rewards); truth ``disagreement_direction`` = d̃
    (whitened coordinates; a run refits that frame on the same h, equal to rounding).
    ``annotator_agreement``: f = 3·strength, g = 0 (annotators follow the
    model's margin, split where it is small); truth ``contested_where_margin_small``.
    """
    if kind not in ANNOTATOR_KINDS:
        raise SpecError("organism", f"unknown annotator organism '{kind}'.", value=kind, options=ANNOTATOR_KINDS)
    if base not in TINY_CONFIGS:
        raise SpecError("organism.base", f"unknown tiny model '{base}'.", value=base, options=TINY_CONFIGS)
    rng = np.random.Generator(np.random.PCG64(seed + 31))
    draft = _draft_pairs(rng, n_pairs, "annotators")
    model, tok = build_tiny(base, seed=seed)
    lm = wrap_model(f"organism_annotators_{base}", model, tok)
    h = capture(lm, encode(lm, draft), sites=(), batch_size=64).h.astype(np.float64)
    frame = fit_whitened(h.reshape(-1, h.shape[-1]), lm.name, shrinkage="ledoit_wolf")
    wt = frame.direction_to_frame(lm.head.W[0].astype(np.float64), lm.name)
    dz = frame.to_frame(h[:, 0] - h[:, 1], lm.name, center=False)
    u = wt / np.linalg.norm(wt)
    d = np.linalg.svd(dz - np.outer(dz @ u, u), full_matrices=False)[2][0]
    d -= (d @ u) * u
    d /= np.linalg.norm(d)
    a, b = dz @ wt, dz @ d
    a, b = a / np.sqrt((a * a).mean()), b / np.sqrt((b * b).mean())
    beta = np.where(np.arange(n_annotators) % 2 == 0, 1.0, -1.0)
    eps = rng.standard_normal((n_pairs, n_annotators))
    out = []
    for st in strengths:
        f, g = (3.0, 6.0 * st) if kind == "annotator_mixture" else (3.0 * st, 0.0)
        votes = (f * a[:, None] + g * beta[None, :] * b[:, None] + eps) > 0
        pairs = []
        for p, v in zip(draft, votes):
            first = v.mean() >= 0.5
            c, r, vv = (p.chosen, p.rejected, v) if first else (p.rejected, p.chosen, ~v)
            pairs.append(Pair(id=p.id, prompt=p.prompt, chosen=c, rejected=r, dimension=p.dimension, source=p.source,
                              meta=make_meta({"votes": [int(x) for x in vv]})))
        truth = ({"disagreement_direction": [float(x) for x in d]}
                 if kind == "annotator_mixture" else {"contested_where_margin_small": True})
        out.append(Organism(kind, float(st), lm, pairset(f"organism_{kind}", pairs), truth,
                            {"base": base, "seed": seed, "n_pairs": n_pairs, "n_annotators": n_annotators}))
    return out


def planted_participation_ratio(strength: float, k: int) -> float:
    """PR of the Gram (1 − s)·11ᵀ + s·I (K × K): K² / (((1 − s)K + s)² + (K − 1)s²)."""
    s = float(strength)
    return k * k / (((1.0 - s) * k + s) ** 2 + (k - 1) * s * s)


@torch.no_grad()
def multi_objective_organisms(strengths=STRENGTHS, *, base: str = "tiny_llama", seed: int = 0, n_pairs: int = 120,
                              n_objectives: int = 3) -> list[Organism]:
    """A K-row head planted in the whitened frame of its own readout: Ũ_k = √(1 − s)·q_0 + √s·q_k.

    q_0..q_K are the top principal axes of whitened h_c − h_r over the organism's pairs
    (orthonormal), so the rows' whitened Gram is (1 − s)·11ᵀ + s·I exactly and its participation
    ratio is ``planted_participation_ratio(s, K)``: 1 at s = 0 (one objective in K copies, no sign
    disagreement), K at s = 1 (K uncorrelated ones). W = Ũ Σ̂^{-1/2} (``direction_from_frame``).
    Truth: ``{"n_objectives": K, "participation_ratio": PR(s)}``.
    """
    if base not in TINY_CONFIGS:
        raise SpecError("organism.base", f"unknown tiny model '{base}'.", value=base, options=TINY_CONFIGS)
    rng = np.random.Generator(np.random.PCG64(seed + 41))
    pairs = pairset("organism_multi_objective", _draft_pairs(rng, n_pairs, "objectives"))
    out = []
    for st in strengths:
        model, tok = build_tiny(base, seed=seed, num_labels=n_objectives)
        lm = wrap_model(f"organism_multi_objective_s{st:g}", model, tok)
        if not out:
            h = capture(lm, encode(lm, pairs), sites=(), batch_size=64).h.astype(np.float64)
            frame = fit_whitened(h.reshape(-1, h.shape[-1]), "m")      # the default: exact where it can be
            q = np.linalg.svd(frame.to_frame(h[:, 0] - h[:, 1], "m", center=False), full_matrices=False)[2]
        U = np.sqrt(1.0 - st) * q[0][None, :] + np.sqrt(st) * q[1:n_objectives + 1]
        model.score.weight.copy_(torch.as_tensor(frame.direction_from_frame(U, "m"), dtype=torch.float32))
        lm = wrap_model(lm.name, model, tok)
        out.append(Organism("multi_objective", float(st), lm, pairs,
                            {"n_objectives": n_objectives,
                             "participation_ratio": planted_participation_ratio(st, n_objectives)},
                            {"base": base, "seed": seed, "n_pairs": n_pairs, "n_objectives": n_objectives}))
    return out


ORGANISMS.register(OrganismFamily("planted_cycle", cycle_organisms, "groups of three responses voted in a planted cycle"))
for _kind in ANNOTATOR_KINDS:
    ORGANISMS.register(OrganismFamily(_kind, partial(annotator_organisms, _kind),
                                      "annotator panels that disagree along a planted direction" if _kind.endswith("mixture")
                                      else "annotator panels that follow the model's margin"))
ORGANISMS.register(OrganismFamily("multi_objective", multi_objective_organisms,
                                  "a head of several objectives with a planted participation ratio"))

