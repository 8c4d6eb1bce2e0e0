"""prefix: the reward read at every position of the response (per-token reward), its margin, a lens.

quantity=reward  ``prefix_reward``  pair × side × position [× objective]: the head on the final-norm
                 output at response position t (t = 0 at the first response token; the last valid
                 position is the readout token, so it equals ``reward``)
quantity=margin  ``prefix_margin``  pair × position: chosen minus rejected, aligned from the response
                 start (position t of both sides); NaN where t is beyond either side's response
quantity=lens    ``prefix_lens``    pair × side × layer × position: the head (no bias) on the final
                 norm of the residual (layer −1 = embedding output, then resid_post), so its last
                 layer equals ``prefix_reward`` minus ``b``
NaN marks positions beyond a side's response length; ``position`` spans the longest response of the whole
run (``width``: the run is sized before its first chunk, ``planning.data_widths``), so a chunk of shorter
responses is NaN-padded to it (attr ``padding``). Coords: ``response_tokens`` (pair × side;
``response_tokens_chosen`` / ``_rejected`` on the margin). One extra forward per distinct sequence
(``engine.per_token.prefix_pass``, ``batch_size`` rows, shared by every ``prefix`` step of the run,
the lens computed in the same pass). A
readout-gated head is read with its gate at each position, ArmoRM with its prompt gate. Units:
reward. Gauge: invariant. Source: per-token reward as in RewardBench's analyses (Lambert et al. 2024)
and the logit lens (nostalgebraist 2020) applied at every position.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled


@dataclass(frozen=True)
class PrefixParams:
    quantity: str = "reward"
    batch_size: int = 16


@OPERATORS.register
class Prefix(Operator):
    """Per-token reward over the response (reward, aligned margin, or lens over layers × positions)."""

    name = "prefix"
    dims = "() → pair × side × position (reward) | pair × position (margin) | pair × side × layer × position (lens) [× objective]"
    per_pair = True                # its own pass over each pair's sides
    Params = PrefixParams
    n_inputs = 0
    reruns = True
    data_dims = ("position",)

    def width(self, dim, ctx):
        """The longest response over every pair and side (tokens from the response start to the readout)."""
        from ..engine.per_token import response_starts
        return int((ctx.encoded.lengths() - response_starts(ctx.lm.tokenizer, ctx.pairs, ctx.encoded)).max())

    def out_dims(self, in_dims, info, where):
        q = self.p.quantity
        if q not in ("reward", "margin", "lens"):
            raise SpecError(where + ".quantity", f"unknown quantity '{q}'.", value=q, options=["reward", "margin", "lens"])
        if self.p.batch_size < 1:
            raise SpecError(where + ".batch_size", f"must be >= 1, got {self.p.batch_size}.",
                            fix="e.g. batch_size: 8 in the step.")
        obj = ("objective",) if info.n_outputs > 1 else ()
        return {"reward": ("pair", "side", "position"), "margin": ("pair", "position"),
                "lens": ("pair", "side", "layer", "position")}[q] + obj

    def gauge(self, in_gauges, info):
        return INVARIANT

    def _pass(self, ctx):
        from ..engine.per_token import prefix_pass, response_starts
        key = ("prefix", self.p.batch_size)
        if key not in ctx.memo:                    # one pass, the lens included, for every prefix step
            starts = response_starts(ctx.lm.tokenizer, ctx.pairs, ctx.encoded)
            reward, lens_arr = prefix_pass(ctx.lm, ctx.encoded, starts, lens=True, batch_size=self.p.batch_size,
                                           padding_side=getattr(ctx.lm.tokenizer, "padding_side", "left"),
                                           gate=ctx.capture.gate)
            ctx.memo[key] = (starts, reward, lens_arr)
        return ctx.memo[key]

    def run(self, ctx):
        starts, reward, lens_arr = self._pass(ctx)
        enc = ctx.encoded
        lengths = enc.lengths() - starts                       # response tokens per (pair, side)
        coords = {**ctx.pair_coords(), "position": np.arange(reward.shape[2])}
        K = reward.shape[-1]
        obj = {"objective": list(ctx.lm.head.objectives)} if K > 1 else {}
        q = self.p.quantity
        if q == "reward":
            data, dims = reward, ("pair", "side", "position")
        elif q == "margin":
            data, dims = reward[:, 0] - reward[:, 1], ("pair", "position")   # NaN beyond either side
        else:
            data, dims = lens_arr, ("pair", "side", "layer", "position")
            coords["layer"] = np.arange(-1, lens_arr.shape[2] - 1)
        if "side" in dims:
            coords["side"] = ["chosen", "rejected"]
            coords["response_tokens"] = (("pair", "side"), lengths)
        else:
            coords.update(response_tokens_chosen=("pair", lengths[:, 0]), response_tokens_rejected=("pair", lengths[:, 1]))
        if K > 1:
            arr = xr.DataArray(data, dims=dims + ("objective",), coords={**coords, **obj})
        else:
            arr = xr.DataArray(data[..., 0], dims=dims, coords=coords)
        desc = {"reward": "reward at every response position (t = 0: first response token)",
                "margin": "chosen − rejected per response position, aligned from the response start",
                "lens": "normed reward lens per layer and response position (no bias)"}[q]
        return labelled(arr, "reward", INVARIANT, desc)
