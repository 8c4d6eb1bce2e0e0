"""direction: the reward direction ``w_r`` itself — the head's row(s), a covector on ``h``.

``direction``: ``head`` (every row; an ``objective`` dim when K > 1), ``objectives`` (always an
``objective`` dim) or ``objective:<name>`` (one row). A gated head has no single direction (its
gate depends on h): ask for its ``objectives`` rows. Output ``[objective ×] d_model``, units
``direction`` (reward per unit of h), gauge ``frame:native:<model>``: a direction is a
coordinate object, so a run with ``frame=whitened|shared`` stores it mapped into that frame
(``w Σ̂^{1/2} R``, see ``frames.express``) and only there can two models' directions be compared
(``reward-lens-spec compare``). Errors: ``SpecError`` at plan time for an unknown objective or
``head`` on a gated model.
"""
from __future__ import annotations

from dataclasses import dataclass

import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import Operator, labelled
from .project import check_objective, head_rows


@dataclass(frozen=True)
class DirectionParams:
    direction: str = "head"


@OPERATORS.register
class Direction(Operator):
    """The reward direction w_r (head rows) as a d_model vector, in the model's native frame."""

    name = "direction"
    dims = "() → d_model, or objective × d_model"
    Params = DirectionParams
    n_inputs = 0

    def _many(self, info) -> bool:
        return self.p.direction == "objectives" or (self.p.direction == "head" and info.n_objectives > 1)

    def out_dims(self, in_dims, info, where):
        d = self.p.direction
        if d == "head" and info.gated:
            raise SpecError(where + ".direction", "a gated head's direction depends on h (its gate); there is no "
                            "single w_r.", fix="use direction: objectives (the ungated rows).")
        check_objective(d, info, where)
        if not (d in ("head", "objectives") or d.startswith("objective:")):
            raise SpecError(where + ".direction", f"unknown direction '{d}'.", value=d,
                            options=["head", "objectives", "objective:<name>"])
        return ("objective", "d_model") if self._many(info) else ("d_model",)

    def gauge(self, in_gauges, info):
        return info.native_frame

    def run(self, ctx):
        W, _, names = head_rows(ctx.lm.head, self.p.direction)
        if self._many(ctx.info):
            arr = xr.DataArray(W, dims=("objective", "d_model"), coords={"objective": names})
        else:
            arr = xr.DataArray(W[0], dims=("d_model",))
        return labelled(arr, "direction", ctx.info.native_frame, "reward direction w_r (head rows)")
