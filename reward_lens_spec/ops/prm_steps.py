"""prm_steps: a process reward model's reward at every step boundary, per-step margins, the aggregate.

quantity=reward            ``step_reward``       pair × side × step: the head (bias included) on the final-norm
                           output at step k's boundary token (the delimiter's last token; an unterminated
                           last step's is the side's last token unless ``model.prm.final_step=drop``;
                           ``kinds.prm``), NaN past a side's last step. The readout step's reward equals
                           ``reward``.
quantity=margin            ``step_margin``       pair × step: chosen − rejected at step k (NaN where either
                           side lacks step k)
quantity=aggregate         ``aggregate``         pair × side: the model card's aggregate of the per-step
                           probabilities σ(r_k) — ``last``, ``min`` or ``prod`` (``model.prm.aggregate``,
                           recorded in the attr ``aggregate``); units probability
quantity=aggregate_margin  ``aggregate_margin``  pair: aggregate(chosen) − aggregate(rejected); units probability
Steps are read up to the run's readout step (``model.prm.step``; −1: all). Coord ``n_steps`` (pair × side;
``n_steps_chosen`` / ``_rejected`` on the margin). Dim ``step`` (step k = the k-th step from the response start)
spans the most steps any side of the whole run has (``width``: sized before the first chunk,
``planning.data_widths``), so a side with fewer steps, in any chunk, is NaN from ``n_steps`` on (attr
``padding``). A model loaded as another kind is read at the default delimiter ``"\\n\\n"`` with aggregate
``last`` (and no ``no_step_separator`` flag: that is a PRM run's).
Reads per-position rewards from the shared per-token pass (``engine.per_token.prefix_pass``, the same one
``prefix`` uses). Gauge: invariant. Source: process supervision (Lightman et al. 2023, "Let's Verify Step
by Step": product / min of step probabilities; Wang et al. 2024, Math-Shepherd: min).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..kinds.prm.steps import PrmSignal, aggregate, default_signal, side_steps
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled

_Q = ("reward", "margin", "aggregate", "aggregate_margin")


@dataclass(frozen=True)
class PrmStepsParams:
    quantity: str = "reward"
    batch_size: int = 16


@OPERATORS.register
class PrmSteps(Operator):
    """Per-step rewards of a PRM (pair × side × step), per-step margins, the recorded aggregate."""

    name = "prm_steps"
    dims = "() → pair × side × step | pair × step | pair × side | pair"
    per_pair = True
    Params = PrmStepsParams
    n_inputs = 0
    reruns = True
    data_dims = ("step",)

    def width(self, dim, ctx):
        """The most steps any side of ``ctx``'s pairs has (up to the readout step)."""
        return max(len(b) for sides in _bounds(ctx)[0] for b in sides)

    def out_dims(self, in_dims, info, where):
        if self.p.quantity not in _Q:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=_Q)
        if self.p.batch_size < 1:
            raise SpecError(where + ".batch_size", f"must be >= 1, got {self.p.batch_size}.",
                            fix="e.g. batch_size: 8 in the step.")
        if info.n_outputs != 1:
            raise SpecError(where, "a step reward is one head row; this model's head has "
                            f"{info.n_outputs} outputs.", fix="read a one-row head (model.num_labels=1).")
        return {"reward": ("pair", "side", "step"), "margin": ("pair", "step"), "aggregate": ("pair", "side"),
                "aggregate_margin": ("pair",)}[self.p.quantity]

    def gauge(self, in_gauges, info):
        return INVARIANT

    def _steps(self, ctx):
        from ..engine.per_token import prefix_pass, response_starts

        key = ("prm_steps", self.p.batch_size)
        if key in ctx.memo:
            return ctx.memo[key]
        pkey = ("prefix", self.p.batch_size)
        if pkey not in ctx.memo:                   # the same pass (and memo) as the prefix op
            starts = response_starts(ctx.lm.tokenizer, ctx.pairs, ctx.encoded)
            reward, lens_arr = prefix_pass(ctx.lm, ctx.encoded, starts, lens=True, batch_size=self.p.batch_size,
                                           padding_side=getattr(ctx.lm.tokenizer, "padding_side", "left"),
                                           gate=ctx.capture.gate)
            ctx.memo[pkey] = (starts, reward, lens_arr)
        starts, reward, _ = ctx.memo[pkey]
        bounds, how = _bounds(ctx)
        n = len(bounds)
        S = max(len(b) for sides in bounds for b in sides)
        out = np.full((n, 2, S), np.nan)
        counts = np.zeros((n, 2), np.int64)
        for i, sides in enumerate(bounds):
            for s, b in enumerate(sides):
                rel = np.asarray(b) - starts[i, s]
                out[i, s, :len(b)] = reward[i, s, rel, 0]
                counts[i, s] = len(b)
        ctx.memo[key] = (out, counts, how)
        return ctx.memo[key]

    def run(self, ctx):
        steps, counts, how = self._steps(ctx)
        coords = ctx.pair_coords()
        q = self.p.quantity
        if q == "reward":
            arr = xr.DataArray(steps, dims=("pair", "side", "step"),
                               coords={**coords, "side": ["chosen", "rejected"], "step": np.arange(steps.shape[2]),
                                       "n_steps": (("pair", "side"), counts)})
            return labelled(arr, "reward", INVARIANT, "head at each step boundary (step 0 = first step)")
        if q == "margin":
            arr = xr.DataArray(steps[:, 0] - steps[:, 1], dims=("pair", "step"),
                               coords={**coords, "step": np.arange(steps.shape[2]),
                                       "n_steps_chosen": ("pair", counts[:, 0]),
                                       "n_steps_rejected": ("pair", counts[:, 1])})
            return labelled(arr, "reward", INVARIANT, "chosen − rejected step reward, per step")
        agg = aggregate(steps, how)
        if q == "aggregate":
            arr = xr.DataArray(agg, dims=("pair", "side"), coords={**coords, "side": ["chosen", "rejected"]})
            out = labelled(arr, "probability", INVARIANT, f"aggregate '{how}' of per-step σ(r)")
        else:
            arr = xr.DataArray(agg[:, 0] - agg[:, 1], dims=("pair",), coords=coords)
            out = labelled(arr, "probability", INVARIANT, f"aggregate '{how}' chosen − rejected")
        out.attrs["aggregate"] = how
        return out


def _bounds(ctx):
    """Step boundaries per (pair, side) of ``ctx``'s encoded pairs (``kinds.prm.steps.side_steps``) and the aggregate
    the model card uses: the PRM's own signal, or for another kind ``kinds.prm.steps.default_signal``."""
    if "prm_bounds" not in ctx.memo:
        sig = getattr(ctx.lm, "signal", None)
        sig = sig if isinstance(sig, PrmSignal) else default_signal(ctx.lm.tokenizer)
        ctx.memo["prm_bounds"] = (side_steps(ctx.lm.tokenizer, ctx.pairs, ctx.encoded, sig)[0], sig.aggregate)
    return ctx.memo["prm_bounds"]
