"""prm_labels, prm_grade: a model's step rewards graded against the per-step labels of stepwise data.

Data: TRL's stepwise supervision (``dataset=trl_stepwise``, ``data.readers``): one response per row — a prompt,
its steps, each followed by ``dataset.step_separator``, and one true/false label per step (true: a correct
step). The stored ``pair`` dim indexes rows (the executor's one row axis); there is no ``side``.

``prm_labels`` (per row; reads the data, so only a ``trl_stepwise`` run holds it):
  quantity=step_reward  row × step   the head (bias included) on the final-norm output at step k's boundary
                                     token (the separator's last token; ``kinds.prm.steps.side_steps``), from the
                                     shared per-token pass (``engine.per_token.prefix_pass``); NaN past the
                                     row's last step (coord ``n_steps``). Units: reward (a logit; p = σ(r)).
  quantity=step_label   row × step   1.0 (correct) / 0.0 (wrong), NaN past the last step
  quantity=first_error  row × source (label, model): the first step labelled false, and the first step the
                                     model grades wrong (r ≤ 0, i.e. σ(r) ≤ ½); −1 where there is none
                                     (ProcessBench's convention, Zheng et al. 2024)
The steps are found in the token ids at ``dataset.step_separator`` (a PRM's own ``model.prm.step_token`` must
equal it); a row where the model finds another number of steps than it has labels is a ``SpecError`` naming
the row (its separator merged with a neighbouring character into one token).

``prm_grade`` (reduces over rows; input: [step_reward, step_label]):
  quantity=accuracy              per-step accuracy: the fraction of labelled steps with 1[r > 0] = label
  quantity=auc                   AUC of r for correct vs wrong steps, pooled over rows: P(r₊ > r₋) + ½ P(r₊ = r₋)
                                 (Mann–Whitney U / (n₊ n₋)); NaN when either class is empty
  quantity=first_error_accuracy  the fraction of rows whose model first-error step equals the labelled one
Each is a scalar (units fraction; attrs ``n_steps`` and ``n_rows``). Gauge: invariant. Source: process
supervision (Lightman et al. 2023, "Let's Verify Step by Step"; TRL's PRMTrainer reads the same data).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..data.readers import STEP_LABELS
from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice
from .base import INVARIANT, Operator, labelled
from ..kinds.prm.steps import PrmSignal, step_ids, side_steps
from scipy.stats import rankdata

_Q = ("step_reward", "step_label", "first_error")
_G = ("accuracy", "auc", "first_error_accuracy")


@dataclass(frozen=True)
class PrmLabelsParams:
    quantity: str = "step_reward"
    batch_size: int = 16


@OPERATORS.register
class PrmLabels(Operator):
    """A model's reward at every step of a stepwise row, the row's step labels, the first-error steps."""

    name = "prm_labels"
    dims = "() → pair × step | pair × source"
    Params = PrmLabelsParams
    n_inputs = 0
    per_pair = True
    reruns = True
    rows = "only"
    data_dims = ("step",)
    pair_fields = (STEP_LABELS,)

    def out_dims(self, in_dims, info, where):
        choice(self.p.quantity, _Q, where + ".quantity")
        if self.p.batch_size < 1:
            raise SpecError(where + ".batch_size", f"must be >= 1, got {self.p.batch_size}.",
                            fix="e.g. batch_size: 8 in the step.")
        if info.n_outputs != 1:
            raise SpecError(where, f"a step reward is one head row; this model's head has {info.n_outputs} outputs.",
                            fix="read a one-row head (model.num_labels=1).")
        return ("pair", "source") if self.p.quantity == "first_error" else ("pair", "step")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def width(self, dim, ctx):
        return max(len(b) for b in _steps(ctx)[0])

    def run(self, ctx):
        bounds, labels = _steps(ctx)
        reward = _rewards(ctx, bounds, self.p.batch_size)
        S = reward.shape[1]
        lab = np.full_like(reward, np.nan)
        for i, ls in enumerate(labels):
            lab[i, :len(ls)] = ls
        coords = ctx.pair_coords()
        n = np.array([len(b) for b in bounds], np.int64)
        if self.p.quantity == "first_error":
            arr = xr.DataArray(np.stack([first_error(lab), first_error(np.where(np.isnan(reward), np.nan,
                                                                                reward > 0))], axis=1),
                               dims=("pair", "source"), coords={**coords, "source": ["label", "model"]})
            return labelled(arr, "step", INVARIANT, "first step labelled wrong / graded wrong by the model "
                            "(r ≤ 0); −1: none")
        data, units, what = (reward, "reward", "head at each step boundary (step 0 = first step)") \
            if self.p.quantity == "step_reward" else (lab, "label", "step label: 1 correct, 0 wrong")
        arr = xr.DataArray(data, dims=("pair", "step"),
                           coords={**coords, "step": np.arange(S), "n_steps": ("pair", n)})
        return labelled(arr, units, INVARIANT, what)


def first_error(correct: np.ndarray) -> np.ndarray:
    """Per row (row × step; 1 correct, 0 wrong, NaN past the last step): the first wrong step, −1 if none."""
    wrong = np.nan_to_num(np.asarray(correct, np.float64), nan=1.0) == 0.0
    return np.where(wrong.any(1), wrong.argmax(1), -1).astype(np.float64)


def _signal(ctx):
    sep = getattr(ctx.pairs, "step_separator", None)
    if sep is None:
        raise SpecError("dataset.kind", "prm_labels reads stepwise rows, and these data are not stepwise.",
                        fix="use dataset=trl_stepwise (prompt, completions, labels).")
    own = getattr(ctx.lm, "signal", None)
    if isinstance(own, PrmSignal) and own.step_token != sep:
        raise SpecError("dataset.step_separator", f"the rows' steps end with {sep!r}, but this PRM ends a step at "
                        f"model.prm.step_token={own.step_token!r}.",
                        fix="set dataset.step_separator to the PRM's step token (or the PRM's to the data's).")
    return PrmSignal(step_token=sep, step_ids=step_ids(ctx.lm.tokenizer, sep), final_step="include")


def _steps(ctx):
    """Step boundaries of each row's response (side 0) and the row's labels; ``SpecError`` on a count mismatch."""
    if "prm_rows" not in ctx.memo:
        bounds = [sides[0] for sides in side_steps(ctx.lm.tokenizer, ctx.pairs, ctx.encoded, _signal(ctx))[0]]
        by_id = {p.id: p for p in ctx.pairs}
        labels = []
        for pid, b in zip(ctx.encoded.pair_ids, bounds):
            ls = [1.0 if x else 0.0 for x in json.loads(by_id[pid].meta_dict()[STEP_LABELS])]
            if len(ls) != len(b):
                raise SpecError("dataset.step_separator", f"row {pid!r}: the model finds {len(b)} step(s) at "
                                f"{ctx.pairs.step_separator!r} in its tokens, the row labels {len(ls)}.",
                                fix="choose a separator the tokenizer keeps as its own token(s) (e.g. '\\n\\n'), "
                                    "or check the row's steps.")
            labels.append(ls)
        ctx.memo["prm_rows"] = (bounds, labels)
    return ctx.memo["prm_rows"]


def _rewards(ctx, bounds, batch_size):
    """row × step: the head at each boundary of side 0 (the shared per-token pass, memoized as ``prefix``)."""
    from ..engine.per_token import prefix_pass, response_starts

    pkey = ("prefix", batch_size)
    if pkey not in ctx.memo:
        starts = response_starts(ctx.lm.tokenizer, ctx.pairs, ctx.encoded)
        reward, lens_arr = prefix_pass(ctx.lm, ctx.encoded, starts, lens=True, batch_size=batch_size,
                                       padding_side=getattr(ctx.lm.tokenizer, "padding_side", "left"),
                                       gate=ctx.capture.gate)
        ctx.memo[pkey] = (starts, reward, lens_arr)
    starts, reward, _ = ctx.memo[pkey]
    out = np.full((len(bounds), max(len(b) for b in bounds)), np.nan)
    for i, b in enumerate(bounds):
        out[i, :len(b)] = reward[i, 0, np.asarray(b) - starts[i, 0], 0]
    return out


@dataclass(frozen=True)
class PrmGradeParams:
    quantity: str = "accuracy"


@OPERATORS.register
class PrmGrade(Operator):
    """Per-step accuracy, AUC and first-error accuracy of step rewards against step labels, over every row."""

    name = "prm_grade"
    dims = "[step_reward, step_label] (pair × step) → ()"
    Params = PrmGradeParams
    n_inputs = 2
    rows = "any"

    def out_dims(self, in_dims, info, where):
        choice(self.p.quantity, _G, where + ".quantity")
        if any(tuple(d) != ("pair", "step") for d in in_dims[:2]) or len(in_dims) != 2:
            raise SpecError(where + ".input", f"reads [step_reward, step_label] (pair × step each), got {in_dims}.",
                            fix="input: [<a prm_labels step_reward step>, <a prm_labels step_label step>].")
        return ()

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, reward, label):
        r = np.asarray(reward.transpose("pair", "step").values, np.float64)
        y = np.asarray(label.transpose("pair", "step").values, np.float64)
        value = grade(r, y, self.p.quantity)
        out = labelled(xr.DataArray(value), "fraction", INVARIANT, {
            "accuracy": "per-step accuracy: fraction of labelled steps with 1[r > 0] = label",
            "auc": "AUC of the step reward for correct vs wrong steps (Mann–Whitney), pooled over rows",
            "first_error_accuracy": "fraction of rows whose first model-graded-wrong step is the labelled one",
        }[self.p.quantity])
        out.attrs.update(n_steps=int(np.isfinite(y).sum()), n_rows=int(y.shape[0]))
        return out


def grade(r: np.ndarray, y: np.ndarray, quantity: str) -> float:
    """``quantity`` of step rewards ``r`` against labels ``y`` (row × step, NaN past a row's last step)."""
    cells = np.isfinite(y)
    if quantity == "accuracy":
        return float(((r[cells] > 0) == (y[cells] == 1)).mean()) if cells.any() else float("nan")
    if quantity == "first_error_accuracy":
        pred = first_error(np.where(cells, (r > 0).astype(np.float64), np.nan))
        return float((pred == first_error(y)).mean()) if len(y) else float("nan")
    pos, neg = r[cells & (y == 1)], r[cells & (y == 0)]
    if not len(pos) or not len(neg):
        return float("nan")
    ranks = rankdata(np.concatenate([pos, neg]))                  # mid-ranks: ties count half
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))
