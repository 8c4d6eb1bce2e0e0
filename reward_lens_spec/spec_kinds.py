"""Config schemas of the non-classifier reward-signal kinds (``model.kind``; ``kinds``): the
``model.implicit``, ``model.ensemble``, ``model.judge`` and ``model.prm`` nodes of ``spec.ModelSpec``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ImplicitSpec:
    """``model.kind=implicit`` (DPO): ``r = beta · Σ_t [log π(y_t|x,y_<t) − log π_ref(y_t|x,y_<t)]`` over response
    tokens; ``reference``: a ``conf/model`` option, a model YAML path or an inline model mapping, null for
    reference-free; ``length_normalize``: the mean over response tokens instead of the sum (SimPO)."""

    beta: float = 0.1
    reference: Optional[Any] = None
    length_normalize: bool = False


@dataclass
class EnsembleSpec:
    """``model.kind=ensemble``: member rewards reduced per side by ``reduce`` (mean | min | quantile, with ``q``)."""

    reduce: str = "mean"
    q: float = 0.5


@dataclass
class JudgeSpec:
    """``model.kind=judge`` (``kinds.judge``): the verdict is the logit difference of two tokens.

    ``tokens``: [yes, no] token strings, each one token of the model's tokenizer (pairwise: [first, second],
    "the response shown first is better" first). ``mode``: ``pointwise`` (one response per prompt; margin =
    verdict(chosen) − verdict(rejected)) or ``pairwise`` (both responses in one prompt, both orders).
    """

    mode: str = "pointwise"
    tokens: list[str] = field(default_factory=lambda: [" Yes", " No"])


@dataclass
class PrmSpec:
    """``model.kind=prm`` (``kinds.prm``): the head read at every step boundary.

    ``step_token``: the delimiter that ends a step (found in the formatted token ids); ``step``: which step's
    boundary is the readout position (−1 = last); ``aggregate``: ``last`` | ``min`` | ``prod`` of the
    per-step probabilities σ(r); ``tokens``: null (the sequence-classifier head) or [good, bad] verdict tokens
    (a Math-Shepherd-style PRM read through the unembedding, as ``model.kind=judge``); ``final_step``: ``include``
    (default) reads a last step that does not end with ``step_token`` (often the final answer) at the side's
    readout token, ``drop`` leaves it out (the readings before this key existed).
    """

    step_token: str = "\n\n"
    step: int = -1
    aggregate: str = "last"
    final_step: str = "include"
    tokens: Optional[list[str]] = None
