"""contested_margin: the model's |margin| on pairs annotators contested vs pairs they agreed on.

A pair's annotator agreement ``a`` (share preferring the chosen side; ``ops/pair_labels``:
``dataset.fields.agreement`` or ``votes``) makes it *unanimous* when max(a, 1 − a) ≥ ``unanimous``
(default 1: every annotator on one side) and *contested* otherwise; pairs without a record are
left out. Output ``contested_statistic × bound`` (estimate, ci_low, ci_high; 95% cluster bootstrap
over prompt clusters, ``stats``):

  abs_margin_contested, abs_margin_unanimous   mean |Δ| in each class (reward units)
  abs_margin_gap                               contested minus unanimous (< 0: the model is less
                                               sure where people disagree); its CI resamples
                                               clusters of both classes together
  n_contested, n_unanimous, n_effective        counts (bounds repeat the count)

|Δ| is gauge invariant. Reduces over pairs. Errors: ``SpecError`` at plan time for an input that
is not a per-pair margin or ``unanimous`` outside (0.5, 1]; at run time (``dataset.fields.agreement``)
when no pair records agreement or one class is empty.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_dim
from .pair_labels import pair_agreement
from ..data.checksum import prompt_cluster_key
from ..stats import bootstrap_ci, mean_with_ci, n_eff

STATS = ["abs_margin_contested", "abs_margin_unanimous", "abs_margin_gap", "n_contested", "n_unanimous",
         "n_effective"]
BOUND = ["estimate", "ci_low", "ci_high"]


@dataclass(frozen=True)
class ContestedMarginParams:
    unanimous: float = 1.0
    n_boot: int = 1000
    seed: int = 0


def contested_mask(agreement: np.ndarray, unanimous: float) -> np.ndarray:
    """True where a recorded agreement is contested (max(a, 1 − a) < unanimous); NaN rows False."""
    a = np.asarray(agreement, np.float64)
    return np.isfinite(a) & (np.maximum(a, 1.0 - a) < unanimous - 1e-12)


def check_unanimous(value: float, where: str) -> None:
    if not 0.5 < float(value) <= 1.0:
        raise SpecError(where, f"must lie in (0.5, 1] (the majority share that counts as unanimous), got {value}.",
                        fix="unanimous: 1.0 (every annotator agrees) or e.g. 0.8.")


def record_classes(ctx, unanimous: float):
    """(recorded mask, contested mask, prompt-cluster keys) per encoded pair; raises when a class is empty."""
    agree = pair_agreement(ctx)
    rec = np.isfinite(agree)
    cont = contested_mask(agree, unanimous)
    if cont.sum() == 0 or (rec & ~cont).sum() == 0:
        raise SpecError("dataset.fields.agreement", f"{int(rec.sum())} of {len(agree)} pairs record annotator "
                        f"agreement: {int(cont.sum())} contested, {int((rec & ~cont).sum())} unanimous; "
                        "both classes are needed.",
                        fix="map dataset.fields.agreement (share preferring chosen) or dataset.fields.votes.")
    by_id = {p.id: p for p in ctx.pairs}
    groups = np.array([prompt_cluster_key(by_id[i].prompt) for i in ctx.encoded.pair_ids], dtype=object)
    return rec, cont, groups


@OPERATORS.register
class ContestedMargin(Operator):
    """Mean |margin| on contested vs unanimous pairs (annotator votes/agreement), gap with CI."""

    name = "contested_margin"
    pair_fields = ("agreement", "votes")
    dims = "margin (pair) → contested_statistic × bound"
    Params = ContestedMarginParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "pair", where, "a margin per pair")
        if tuple(in_dims[0]) != ("pair",):
            raise SpecError(where + ".input", f"needs a margin with dims (pair,), got {in_dims[0]}.",
                            fix="feed it the 'margin' step of the score observable (select one objective first).")
        check_unanimous(self.p.unanimous, where + ".unanimous")
        return ("contested_statistic", "bound")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, margin):
        rec, cont, g_all = record_classes(ctx, self.p.unanimous)
        m = np.abs(np.asarray(margin.sel(pair=list(ctx.encoded.pair_ids)).values, np.float64))[rec]
        c, g = cont[rec], g_all[rec]
        kw = dict(n_boot=self.p.n_boot, seed=self.p.seed)

        def gap(idx):
            mc, mu = m[idx][c[idx]], m[idx][~c[idx]]
            return float(mc.mean() - mu.mean()) if len(mc) and len(mu) else np.nan
        lo, hi = bootstrap_ci(gap, len(m), groups=g, **kw)
        trip = lambda d: [d["estimate"], d["ci_low"], d["ci_high"]]  # noqa: E731
        rows = {"abs_margin_contested": trip(mean_with_ci(m[c], groups=g[c], **kw)),
                "abs_margin_unanimous": trip(mean_with_ci(m[~c], groups=g[~c], **kw)),
                "abs_margin_gap": [gap(np.arange(len(m))), lo, hi],
                "n_contested": [float(c.sum())] * 3, "n_unanimous": [float((~c).sum())] * 3,
                "n_effective": [float(n_eff(g, len(g)))] * 3}
        arr = xr.DataArray(np.array([rows[s] for s in STATS], np.float64), dims=("contested_statistic", "bound"),
                           coords={"contested_statistic": STATS, "bound": BOUND})
        out = labelled(arr, "reward", INVARIANT, "mean |margin| on contested vs unanimous pairs (counts: pairs)")
        out.attrs.update(unanimous=float(self.p.unanimous), n_unrecorded=int((~rec).sum()))
        return out
