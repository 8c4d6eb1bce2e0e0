"""The ``ensemble_planted`` organism: an ensemble (``kinds.ensemble``) whose members are planted organisms
(``organisms.organisms.planted_organism``, unit ``mlp_L1``) drawn from seeds 0, 1, 2 at the same strength, reduced
by the 0.25 quantile (``ENSEMBLE_REDUCE``, ``ENSEMBLE_Q``: neither the mean, the min nor the median, so a wrong
reduce or a wrong ``q`` reads other numbers). Every member's margin rises with the strength; strength 0 plants
nothing. Pairs: member 0's planted pairs.

Truth, from each member alone (its own tokenization of the default plain template, a plain HF forward, batch
of one, the classifier's own pooled logit; none of the capture, ensemble or operator code):
``member_reward`` (pair id → [[chosen, rejected] per member]), the member names, ``reduce`` and ``q``. The
ensemble reward the truth implies is computed by the criteria with a naive order-statistic quantile
(``trust.kind_criteria``), not by ``kinds.ensemble.settings.reduce_members``.
"""
from __future__ import annotations

import numpy as np
import torch

from ...organisms.organism_base import Organism
from ...models.fingerprint import model_fingerprint
from ...organisms.organisms import planted_organism
from ...models.readout import ReadoutHead
from .model import EnsembleModel
from ..implicit.settings import KindConfig

ENSEMBLE_REDUCE, ENSEMBLE_Q = "quantile", 0.25
MEMBER_SEEDS = (0, 1, 2)
PLAIN_TEMPLATE = "User: {prompt}\nAssistant: {response}"   # the executor's default plain template


@torch.no_grad()
def _member_rewards(model, tok, pairs) -> dict[str, list[float]]:
    """Per pair id, [chosen, rejected] reward of one sequence classifier, plain forward, batch of one."""
    out = {}
    for p in pairs:
        out[p.id] = [float(model(input_ids=torch.tensor([tok(PLAIN_TEMPLATE.format(prompt=p.prompt, response=r))
                                                          ["input_ids"]])).logits[0, 0].double())
                     for r in (p.chosen, p.rejected)]
    return out


def ensemble_organism(strength: float, *, seed: int = 0, n_pairs: int = 12, base: str = "tiny_llama") -> Organism:
    """The ``ensemble_planted`` organism at ``strength`` (module docstring); ``seed`` offsets the member seeds."""
    orgs = [planted_organism(strength, base=base, seed=seed + k, n_pairs=n_pairs) for k in MEMBER_SEEDS]
    pairs = orgs[0].pairs
    names = [f"planted_s{seed + k}" for k in MEMBER_SEEDS]
    members = [o.lm for o in orgs]
    per = [_member_rewards(o.lm.model, o.lm.tokenizer, pairs.pairs) for o in orgs]
    fps = [model_fingerprint(m.model, m.tokenizer) for m in members]
    container = torch.nn.ModuleDict({f"member_{i}": m.model for i, m in enumerate(members)})
    container.config = KindConfig({"kind": "ensemble", "members": names, "member_fingerprints": fps,
                                    "reduce": ENSEMBLE_REDUCE, "q": ENSEMBLE_Q})
    first = members[0]
    head = ReadoutHead(W=np.full((1, first.d_model), np.nan, np.float32), b=np.full(1, np.nan, np.float32),
                       objectives=("reward",))
    lm = EnsembleModel(name=f"organism_ensemble_s{strength:g}", members=members, member_names=names,
                       member_fingerprints=fps, reduce=ENSEMBLE_REDUCE, q=ENSEMBLE_Q, model=container,
                       tokenizer=first.tokenizer, family=first.family, norm=first.norm, head=head,
                       dtype=first.dtype, device=first.device)
    truth = {"member_reward": {p.id: [r[p.id] for r in per] for p in pairs.pairs}, "members": names,
             "reduce": ENSEMBLE_REDUCE, "q": ENSEMBLE_Q}
    return Organism("ensemble_planted", float(strength), lm, pairs, truth,
                    {"base": base, "seed": seed, "n_pairs": n_pairs, "members": names, "reduce": ENSEMBLE_REDUCE,
                     "q": ENSEMBLE_Q})
