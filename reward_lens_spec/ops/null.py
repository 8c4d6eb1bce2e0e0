"""null: draws of a readout effect under a null hypothesis, for ``p_value`` to compare against.

Input ``x``: an activation with ``pair``, ``side`` and ``d_model`` dims (any others, e.g. ``layer``,
kept). The effect is read along ``direction`` (``head`` | ``objective:<name>`` | ``store:…``, as
``project`` reads it; a gated head's ``head`` is g(h)ᵀW averaged over pairs and sides) with ``statistic``:
  mean      mean over pairs of w·(x_chosen − x_rejected)              (reward units)
  accuracy  fraction of pairs with w·x_chosen > w·x_rejected (ties ½)  (fraction)
— the same numbers ``project`` → ``diff`` → ``reduce`` (mean) give. ``kind``:
  random_direction  w replaced by a random direction of the same norm drawn from N(0, Σ̂), Σ̂ the
                    Ledoit–Wolf within-side covariance of the input (each side centred on its own
                    mean, so the chosen − rejected shift under test is not in it; per cell of the
                    other dims; ``frames.covariance``): is w special among the directions the
                    activations vary along?
  shuffled_sides    each pair's sides swapped with probability ½ (a sign-flip randomization test:
                    do the labels carry the effect?)
  shuffled_pairs    chosen of pair i against rejected of pair π(i), π a random permutation (the
                    mean is invariant under π, so this null is for ``statistic: accuracy``)
Output: dims ``draw`` × the input's other dims (``draws`` draws, PCG64 ``seed``). Units: the
statistic's. Gauge: invariant. Sources: randomization tests (Fisher 1935; Good 2005,
"Permutation, Parametric and Bootstrap Tests of Hypotheses"); random-direction baselines for
probes and steering (e.g. Arditi et al. 2024).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice, reward_direction
from .base import INVARIANT, Operator, labelled, need_dim, without
from .project import check_objective
from ..frames.covariance import shrunk_spectrum

KINDS = ("random_direction", "shuffled_sides", "shuffled_pairs")


@dataclass(frozen=True)
class NullParams:
    kind: str = "random_direction"
    direction: str = "head"
    statistic: str = "mean"
    draws: int = 1000
    seed: int = 0


def statistic(proj: np.ndarray, how: str) -> np.ndarray:
    """``proj``: (..., pair, side) readouts → the statistic over pairs (...)."""
    d = proj[..., 0] - proj[..., 1]
    return d.mean(-1) if how == "mean" else ((d > 0).mean(-1) + 0.5 * (d == 0).mean(-1))


@OPERATORS.register
class Null(Operator):
    """Null draws of a readout effect: random directions, shuffled sides or shuffled pairs (draw × …)."""

    name = "null"
    dims = "x (pair × side × … × d_model) → draw × …"
    Params = NullParams

    def out_dims(self, in_dims, info, where):
        for d in ("pair", "side", "d_model"):
            need_dim(in_dims[0], d, where, "per-pair, per-side activations to read the effect from")
        choice(self.p.kind, KINDS, where + ".kind")
        choice(self.p.statistic, ("mean", "accuracy"), where + ".statistic")
        check_objective(self.p.direction, info, where)
        if self.p.direction not in ("head",) and not self.p.direction.startswith(("objective:", "store:")):
            raise SpecError(where + ".direction", f"unknown direction '{self.p.direction}'.",
                            options=["head", "objective:<name>", "store:<url>#<run>/<observable>/<variable>"])
        if self.p.direction == "head" and info.n_objectives > 1 and not info.gated:
            raise SpecError(where + ".direction", "direction 'head' is ambiguous for a multi-objective head.",
                            fix="use objective:<name>.")
        if self.p.kind == "shuffled_pairs" and self.p.statistic == "mean":
            raise SpecError(where + ".statistic", "the mean over pairs does not change when pairs are shuffled.",
                            fix="use statistic: accuracy, or kind: shuffled_sides | random_direction.")
        if not (isinstance(self.p.draws, int) and self.p.draws >= 1):
            raise SpecError(where + ".draws", f"draws must be a positive integer, got {self.p.draws!r}.",
                            fix="e.g. draws: 1000 in the step.")
        return ("draw",) + without(in_dims[0], "pair", "side", "d_model")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x):
        w = reward_direction(ctx, self.p.direction)
        xt = x.transpose(..., "pair", "side", "d_model")
        X = np.asarray(xt.values, np.float64)                           # (*other, pair, side, d)
        other = X.shape[:-3]
        flat = X.reshape((-1,) + X.shape[-3:])
        rng = np.random.Generator(np.random.PCG64(self.p.seed))
        B, n = self.p.draws, X.shape[-3]
        out = np.zeros((B, flat.shape[0]))
        if self.p.kind == "random_direction":
            g = rng.standard_normal((B, X.shape[-1]))
            for c, cell in enumerate(flat):
                within = (cell - cell.mean(0, keepdims=True)).reshape(-1, cell.shape[-1])   # each side centred
                sp = shrunk_spectrum(within, "ledoit_wolf", "observable.steps.null")
                # Σ̂^½ g = √iso·g + basis·diag(√λ − √iso)·basisᵀ g
                u = np.sqrt(sp.iso) * g + ((g @ sp.basis) * (np.sqrt(sp.eigval) - np.sqrt(sp.iso))) @ sp.basis.T
                u *= np.linalg.norm(w) / np.linalg.norm(u, axis=1, keepdims=True)
                out[:, c] = statistic(np.einsum("psd,bd->bps", cell, u), self.p.statistic)
        else:
            proj = flat @ w                                            # (cell, pair, side)
            for b in range(B):
                if self.p.kind == "shuffled_sides":
                    flip = rng.random(n) < 0.5
                    pb = np.where(flip[None, :, None], proj[..., ::-1], proj)
                else:
                    perm = rng.permutation(n)
                    pb = np.stack([proj[..., 0], proj[:, perm, 1]], -1)
                out[b] = statistic(pb, self.p.statistic)
        coords = {k: v for k, v in xt.coords.items() if not set(v.dims) & {"pair", "side", "d_model"}}
        arr = xr.DataArray(out.reshape((B,) + other), dims=("draw",) + xt.dims[:-3],
                           coords={**coords, "draw": np.arange(B)})
        res = labelled(arr, "reward" if self.p.statistic == "mean" else "fraction", INVARIANT,
                       f"null draws ({self.p.kind}) of the {self.p.statistic} readout along {self.p.direction}")
        res.attrs.update(kind=self.p.kind, statistic=self.p.statistic, seed=self.p.seed)
        return res
