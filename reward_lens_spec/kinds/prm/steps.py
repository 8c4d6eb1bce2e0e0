"""Process reward models (``model.kind=prm``): the reward head read at every step boundary.

A PRM scores a reasoning response step by step: each step ends with a delimiter (``model.prm.step_token``,
e.g. ``"\\n\\n"`` or a special tag token), and the head read at the delimiter's last token is that step's
reward (a logit; p = σ(r)). The head is the sequence classifier's (``models.loading``) or, with
``model.prm.tokens: [good, bad]``, a verdict row ``W_U[good] − W_U[bad]`` through the unembedding
(Math-Shepherd style; ``kinds.judge``).

Steps are found in the formatted TOKEN ids, never in text offsets (``boundaries``): every occurrence of
the delimiter's id sequence at or after the side's first response token (``engine.per_token.
response_starts``) ends a step. A last step that does not end with the delimiter — the response's text has
something other than whitespace after its last ``step_token``, often the final answer — is a step too, read
at the side's last token (the readout token the head reads), unless ``model.prm.final_step=drop`` (the
readings before that key existed). A side in which the delimiter never occurs is one step read at its last
token, and its pair carries the flag ``no_step_separator`` (a coord on every result of a PRM run, and the run
attr ``pair_flags``; ``side_steps``): the whole response read as one step is never silent. The readout
position of every instrument is step ``model.prm.step`` (−1 = the last; default): each side is cut just
after that step's boundary token (``cut_at_step``, the kind's encoding hook). A causal model's state at
a position depends only on the tokens up to it, so the cut sequence's last token carries exactly the
state the full sequence has at that boundary; score, lens, DLA (Σ = step margin), patching, steering …
then read that step unchanged. A side with fewer steps than asked is a ``SpecError`` naming
``model.prm.step``.

Per-step rewards and margins (pair × side × step) and the aggregate the model card uses
(``model.prm.aggregate``: ``last`` σ(r_last), ``min`` min_k σ(r_k), ``prod`` Π_k σ(r_k); probabilities)
are the ``prm_steps`` operator (``ops/prm_steps.py``; ``conf/observable/prm_steps.yaml``), over the
steps up to the readout step. Its ``step`` dim spans the most steps any side of the run has (sized before
the first chunk, ``planning.data_widths``); a side with fewer is NaN past its last step (coord ``n_steps``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...errors import SpecError
from .settings import AGGREGATES

NO_STEP_SEPARATOR = "no_step_separator"         # the pair flag (data.pairs.KIND_FLAGS)


@dataclass(frozen=True)
class PrmSignal:
    """``LoadedModel.signal`` of a PRM: the delimiter's ids, the readout step, the aggregate, the verdict."""

    step_token: str
    step_ids: tuple[int, ...]
    step: int = -1
    aggregate: str = "last"
    final_step: str = "include"     # include | drop: a last step that does not end with the delimiter
    verdict: object = None          # a JudgeSignal when the head is a verdict row
    kind: str = "prm"


def step_ids(tokenizer, step_token: str) -> tuple[int, ...]:
    """The delimiter's token ids (a special token is one id); ``SpecError`` when it encodes to none."""
    ids = tuple(int(t) for t in tokenizer(step_token, add_special_tokens=False)["input_ids"])
    if not ids:
        raise SpecError("model.prm.step_token", f"{step_token!r} encodes to no token.", value=step_token,
                        fix="choose a delimiter the tokenizer encodes.")
    return ids


def prm_signal(spec, tokenizer, verdict=None) -> PrmSignal:
    p = spec.prm
    return PrmSignal(step_token=p.step_token, step_ids=step_ids(tokenizer, p.step_token), step=int(p.step),
                     aggregate=p.aggregate, final_step=p.final_step, verdict=verdict)


def default_signal(tokenizer) -> PrmSignal:
    """How ``prm_steps`` reads a model loaded as another kind: delimiter ``"\\n\\n"``, aggregate ``last``, the
    final step included."""
    return PrmSignal(step_token="\n\n", step_ids=step_ids(tokenizer, "\n\n"))


def delimiter_ends(ids, delim: tuple[int, ...], start: int) -> list[int]:
    """Positions of the last token of every delimiter occurrence at or after ``start`` (non-overlapping,
    left to right)."""
    out, n, i = [], len(delim), int(start)
    while i + n <= len(ids):
        if tuple(ids[i:i + n]) == delim:
            out.append(i + n - 1)
            i += n
        else:
            i += 1
    return out


