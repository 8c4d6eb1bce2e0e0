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

from dataclasses import dataclass

import torch

from ..errors import SpecError
from .causal import load_causal
import transformers as tf
from .loading import resolve_device, wrap_model

MODES = ("pointwise", "pairwise")


@dataclass(frozen=True)
class JudgeSignal:
    """``LoadedModel.signal`` of a judge: mode, verdict tokens and their ids, row scale ``s``."""

    mode: str
    tokens: tuple[str, str]
    token_ids: tuple[int, int]
    scale: float
    kind: str = "judge"


def check_judge(spec) -> None:
    """``model.judge.*`` valid before any model loads (``SpecError`` naming the key)."""
    j = spec.judge
    if j.mode not in MODES:
        raise SpecError("model.judge.mode", f"unknown judge mode '{j.mode}'.", value=j.mode, options=MODES)
    check_tokens(list(j.tokens), "model.judge.tokens")
    if int(spec.num_labels) != 1 or str(getattr(spec.head, "value", spec.head)) != "linear":
        raise SpecError("model.num_labels", "a judge's verdict is one linear row (logit(yes) − logit(no)).",
                        fix="set model.num_labels=1 and model.head=linear with model.kind=judge.")
    fmt = str(getattr(spec.format, "value", spec.format))
    if j.mode == "pairwise" and fmt == "plain" and "{other}" not in spec.template:
        raise SpecError("model.template", "a pairwise judge shows both responses: the template needs {other} "
                        "(the pair's other response) next to {response} (the side's own, shown first).",
                        fix="e.g. 'Question: {prompt}\\nA: {response}\\nB: {other}\\nWhich is better? Answer:'.")
    if j.mode == "pairwise" and fmt != "plain":
        raise SpecError("model.format", "a pairwise judge needs model.format=plain (a template with {response} and "
                        "{other}); a chat template shows one response.", fix="set model.format=plain.")


def check_tokens(tokens, field: str) -> None:
    """Two distinct, non-empty verdict strings."""
    if len(tokens) != 2 or any(not isinstance(t, str) or not t for t in tokens) or tokens[0] == tokens[1]:
        raise SpecError(field, f"needs two distinct non-empty token strings [yes, no], got {tokens!r}.",
                        fix=f"e.g. {field}=[' Yes',' No'].")


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


def judge_settings(spec) -> dict:
    return {"mode": spec.judge.mode, "tokens": list(spec.judge.tokens)}


def refused_ops(spec) -> dict[str, str]:
    if spec.judge.mode == "pairwise":
        return {"prefix": "a pairwise side is a whole two-response prompt: per-token reward over one response does "
                          "not apply."}
    return {}


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
