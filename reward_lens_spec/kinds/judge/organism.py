"""A judge model organism: the planted organism (``organisms.organisms.planted_organism``) read as a generative judge.

The planted classifier's body (one MLP unit of ``mlp_L1`` writes ``s·α·u`` at the trigger ``!``, the head row is
``u``) becomes the body of a causal LM whose unembedding has ``W_U[Y] = u/2``, ``W_U[N] = −u/2`` (every other
row 0), and that causal LM is loaded as a pointwise judge (``kinds.judge.loader.as_verdict_classifier``): its verdict
row ``W_U[Y] − W_U[N] = u`` is the planted head, so the judge's verdict margin, its DLA and its patching carry
the planted truth exactly (``truth`` as the planted organism's: unit ``mlp_L1``, magnitude ``s·α``). The judge
template is the planted organism's default one; its last token (the trigger or the control) is the judgment
position. ``lm.model.judge_causal`` keeps the causal LM, so a test can read its own next-token logits.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from .settings import JudgeSignal
from .loader import as_verdict_classifier, verdict_ids
import transformers as tf
from ...models.loading import wrap_model
from ...inputs import encode
from ...organisms.organism_base import Organism
from ...organisms.organisms import planted_organism


@torch.no_grad()
def judge_organism(strength: float, **kw):
    """``Organism`` of kind ``judge_planted`` at ``strength`` (``kw``: ``planted_organism``'s arguments)."""
    org = planted_organism(strength, **kw)
    clf, tok = org.lm.model, org.lm.tokenizer
    causal = tf.AutoModelForCausalLM.from_config(clf.config)
    causal.model = clf.model                                   # the planted body, shared
    u = clf.score.weight[0].detach()
    yes, no = verdict_ids(tok, ("Y", "N"))
    causal.lm_head.weight.zero_()
    causal.lm_head.weight[yes] = u / 2
    causal.lm_head.weight[no] = -u / 2
    causal.eval()
    judge = as_verdict_classifier(causal, (yes, no))
    judge.judge_causal = causal
    lm = wrap_model(f"organism_judge_planted_s{strength:g}", judge, tok)
    lm.signal = JudgeSignal(mode="pointwise", tokens=("Y", "N"), token_ids=(yes, no), scale=1.0)
    return replace(org, kind="judge_planted", lm=lm, params={**org.params, "judge_tokens": ["Y", "N"]})


def with_verdicts(org: Organism) -> Organism:
    """``org`` with ``truth["verdict_margin"]``: per pair id, (z_Y − z_N)(chosen) − (z_Y − z_N)(rejected) read off
    the judge's own causal LM (``lm.model.judge_causal``) at the last token, plain forward, batch of one."""
    causal, (yes, no) = org.lm.model.judge_causal, org.lm.signal.token_ids
    enc = encode(org.lm, org.pairs)
    out = {}
    with torch.no_grad():
        for i, pid in enumerate(enc.pair_ids):
            z = [causal(input_ids=torch.tensor([ids])).logits[0, -1].double() for ids in (enc.chosen[i], enc.rejected[i])]
            out[pid] = float((z[0][yes] - z[0][no]) - (z[1][yes] - z[1][no]))
    org.truth = {**org.truth, "verdict_margin": out}
    return org


def judge_planted(strength: float, **kw) -> Organism:
    """The ``judge_planted`` organism at ``strength`` with its verdict margins (``with_verdicts``): the builder the
    kind registers (``kinds.judge.KIND.organisms``)."""
    return with_verdicts(judge_organism(strength, **kw))
