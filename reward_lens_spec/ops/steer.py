"""steer: add α·ρ·û to the residual stream (resid_post of ``layer``); re-read the reward.

Dose-response of the reward along a direction. ``û`` is a unit direction:
  head | objective:<name>        the reward direction w_r / |w_r| (``head``: one objective, or a
                                 gated head's g(h)ᵀW averaged over pairs and sides)
  store:<url>#<run>/<obs>/<var>  a stored d_model vector, as ``project`` reads it
  mean_difference                mean over the run's pairs of (x_chosen − x_rejected) at that resid_post
  ``input: <step>``              a d_model direction computed by an earlier step (e.g. ``mean_direction``)
``α`` (``alphas``) is in units of ρ, the residual's RMS norm at that layer:
``ρ = sqrt(mean over every pair and side of |x|²)`` at the readout token (attr ``residual_rms``).
``positions``: ``readout`` (default) adds it at the readout token only (exact: copies of the readout
token over the cached prefix, one per α, ``engine.interventions.set_readout``); ``response`` adds it
at every response token, from the first response token (``engine.per_token.response_starts``) to the
readout token (one full forward per sequence and α, ``engine.steering.steer_response``; an α = 0
control run must reproduce the captured reward, or the run stops). At the last layer the two agree
exactly (only the readout position reaches the head).
``side``: which sides are steered (``both`` | ``chosen`` | ``rejected``); the others keep their reward.
Quantities: ``margin`` Δ(α) (pair × alpha), ``reward`` (pair × side × alpha), ``slope`` — the
least-squares slope of Δ over α (pair; reward per ρ). Gauge: invariant (a readout).
Source: activation addition (Turner et al. 2023, "Activation Addition"; Rimsky et al. 2024, CAA).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice, first_pairs, objective_dims, result, reward_direction
from .base import INVARIANT, Operator
from .project import check_objective


@dataclass(frozen=True)
class SteerParams:
    layer: int
    direction: str = "head"
    alphas: tuple = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)
    side: str = "both"
    quantity: str = "margin"
    positions: str = "readout"
    batch_size: int = 16


@OPERATORS.register
class Steer(Operator):
    """Add α·ρ·û to resid_post at the readout token; the margin per α (pair × alpha) or its slope."""

    name = "steer"
    dims = "[direction (d_model)] → pair × alpha (margin) | pair × side × alpha (reward) | pair (slope) [× objective]"
    per_pair = True
    needs_all_pairs = True         # ρ and the mean-difference direction are over every pair: one chunk
    Params = SteerParams
    n_inputs = 0
    reruns = True

    def sites(self, info):
        return {"resid_post"}

    def prefix_rows(self, info, n_pairs):
        if self.p.positions == "response":          # full forwards: no cached prefix needed
            return set()
        n = n_pairs if info.pairs is None else min(info.pairs, n_pairs)
        sides = {"both": (0, 1), "chosen": (0,), "rejected": (1,)}.get(self.p.side, ())
        return {(p, s) for p in range(n) for s in sides}

    def out_dims(self, in_dims, info, where):
        if not (isinstance(self.p.layer, int) and 0 <= self.p.layer < info.n_layers):
            raise SpecError(where + ".layer", f"layer {self.p.layer!r} out of range; valid 0..{info.n_layers - 1}.",
                            fix=f"set layer: <0..{info.n_layers - 1}> in the step.")
        choice(self.p.side, ("both", "chosen", "rejected"), where + ".side")
        choice(self.p.positions, ("readout", "response"), where + ".positions")
        if not (isinstance(self.p.batch_size, int) and self.p.batch_size >= 1):
            raise SpecError(where + ".batch_size", f"must be an integer >= 1, got {self.p.batch_size!r}.",
                            fix="e.g. batch_size: 8 in the step.")
        choice(self.p.quantity, ("margin", "reward", "slope"), where + ".quantity")
        if not self.p.alphas or not all(isinstance(a, (int, float)) for a in self.p.alphas):
            raise SpecError(where + ".alphas", f"alphas must be a non-empty list of numbers, got {self.p.alphas!r}.",
                            fix="e.g. alphas: [-2, 0, 2] in the step.")
        if self.p.quantity == "slope" and len(set(self.p.alphas)) < 2:
            raise SpecError(where + ".alphas", "a slope needs at least two distinct alphas.",
                            fix="e.g. alphas: [-2, 0, 2], or quantity: margin.")
        if in_dims:
            if set(in_dims[0]) != {"d_model"}:
                raise SpecError(where + ".input", f"the direction input must have dims (d_model,), got {in_dims[0]}.",
                                fix="reduce/select it to one vector (e.g. mean_direction, then select).")
        else:
            d = self.p.direction
            check_objective(d, info, where)
            if not (d in ("head", "mean_difference") or d.startswith(("objective:", "store:"))):
                raise SpecError(where + ".direction", f"unknown direction '{d}'.", value=d, options=[
                    "head", "objective:<name>", "store:<url>#<run>/<observable>/<variable>", "mean_difference"])
            if d == "head" and info.n_objectives > 1 and not info.gated:
                raise SpecError(where + ".direction", "direction 'head' is ambiguous for a multi-objective head.",
                                fix="use objective:<name>.")
        return {"margin": ("pair", "alpha"), "reward": ("pair", "side", "alpha"),
                "slope": ("pair",)}[self.p.quantity] + objective_dims(info)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def _direction(self, ctx, given):
        x = ctx.capture.sites["resid_post"][:, :, self.p.layer].astype(np.float64)      # pair × side × d
        d = self.p.direction
        if given is not None:
            u = np.asarray(given.values, np.float64)
        elif d == "mean_difference":
            u = (x[:, 0] - x[:, 1]).mean(0)
        else:
            u = reward_direction(ctx, d)
        norm = np.linalg.norm(u)
        if not np.isfinite(norm) or norm == 0:
            raise SpecError("observable.steps.direction", f"the steering direction '{d}' is zero or not finite.",
                            fix="steer along a non-zero direction (direction: head, or another stored vector).")
        return u / norm, float(np.sqrt((x ** 2).sum(-1).mean()))

    def run(self, ctx, *inputs):
        from ..engine.interventions import set_readout
        pidx, alphas = first_pairs(ctx), [float(a) for a in self.p.alphas]
        u, rho = self._direction(ctx, inputs[0] if inputs else None)
        key = (self.name, self.p.layer, self.p.direction, tuple(u.round(12)), tuple(alphas), self.p.side, len(pidx),
               self.p.positions)
        cap = ctx.capture
        base = ctx.lm.head.rewards(cap.h[pidx], None if cap.gate is None else cap.gate[pidx]).astype(np.float64)
        sides = {"both": (0, 1), "chosen": (0,), "rejected": (1,)}[self.p.side]
        if key not in ctx.memo:
            r = np.repeat(base[:, :, None], len(alphas), 2)                            # pair × side × alpha × out
            if self.p.positions == "response":
                r = self._response(ctx, r, base, pidx, sides, alphas, u, rho)
            else:
                x = cap.sites["resid_post"][:, :, self.p.layer].astype(np.float64)
                targets = [("resid_post", self.p.layer, 0)] * len(alphas)
                for side in sides:
                    got, counts = set_readout(ctx.lm, ctx.encoded, cap, targets,
                                              lambda t, pairs, side=side: x[pairs, side] + alphas[t] * rho * u,
                                              pidx, base_side=side)
                    ctx.add_counts(self.name, counts)
                    r[:, side] = got
            ctx.memo[key] = r
        r = ctx.memo[key]
        coords = {"alpha": alphas}
        if self.p.quantity == "reward":
            out = result(ctx, r, pidx, ("side", "alpha"), {**coords, "side": ["chosen", "rejected"]}, "reward",
                         "steered reward")
        else:
            margin = r[:, 0] - r[:, 1]                                                 # pair × alpha × out
            if self.p.quantity == "margin":
                out = result(ctx, margin, pidx, ("alpha",), coords, "reward", "steered margin")
            else:
                a = np.asarray(alphas) - np.mean(alphas)
                slope = np.einsum("a,pak->pk", a, margin - margin.mean(1, keepdims=True)) / (a @ a)
                out = result(ctx, slope, pidx, (), {}, "reward per residual RMS",
                             "least-squares slope of the steered margin over alpha")
        out.attrs.update(residual_rms=rho, layer=self.p.layer, direction=self.p.direction if not inputs else
                         "input", side=self.p.side, positions=self.p.positions)
        return out

    def _response(self, ctx, r, base, pidx, sides, alphas, u, rho):
        """Steer every response token: full forwards, with an α = 0 control checked against the capture."""
        from ..engine.patching import check_unpatched
        from ..engine.per_token import response_starts
        from ..engine.steering import steer_response
        starts = response_starts(ctx.lm.tokenizer, ctx.pairs, ctx.encoded)
        rows = [(p, s) for p in pidx for s in sides]
        shifts = np.array([0.0] + alphas)[:, None] * rho * u[None, :]                  # control first
        got, counts = steer_response(ctx.lm, ctx.encoded, starts, self.p.layer, shifts, rows, gate=ctx.capture.gate,
                             batch_size=self.p.batch_size,
                             padding_side=getattr(ctx.lm.tokenizer, "padding_side", "left"))
        where = {p: i for i, p in enumerate(pidx)}
        for k, (p, s) in enumerate(rows):
            check_unpatched(ctx.lm, got[k, 0], base[where[p], s], ctx.encoded.pair_ids[p])
            r[where[p], s] = got[k, 1:]
        ctx.add_counts(self.name, counts)
        return r
