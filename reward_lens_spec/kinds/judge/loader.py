"""Generative judges (``model.kind=judge``): the verdict as a one-row linear readout head.

A judge is a causal LM asked a question about a response ("… Is the response good? Answer:"); its
verdict is the next-token logit difference of two verdict tokens at the judgment position (the last
token of the judge template): ``z_yes − z_no = (W_U[yes] − W_U[no])·h + (b_yes − b_no)``, ``h`` the
final-norm output there. That is a linear reward head with one row,

    w = s · (W_U[yes] − W_U[no]),    b = s · (b_U[yes] − b_U[no])   (0 without an unembedding bias)

so the judge is wrapped as the family's ``*ForSequenceClassification`` sharing the causal LM's body,
with ``score`` = that row (``as_verdict_classifier``), and every linear instrument (score, lens,
crystallization, DLA with Σ = verdict margin, patching, head patching, attribution patching,
steering, frames) applies unchanged: the capture's self-check ties ``w·h + b`` to the model's own
output, and Σ DLA = verdict margin exactly. Gemma-2's final logit soft-capping is not part of the
readout (the margin is the pre-cap logit difference, the linear quantity).

Modes (``model.judge.mode``):

``pointwise``  one response per prompt (``{prompt}`` / ``{response}`` in the template, the template
               ending with the question); ``s = 1``; margin = verdict(chosen) − verdict(rejected).
``pairwise``   both responses in one prompt: the template names ``{response}`` (shown first: the
               side's own response) and ``{other}`` (the pair's other response), so the ``chosen`` side
               is order AB (chosen first) and the ``rejected`` side is order BA; ``tokens`` = [first,
               second] ("the response shown first is better" first); ``s = ½``. Then the margin
               r_AB − r_BA = ½[(z_A − z_B)_AB − (z_A − z_B)_BA] is the verdict for the chosen response
               averaged over both orders, and ``r_chosen + r_rejected`` = ½[(z_A − z_B)_AB + (z_A − z_B)_BA]
               is the order (position) bias: the mean preference for whatever is shown first
               (``conf/observable/judge_pairwise.yaml`` stores it as ``order_bias``). A "side" is a
               whole two-response prompt, so per-token reward over one response (``prefix``) is refused.

Verdict tokens are checked to be one token each of the judge's tokenizer (``verdict_ids``). Errors:
``SpecError`` naming ``model.judge.*`` (mode, tokens), ``model.num_labels`` / ``model.head`` (a verdict
is one linear row), ``model.template`` (pairwise without ``{other}``).
"""
from __future__ import annotations

import torch

from ...errors import SpecError
from .settings import JudgeSignal
from ...models.causal import load_causal
import transformers as tf
from ...models.loading import resolve_device, wrap_model


def verdict_ids(tokenizer, tokens, field: str = "model.judge.tokens") -> tuple[int, int]:
    """The token id of each verdict string; ``SpecError`` when one is not exactly one token."""
    ids = []
    for t in tokens:
        got = tokenizer(t, add_special_tokens=False)["input_ids"]
        if len(got) != 1:
            raise SpecError(field, f"{t!r} is {len(got)} tokens {list(got)} of this tokenizer, not one; a verdict "
                            "is read as one token's logit.", value=t,
                            fix="pick strings that are one token each (mind the leading space), e.g. ' Yes' / ' No' "
                                "for a BPE vocabulary, 'Y' / 'N' for the tiny byte-level one.")
        ids.append(int(got[0]))
    return ids[0], ids[1]


@torch.no_grad()
def as_verdict_classifier(causal, token_ids: tuple[int, int], scale: float = 1.0):
    """The family's ``*ForSequenceClassification`` sharing ``causal``'s body, its ``score`` the verdict row
    ``scale·(W_U[yes] − W_U[no])`` (bias: the unembedding's bias difference, when it has one)."""
    out = causal.get_output_embeddings()
    W = out.weight.detach()
    yes, no = token_ids
    row = (W[yes] - W[no]).float() * scale
    cfg = causal.config
    cfg.num_labels = 1
    clf = tf.AutoModelForSequenceClassification.from_config(cfg)
    setattr(clf, clf.base_model_prefix, getattr(causal, causal.base_model_prefix))   # the same modules
    bias = getattr(out, "bias", None)
    clf.score = torch.nn.Linear(row.shape[0], 1, bias=bias is not None)
    clf.score.weight.copy_(row[None])
    if bias is not None:
        clf.score.bias.copy_(((bias[yes] - bias[no]).float() * scale)[None])
    clf.config.pad_token_id = causal.config.pad_token_id
    return clf.to(W.dtype).eval()


def load_judge(spec, base_dir: str | None = None, *, tokens=None, field: str = "model.judge.tokens",
               mode: str | None = None):
    """The ``LoadedModel`` of a judge: the causal LM wrapped with its verdict row (module docstring)."""
    mode = mode or spec.judge.mode
    tokens = tuple(tokens if tokens is not None else spec.judge.tokens)
    lm_ = load_causal(spec, base_dir)                  # models.causal: the one spec → causal-LM loader
    causal, tok = lm_.model, lm_.tokenizer
    ids = verdict_ids(tok, tokens, field)
    scale = 0.5 if mode == "pairwise" else 1.0
    clf = as_verdict_classifier(causal, ids, scale)
    lm = wrap_model(spec.name, clf, tok, dtype=str(getattr(spec.dtype, "value", spec.dtype)),
                    device=resolve_device(str(getattr(spec.device, "value", spec.device))),
                    objectives=tuple(spec.objectives) or None)
    lm.signal = JudgeSignal(mode=mode, tokens=tokens, token_ids=ids, scale=scale)
    return lm
