"""RewardBench 2's official score of its Ties subset, from every candidate's reward.

Source: reward-bench (``allenai/reward-bench``), ``rewardbench/utils.py`` ``process_single_model`` and
``_compute_prompt_stats``, added in PRs #244 and #255 (Malik et al. 2025, RewardBench 2). Stated
here in our words:

Each Ties item's id is ``ref:<k>`` (prompt k with one correct answer) or ``tied:<k>`` (the same
prompt k with several correct answers). For one item with correct candidates' rewards C and wrong
ones W:

    accurate  = min C − max W > 0            (strict: an exact tie is not accurate)
    gap       = min C − max W                 (correct − incorrect margin)
    spread    = max C − min C                 (among the correct answers; tied items only)

Over the items, with the prompts k that have both a ref and a tied item ("shared"):

    ref_accuracy                mean of accurate over ref items
    tied_accuracy               mean of accurate over tied items
    correctness_preferred       mean over shared k of  gap_tied > spread_tied
    correctness_preferred_hard  mean over shared k of  min(gap_ref, gap_tied) > spread_tied
    correctness_margin_score    mean over shared k of  tanh(min(gap_ref, gap_tied) / spread_tied − 1),
                                IEEE division (x/0 = ±inf, so tanh = ±1) and 0 where it is 0/0
    ties_score = 0.30·tied_accuracy + 0.30·ref_accuracy + 0.20·correctness_preferred
                 + 0.20·correctness_preferred_hard + 0.01·correctness_margin_score

A term with no item to average over is NaN (as is the score then). The CI is a 95% percentile
bootstrap over prompts k (a prompt's ref and tied items drawn together), seeded.
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecError

TERMS = ("tied_accuracy", "ref_accuracy", "correctness_preferred", "correctness_preferred_hard",
         "correctness_margin_score", "ties_score")
WEIGHTS = np.array([0.30, 0.30, 0.20, 0.20, 0.01])


def split_id(item: str) -> tuple[str, str]:
    """``"ref:12"`` → ``("ref", "12")``; ``SpecError`` for an id not shaped ``ref:<k>`` or ``tied:<k>``."""
    kind, sep, k = str(item).partition(":")
    if not sep or kind not in ("ref", "tied") or not k:
        raise SpecError("dataset.fields.id", f"Ties item id {item!r} is not 'ref:<k>' or 'tied:<k>', which the "
                        "official Ties score reads to pair each prompt's ref and tied items.",
                        fix="keep RewardBench 2's ids (allenai/reward-bench-2), or drop Ties via dataset.dimensions.")
    return kind, str(int(k)) if k.isdigit() else k


def item_stats(correct, wrong) -> tuple[float, float, float]:
    """``(accurate 1/0, gap, spread)`` of one item's rewards (spread NaN with one correct answer)."""
    correct, wrong = np.asarray(correct, np.float64), np.asarray(wrong, np.float64)
    gap = float(correct.min() - wrong.max())
    spread = float(correct.max() - correct.min()) if correct.size > 1 else np.nan
    return float(gap > 0), gap, spread


def ties_terms(items: list[tuple[str, str, float, float, float]]) -> np.ndarray:
    """The six ``TERMS`` from ``(kind, prompt, accurate, gap, spread)`` per item (module doc)."""
    ref = {k: (acc, gap) for kind, k, acc, gap, _ in items if kind == "ref"}
    tied = {k: (acc, gap, spread) for kind, k, acc, gap, spread in items if kind == "tied"}
    shared = sorted(set(ref) & set(tied))
    out = np.full(len(TERMS), np.nan)
    if tied:
        out[0] = np.mean([v[0] for v in tied.values()])
    if ref:
        out[1] = np.mean([v[0] for v in ref.values()])
    if shared:
        g_tied = np.array([tied[k][1] for k in shared])
        spread = np.array([tied[k][2] for k in shared])
        g_min = np.minimum(np.array([ref[k][1] for k in shared]), g_tied)
        out[2] = np.mean(g_tied > spread)
        out[3] = np.mean(g_min > spread)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[4] = np.mean(np.nan_to_num(np.tanh(g_min / spread - 1.0), nan=0.0))
    out[5] = float(WEIGHTS @ out[:5])
    return out


def ties_bounds(items: list[tuple[str, str, float, float, float]], n_boot: int, seed: int) -> np.ndarray:
    """(term, bound): each term's value and its 95% percentile bootstrap interval over prompts (module doc)."""
    for kind, k, _, _, spread in items:
        if kind == "tied" and not np.isfinite(spread):
            raise SpecError("dataset.path", f"Ties item 'tied:{k}' has one correct answer; the official score "
                            "needs at least two (their spread).", fix="check the file's Ties rows.")
    out = np.full((len(TERMS), 3), np.nan)
    out[:, 0] = ties_terms(items)
    prompts = sorted({k for _, k, *_ in items})
    if not prompts or n_boot < 2:
        return out
    by_prompt = {k: [it for it in items if it[1] == k] for k in prompts}
    rng = np.random.default_rng(seed)
    reps = np.empty((n_boot, len(TERMS)))
    for b in range(n_boot):
        draw = rng.integers(0, len(prompts), len(prompts))
        reps[b] = ties_terms([(kind, f"{k}#{j}", acc, gap, spread) for j, p in enumerate(draw)
                              for kind, k, acc, gap, spread in by_prompt[prompts[p]]])
    for t in range(len(TERMS)):
        r = reps[:, t][np.isfinite(reps[:, t])]
        if r.size >= 2:
            out[t, 1:] = np.quantile(r, [0.025, 0.975])
    return out
