"""A judge's settings (``model.judge.*``), checked before any model loads: mode, verdict tokens, what it refuses.

Light (no torch): ``spec`` validation reaches it through the kinds table (``kinds``). The loader is
``kinds.judge.loader``. Errors: ``SpecError`` naming ``model.judge.*`` (mode, tokens), ``model.num_labels`` /
``model.head`` (a verdict is one linear row), ``model.template`` (pairwise without ``{other}``), ``model.format``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import SpecError

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


def judge_settings(spec) -> dict:
    return {"mode": spec.judge.mode, "tokens": list(spec.judge.tokens)}


def refused_ops(spec) -> dict[str, str]:
    if spec.judge.mode == "pairwise":
        return {"prefix": "a pairwise side is a whole two-response prompt: per-token reward over one response does "
                          "not apply."}
    return {}
