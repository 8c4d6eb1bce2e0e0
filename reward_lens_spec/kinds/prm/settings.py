"""A process reward model's settings (``model.prm.*``), checked before any model loads.

Light (no torch): ``spec`` validation reaches it through the kinds table (``kinds``); the step math and the
loader are ``kinds.prm.steps``. Errors: ``SpecError`` naming ``model.prm.*``.
"""
from __future__ import annotations

from ...errors import SpecError
from ..judge.settings import check_tokens

AGGREGATES = ("last", "min", "prod")
FINAL_STEPS = ("include", "drop")


def check_prm(spec) -> None:
    """``model.prm.*`` valid before any model loads (``SpecError`` naming the key)."""
    p = spec.prm
    if p.aggregate not in AGGREGATES:
        raise SpecError("model.prm.aggregate", f"unknown aggregate '{p.aggregate}'.", value=p.aggregate,
                        options=AGGREGATES)
    if p.final_step not in FINAL_STEPS:
        raise SpecError("model.prm.final_step", f"unknown value '{p.final_step}'.", value=p.final_step,
                        options=FINAL_STEPS)
    if not isinstance(p.step_token, str) or not p.step_token:
        raise SpecError("model.prm.step_token", "needs a non-empty delimiter string (or special token).",
                        fix="e.g. model.prm.step_token='\\n\\n'.")
    if p.tokens is not None:
        check_tokens(list(p.tokens), "model.prm.tokens")
    if int(spec.num_labels) != 1 or str(getattr(spec.head, "value", spec.head)) != "linear":
        raise SpecError("model.num_labels", "a PRM step reward is one linear row.",
                        fix="set model.num_labels=1 and model.head=linear with model.kind=prm.")


def prm_settings(spec) -> dict:
    p = spec.prm
    return {"step_token": p.step_token, "step": int(p.step), "aggregate": p.aggregate,
            "tokens": None if p.tokens is None else list(p.tokens), "final_step": p.final_step}