def boundaries(ids, delim: tuple[int, ...], start: int, *, final: bool = False) -> list[int]:
    """Step boundaries of one side: ``delimiter_ends``, then the last position ``len(ids) − 1`` when ``final`` (an
    unterminated last step, read at the readout token) and no delimiter ends there; ``[len(ids) − 1]`` when there
    is no delimiter at all (the whole response is one step)."""
    out = delimiter_ends(ids, delim, start)
    if final and out and out[-1] != len(ids) - 1:
        out.append(len(ids) - 1)
    return out or [len(ids) - 1]


def unterminated(response: str, step_token: str) -> bool:
    """True when ``response`` has text other than whitespace after its last ``step_token`` (all of it when the
    token never occurs): a last step that does not end with the delimiter."""
    return bool(response.rsplit(step_token, 1)[-1].strip())


def side_steps(tokenizer, pairs, enc, sig: PrmSignal) -> tuple[list[list[list[int]]], list[str]]:
    """Step boundary positions per (pair, side) of ``enc`` (``boundaries``; the unterminated last step kept unless
    ``sig.final_step == "drop"``), and the ids of the pairs with a side in which the delimiter never occurs after
    the response start (flag ``no_step_separator``)."""
    from ...engine.per_token import response_starts

    starts = response_starts(tokenizer, pairs, enc)
    by_id = {p.id: p for p in pairs}
    out, no_sep = [], []
    for i, (pid, c, r) in enumerate(zip(enc.pair_ids, enc.chosen, enc.rejected)):
        texts = (by_id[pid].chosen, by_id[pid].rejected)
        if any(not delimiter_ends(ids, sig.step_ids, starts[i, s]) for s, ids in enumerate((c, r))):
            no_sep.append(pid)
        out.append([boundaries(ids, sig.step_ids, starts[i, s],
                               final=sig.final_step == "include" and unterminated(texts[s], sig.step_token))
                    for s, ids in enumerate((c, r))])
    return out, no_sep


def cut_at_step(enc, lm, spec, pairs):
    """``enc`` with each side cut just after step ``model.prm.step``'s boundary (the kind's encoding hook), and
    the pairs with a side that holds no delimiter flagged ``no_step_separator`` (``EncodedPairs.kind_flags``)."""
    sig = getattr(lm, "signal", None)
    if not isinstance(sig, PrmSignal):
        sig = prm_signal(spec, lm.tokenizer)
    k = sig.step
    chosen, rejected, short = [], [], []
    bounds, no_sep = side_steps(lm.tokenizer, pairs, enc, sig)
    for i, sides in enumerate(bounds):
        cut = []
        for s, (ids, b) in enumerate(zip((enc.chosen[i], enc.rejected[i]), sides)):
            if not -len(b) <= k < len(b):
                short.append(f"{enc.pair_ids[i]}/{('chosen', 'rejected')[s]} ({len(b)} steps)")
                cut.append(ids)
                continue
            cut.append(list(ids[:b[k] + 1]))
        chosen.append(cut[0])
        rejected.append(cut[1])
    if short:
        raise SpecError("model.prm.step", f"step {k} does not exist on {len(short)} side(s): {short[:5]}.",
                        value=k, fix="use model.prm.step=-1 (the last step) or a step every response has.")
    return replace(enc, chosen=chosen, rejected=rejected, kind_flags={**enc.kind_flags, NO_STEP_SEPARATOR: no_sep})


def load_prm(spec, base_dir: str | None = None):
    """The ``LoadedModel`` of a PRM: the classifier (or, with ``model.prm.tokens``, the verdict-row judge) with
    its ``PrmSignal``."""
    if spec.prm.tokens is not None:
        from ..judge.loader import load_judge
        lm = load_judge(spec, base_dir, tokens=spec.prm.tokens, field="model.prm.tokens", mode="pointwise")
    else:
        from ...models.loading import load_model
        lm = load_model(spec, base_dir)
    lm.signal = prm_signal(spec, lm.tokenizer, verdict=lm.signal)
    return lm


def aggregate(step_rewards: np.ndarray, how: str) -> np.ndarray:
    """Aggregate per-step rewards (..., step; NaN past a side's last step) into a probability (...)."""
    p = 1.0 / (1.0 + np.exp(-np.asarray(step_rewards, np.float64)))
    if how == "last":
        n = np.sum(np.isfinite(p), -1)
        return np.take_along_axis(p, np.maximum(n - 1, 0)[..., None], -1)[..., 0]
    if how == "min":
        return np.nanmin(p, -1)
    if how == "prod":
        return np.nanprod(p, -1)
    raise SpecError("model.prm.aggregate", f"unknown aggregate '{how}'.", value=how, options=AGGREGATES)
