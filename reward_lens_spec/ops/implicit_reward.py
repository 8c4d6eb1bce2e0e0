"""implicit_reward and implicit_lens: read a DPO-implicit reward (``model.kind=implicit``, ``kinds.implicit``).

implicit_reward, ``quantity``:
  reward          pair × side: r = β · Σ_t [log π(y_t | x, y_<t) − log π_ref(y_t | x, y_<t)] over response
                  tokens (the mean instead of the sum with ``model.implicit.length_normalize``); reward units
  per_token       pair × side × position: each response token's term of that sum (position 0 = the first
                  response token; NaN past a side's response; width ``model.max_length`` so every chunk of a
                  run has one shape); Σ over position = reward (exact up to float64 rounding)
  policy_logp     pair × side × position: log π(y_t | x, y_<t), nats
  reference_logp  pair × side × position: log π_ref(y_t | x, y_<t), nats (refused when reference-free)
implicit_lens: pair × side × layer (layer −1 = embedding output, then each layer's output): the reward with
  the policy's log-probabilities read through its final norm and unembedding at that layer (logit lens,
  nostalgebraist 2020) and the reference term kept whole. Approximate (``method`` attr): the readout is a
  log-softmax, nonlinear in the residual, so a layer's value is not a share of the reward; the last layer
  equals ``reward`` exactly.
Gauge: invariant. Both read the run's capture pass (``ImplicitModel.capture_pass``), no re-run. Source: DPO's
implicit reward (Rafailov et al. 2023, eq. 5); reference-free and length-normalized forms as RewardBench
(Lambert et al. 2024) and SimPO (Meng et al. 2024) score them.
Errors: ``SpecError`` for an unknown quantity, for ``reference_logp`` without a reference, and when the run's
model is not ``model.kind=implicit``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled

_QUANTITIES = ("reward", "per_token", "policy_logp", "reference_logp")
LENS_SITE = "implicit_lens"              # kinds.implicit.model.LENS_SITE (not imported: ops load without torch)


def implicit_model(ctx, where: str):
    """The run's ``ImplicitModel``; ``SpecError`` naming ``model.kind`` otherwise."""
    if getattr(ctx.lm, "kind", None) != "implicit":
        raise SpecError("model.kind", f"{where} reads a DPO-implicit reward, but the model is "
                        f"'{getattr(ctx.lm, 'kind', 'classifier')}'.", fix="set model.kind=implicit (e.g. model=tiny_implicit).")
    return ctx.lm


def _padded(a: np.ndarray, width: int) -> np.ndarray:
    out = np.full(a.shape[:-1] + (max(width, a.shape[-1]),), np.nan)
    out[..., :a.shape[-1]] = a
    return out


@dataclass(frozen=True)
class ImplicitRewardParams:
    quantity: str = "reward"


@OPERATORS.register
class ImplicitReward(Operator):
    """DPO-implicit reward per side, per response token, or the log-probabilities behind it."""

    name = "implicit_reward"
    kinds = ("implicit",)
    dims = "() → pair × side (reward) | pair × side × position (per_token, policy_logp, reference_logp)"
    per_pair = True
    Params = ImplicitRewardParams
    n_inputs = 0

    def out_dims(self, in_dims, info, where):
        if self.p.quantity not in _QUANTITIES:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.", value=self.p.quantity,
                            options=_QUANTITIES)
        return ("pair", "side") if self.p.quantity == "reward" else ("pair", "side", "position")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        lm = implicit_model(ctx, f"implicit_reward (quantity={self.p.quantity})")
        cap, q = ctx.capture, self.p.quantity
        coords = {**ctx.pair_coords(), "side": ["chosen", "rejected"]}
        n_tok = np.sum(np.isfinite(cap.sites["policy_logp"]), -1)
        coords["response_tokens"] = (("pair", "side"), n_tok)
        if q == "reward":
            arr = xr.DataArray(np.asarray(cap.logits, np.float64)[..., 0], dims=("pair", "side"), coords=coords)
            return labelled(arr, "reward", INVARIANT, "DPO-implicit reward β·Σ_t log π/π_ref over response tokens"
                            + (" (mean: length-normalized)" if lm.length_normalize else ""))
        key = {"per_token": "per_token", "policy_logp": "policy_logp", "reference_logp": "reference_logp"}[q]
        if key not in cap.sites:
            raise SpecError("model.implicit.reference", f"implicit_reward quantity={q} needs a reference model, and "
                            "this run is reference-free.", fix="set model.implicit.reference, or drop that step.")
        data = _padded(cap.sites[key], int(ctx.encoded.max_length))
        coords["position"] = np.arange(data.shape[-1])
        arr = xr.DataArray(data, dims=("pair", "side", "position"), coords=coords)
        if q == "per_token":
            return labelled(arr, "reward", INVARIANT, "implicit reward per response token (sums to the reward)")
        return labelled(arr, "nats", INVARIANT, f"log-probability of each response token under the {q[:-5]}")


@dataclass(frozen=True)
class ImplicitLensParams:
    pass


@OPERATORS.register
class ImplicitLens(Operator):
    """Implicit reward with the policy read at every layer through its unembedding (approximate)."""

    name = "implicit_lens"
    kinds = ("implicit",)
    dims = "() → pair × side × layer"
    per_pair = True
    Params = ImplicitLensParams
    n_inputs = 0

    def sites(self, info):
        return {LENS_SITE}

    def out_dims(self, in_dims, info, where):
        return ("pair", "side", "layer")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        implicit_model(ctx, "implicit_lens")
        per = ctx.capture.sites[LENS_SITE]                       # pair × side × layer × position
        data = np.where(np.isfinite(per), per, 0.0).sum(-1)
        coords = {**ctx.pair_coords(), "side": ["chosen", "rejected"], "layer": np.arange(-1, per.shape[2] - 1)}
        out = labelled(xr.DataArray(data, dims=("pair", "side", "layer"), coords=coords), "reward", INVARIANT,
                       "implicit reward with the policy read through its final norm and unembedding at each layer")
        out.attrs["method"] = "approximate: logit lens of a nonlinear (log-softmax) readout; last layer exact"
        return out
