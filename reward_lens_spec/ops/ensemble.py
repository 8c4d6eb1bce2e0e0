"""ensemble_reward and member_agreement: read an ensemble of reward models (``model.kind=ensemble``).

ensemble_reward, ``quantity``:
  reward          pair × side: the members' rewards reduced (``model.ensemble.reduce``: mean | min | quantile q;
                  ``kinds.ensemble``), reward units; its ``diff`` is the ensemble margin
  member_reward   pair × side × member: each member's own reward (its head at its readout token)
  member_margin   pair × member: each member's margin r_c − r_r
  Coord ``member``: the members' names; attr ``member_fingerprints``: each member's model fingerprint.
member_agreement (reduces over pairs; input: member_margin, pair × member), ``quantity``:
  sign            member × other: the fraction of pairs on which two members' margins have the same sign
                  (a zero margin agrees only with a zero margin)
  spearman        member × other: Spearman rank correlation of two members' margins across pairs
                  (``scipy.stats.spearmanr``; NaN when either is constant)
  Pairs with a NaN margin are left out. Units: fraction / correlation. Gauge: invariant.
Source: reward-model ensembles as an overoptimization guard (Coste et al. 2023, "Reward Model Ensembles Help
Mitigate Overoptimization"; mean, worst-case and quantile aggregation); agreement by sign and rank.
Errors: ``SpecError`` for an unknown quantity, an input without ``pair`` and ``member`` dims, and when the run's
model is not ``model.kind=ensemble``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_dim
from scipy.stats import spearmanr

_QUANTITIES = ("reward", "member_reward", "member_margin")
_AGREEMENT = ("sign", "spearman")


@dataclass(frozen=True)
class EnsembleRewardParams:
    quantity: str = "reward"


@OPERATORS.register
class EnsembleReward(Operator):
    """An ensemble's reduced reward per side, or each member's reward or margin."""

    name = "ensemble_reward"
    kinds = ("ensemble",)
    dims = "() → pair × side (reward) | pair × side × member (member_reward) | pair × member (member_margin)"
    per_pair = True
    Params = EnsembleRewardParams
    n_inputs = 0

    def out_dims(self, in_dims, info, where):
        if self.p.quantity not in _QUANTITIES:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=_QUANTITIES)
        return {"reward": ("pair", "side"), "member_reward": ("pair", "side", "member"),
                "member_margin": ("pair", "member")}[self.p.quantity]

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        lm = ctx.lm
        if getattr(lm, "kind", None) != "ensemble":
            raise SpecError("model.kind", f"ensemble_reward reads an ensemble, but the model is "
                            f"'{getattr(lm, 'kind', 'classifier')}'.", fix="set model.kind=ensemble (e.g. model=tiny_ensemble).")
        coords = {**ctx.pair_coords()}
        side = ["chosen", "rejected"]
        q = self.p.quantity
        if q == "reward":
            arr = xr.DataArray(np.asarray(ctx.capture.logits, np.float64)[..., 0], dims=("pair", "side"),
                               coords={**coords, "side": side})
            return labelled(arr, "reward", INVARIANT, f"ensemble reward: {lm.reduce} over {len(lm.members)} members"
                            + (f" (q={lm.q})" if lm.reduce == "quantile" else ""))
        r = ctx.capture.sites["member_rewards"]                     # pair × side × member
        if q == "member_reward":
            arr = xr.DataArray(r, dims=("pair", "side", "member"), coords={**coords, "side": side,
                                                                          "member": list(lm.member_names)})
        else:
            arr = xr.DataArray(r[:, 0] - r[:, 1], dims=("pair", "member"),
                               coords={**coords, "member": list(lm.member_names)})
        out = labelled(arr, "reward", INVARIANT, f"each member's {q.split('_')[1]}")
        out.attrs["member_fingerprints"] = list(lm.member_fingerprints)
        return out


@dataclass(frozen=True)
class MemberAgreementParams:
    quantity: str = "sign"


@OPERATORS.register
class MemberAgreement(Operator):
    """Agreement between ensemble members' margins across pairs (sign agreement or Spearman correlation)."""

    name = "member_agreement"
    kinds = ("ensemble",)
    dims = "x (pair × member) → member × other"
    Params = MemberAgreementParams

    def out_dims(self, in_dims, info, where):
        if self.p.quantity not in _AGREEMENT:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=_AGREEMENT)
        need_dim(in_dims[0], "pair", where, "agreement across pairs")
        need_dim(in_dims[0], "member", where, "one margin per member")
        if set(in_dims[0]) != {"pair", "member"}:
            raise SpecError(where + ".input", f"needs member margins (pair × member), got {in_dims[0]}.",
                            fix="feed it {op: ensemble_reward, quantity: member_margin}.")
        return ("member", "other")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x):
        m = np.asarray(x.transpose("pair", "member").values, np.float64)
        m = m[np.isfinite(m).all(1)]
        names = [str(v) for v in x.coords["member"].values]
        k = len(names)
        out = np.full((k, k), np.nan)
        if self.p.quantity == "sign":
            s = np.sign(m)
            for i in range(k):
                for j in range(k):
                    out[i, j] = float(np.mean(s[:, i] == s[:, j])) if len(m) else np.nan
            units, desc = "fraction", "fraction of pairs whose margins have the same sign"
        else:
            for i in range(k):
                for j in range(k):
                    if len(m) > 1 and np.ptp(m[:, i]) > 0 and np.ptp(m[:, j]) > 0:
                        out[i, j] = float(spearmanr(m[:, i], m[:, j]).statistic)
            units, desc = "correlation", "Spearman rank correlation of margins across pairs"
        arr = xr.DataArray(out, dims=("member", "other"), coords={"member": names, "other": names})
        res = labelled(arr, units, INVARIANT, desc)
        res.attrs["n_pairs"] = int(len(m))
        return res
