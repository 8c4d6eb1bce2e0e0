"""p_value: Monte-Carlo p-value of an observed effect against null draws, optionally BH-adjusted.

Inputs: the observed effect (any dims) and ``against`` (a step with dims ``draw`` × the same dims,
e.g. ``null``). With B draws, ``greater``: p = (1 + #{null ≥ obs}) / (1 + B); ``less``: the mirror;
``two-sided``: min(1, 2·min(p_greater, p_less)) — never 0 (Phipson & Smyth 2010, "Permutation
p-values should never be zero"). ``correction: bh`` adjusts the p-values of every cell of the grid
together for the false discovery rate (Benjamini & Hochberg 1995, step-up: p_(i)·m/i, monotone from
the top, capped at 1; NaN cells are left out). Units: probability. Gauge: invariant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from ._grid import choice
from .base import INVARIANT, Operator, labelled, need_dim


@dataclass(frozen=True)
class PValueParams:
    against: str
    alternative: str = "two-sided"
    correction: str = "none"


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """BH-adjusted p-values (same shape; NaN stays NaN)."""
    flat = np.asarray(p, np.float64).ravel()
    ok = np.flatnonzero(np.isfinite(flat))
    out = np.full(flat.shape, np.nan)
    if ok.size:
        order = ok[np.argsort(flat[ok], kind="stable")]
        m = ok.size
        adj = flat[order] * m / np.arange(1, m + 1)
        out[order] = np.minimum(1.0, np.minimum.accumulate(adj[::-1])[::-1])
    return out.reshape(np.shape(p))


@OPERATORS.register
class PValue(Operator):
    """Monte-Carlo p-value of an effect against a step's null draws (two-sided/greater/less; BH option)."""

    name = "p_value"
    dims = "x (…), against (draw × …) → same dims as x"
    Params = PValueParams
    extra_inputs = ("against",)
    n_inputs = 2

    def out_dims(self, in_dims, info, where):
        obs, null = in_dims[0], in_dims[1]
        need_dim(null, "draw", where + ".against", "null draws")
        if set(null) - {"draw"} != set(obs):
            raise SpecError(where, f"the effect's dims {obs} do not match the null's {null} (minus draw).",
                            fix="reduce the effect (e.g. mean over pair) to the null's dims.")
        choice(self.p.alternative, ("two-sided", "greater", "less"), where + ".alternative")
        choice(self.p.correction, ("none", "bh"), where + ".correction")
        return obs

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, obs, null):
        null = null.transpose("draw", *obs.dims)
        o, d = np.asarray(obs.values, np.float64), np.asarray(null.values, np.float64)
        B = d.shape[0]
        pg = (1 + (d >= o).sum(0)) / (1 + B)
        pl = (1 + (d <= o).sum(0)) / (1 + B)
        p = {"greater": pg, "less": pl, "two-sided": np.minimum(1.0, 2 * np.minimum(pg, pl))}[self.p.alternative]
        p = np.where(np.isfinite(o), p, np.nan)
        if self.p.correction == "bh":
            p = benjamini_hochberg(p)
        out = obs.copy(data=p)
        out = labelled(out, "probability", INVARIANT, f"{self.p.alternative} Monte-Carlo p-value against "
                       f"'{self.p.against}'" + (" (Benjamini–Hochberg adjusted)" if self.p.correction == "bh" else ""))
        out.attrs["draws"] = B
        return out
