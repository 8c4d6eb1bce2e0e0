"""project: contract ``d_model`` with a direction — the reward readout ``w_r · x``.

Directions:
  head              the model's own readout: every head row (an ``objective`` dim when K > 1);
                    for a gated head, its gated score ``g(h_s)ᵀW`` with the gate frozen at each
                    side's readout h (the input must keep ``side``), so components still sum exactly
  objectives        every head row, always with an ``objective`` dim (a gated head's rows, ungated)
  objective:<name>  one head row ``w_r = W[k]``
  store:<url>#<run_id>/<observable>/<variable>   a d_model direction saved in a result store: in this
                    model's native frame, or in a whitened/shared frame fitted for it (mapped back
                    to native, ``frames.express.native_direction``); another model's basis is a
                    ``GaugeError``
``bias: true`` adds ``b`` (use it for rewards; margins need none, the bias cancels).
Units: reward units. Gauge: a projection of an activation on a direction of the
same model is a scalar readout, invariant under a change of basis.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..arrays import data_array, new_array
from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_dim, without


def check_objective(d: str, info, where: str) -> None:
    """Plan-time: ``objective:<name>`` must name one of the head's objectives."""
    if d.startswith("objective:") and d.split(":", 1)[1] not in info.objectives:
        raise SpecError(where + ".direction", f"no objective '{d.split(':', 1)[1]}'.",
                        value=d.split(":", 1)[1], options=info.objectives)


def head_rows(head, d: str):
    """``(W, b, names)`` (float64) for ``head``/``objectives`` (every row) or ``objective:<name>`` (one)."""
    if d.startswith("objective:"):
        k = head.objectives.index(d.split(":", 1)[1])
        return head.W[k:k + 1].astype(np.float64), head.b[k:k + 1].astype(np.float64), [head.objectives[k]]
    return head.W.astype(np.float64), head.b.astype(np.float64), list(head.objectives)


@dataclass(frozen=True)
class ProjectParams:
    direction: str = "head"
    bias: bool = False


@OPERATORS.register
class Project(Operator):
    """Project on the reward direction (head rows, one objective, or a stored vector)."""

    name = "project"
    per_pair = True
    dims = "x (…, d_model) → x without d_model [+ objective]"
    Params = ProjectParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "d_model", where, "a vector dim to project")
        d = self.p.direction
        check_objective(d, info, where)
        if not (d in ("head", "objectives") or d.startswith(("objective:", "store:"))):
            raise SpecError(where + ".direction", f"unknown direction '{d}'.", value=d,
                            options=["head", "objectives", "objective:<name>", "store:<url>#<run>/<observable>/<variable>"])
        if d == "head" and info.gated:
            need_dim(in_dims[0], "side", where, "a gated head's gate is frozen per side; project before diff")
        out = without(in_dims[0], "d_model")
        many = (d == "head" and info.n_outputs > 1) or d == "objectives"
        return out + ("objective",) if many else out

    def gauge(self, in_gauges, info):
        return INVARIANT

    def _direction(self, ctx):
        head, d = ctx.lm.head, self.p.direction
        if not d.startswith("store:"):
            return head_rows(head, d)
        from ..frames.express import native_direction
        where = "observable.steps.direction"
        stored = ctx.stored(d, lazy=False, where=where)
        url, var = d.removeprefix("store:").partition("#")[0], d.rpartition("/")[2]
        stored = native_direction(stored, ctx.stores.handle(url), ctx.info.model_name, where)
        vec = np.asarray(stored.values, np.float64).reshape(1, -1)
        if vec.shape[1] != head.W.shape[1]:
            raise SpecError("observable.steps.direction", f"stored vector has {vec.shape[1]} entries, model d_model "
                            f"is {head.W.shape[1]}.",
                            fix=f"store the direction from a model with d_model {head.W.shape[1]}, "
                                "or use direction: head.")
        return vec, np.zeros(1), [var]

    def run(self, ctx, x):
        if self.p.direction == "head" and ctx.lm.head.gated:
            return self._run_gated(ctx, x)
        W, b, names = self._direction(ctx)
        data = np.einsum("...d,kd->...k", np.asarray(x.values, np.float64), W)
        if self.p.bias:
            data = data + b
        dims = tuple(d for d in x.dims if d != "d_model")
        coords = {k: v for k, v in x.coords.variables.items() if "d_model" not in v.dims}
        if len(names) > 1 or self.p.direction == "objectives":
            arr = new_array(data, dims + ("objective",), {**coords, "objective": names})
        else:
            arr = data_array(xr.Variable(dims, data[..., 0]), coords, None)
        return labelled(arr, "reward", INVARIANT)

    def _run_gated(self, ctx, x):
        head = ctx.lm.head
        w = head.directions(ctx.capture.h, ctx.capture.gate)[..., 0, :].astype(np.float64)   # pair × side × d_model
        xt = x.transpose("pair", "side", ..., "d_model")
        data = np.einsum("ps...d,psd->ps...", np.asarray(xt.values, np.float64), w)
        if self.p.bias:
            data = data + float(head.b[0])
        dims = tuple(d for d in xt.dims if d != "d_model")
        coords = {k: v for k, v in xt.coords.items() if "d_model" not in v.dims}
        return labelled(xr.DataArray(data, dims=dims, coords=coords), "reward", INVARIANT)
