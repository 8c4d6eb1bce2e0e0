"""objective_geometry: K × K cosines between the reward head's rows (one per objective).

Reads the head ``W`` (objective × d_model) directly; no input step. ``frame``:

  native    cos(w_i, w_j) in the model's own basis. Gauge ``frame:native:<model>`` — it changes
            under a non-orthogonal re-parameterization of the residual stream.
  whitened  cosine after mapping each row into the whitened frame of this run's readout
            activations h (both sides of every pair; ``frames.fit_whitened`` with ``shrinkage``):
            w_iᵀ Σ̂ w_j / √(w_iᵀ Σ̂ w_i · w_jᵀ Σ̂ w_j), i.e. the correlation of the objectives'
            rewards over the captured activations (Σ̂ shrunk; see ``frames.covariance``).
            Gauge ``frame:whitened:<frame id>`` at run time (``…:<model>`` in the plan).

Output dims ``objective × objective_b``; units ``cosine``; a zero row gives NaN.
Errors: ``SpecError`` at plan time for an unknown frame or shrinkage (naming the step).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..spec_checks import check_shrinkage
from ..registries import OPERATORS
from .base import Operator, labelled
from ..frames.fit import fit_whitened

FRAMES = ("native", "whitened")


@dataclass(frozen=True)
class ObjectiveGeometryParams:
    frame: str = "native"
    shrinkage: str = "auto"                 # plain covariance when invertible (exact invariance), else Ledoit–Wolf


def cosine_matrix(U: np.ndarray) -> np.ndarray:
    """Row-wise cosines of ``U`` (K × d) → K × K (NaN for zero rows)."""
    norms = np.linalg.norm(U, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        Un = U / norms[:, None]
    C = np.clip(Un @ Un.T, -1.0, 1.0)
    C[norms == 0] = np.nan
    C[:, norms == 0] = np.nan
    return C


def readout_frame(ctx, shrinkage):
    """Whitened frame of this run's readout activations h (memoised on the run context)."""
    key = ("frame:whitened:readout", str(shrinkage))
    if key not in ctx.memo:
        h = np.asarray(ctx.capture.h, np.float64).reshape(-1, ctx.capture.h.shape[-1])
        ctx.memo[key] = fit_whitened(h, ctx.info.model_name, shrinkage=shrinkage,
                                     provenance={"reference": "readout h, both sides of the run's pairs"})
    return ctx.memo[key]


@OPERATORS.register
class ObjectiveGeometry(Operator):
    """Cosines between the head's objective rows (objective × objective_b), native or whitened."""

    name = "objective_geometry"
    reads_capture = True           # the whitened frame is fitted on every pair's readout h
    dims = "() → objective × objective_b"
    Params = ObjectiveGeometryParams
    n_inputs = 0

    def out_dims(self, in_dims, info, where):
        if self.p.frame not in FRAMES:
            raise SpecError(where + ".frame", f"unknown frame '{self.p.frame}'.", value=self.p.frame, options=FRAMES,
                            fix="cross-model geometry needs a shared frame: see reward_lens_spec.frames.")
        check_shrinkage(self.p.shrinkage, where + ".shrinkage")
        return ("objective", "objective_b")

    def gauge(self, in_gauges, info):
        return info.native_frame if self.p.frame == "native" else f"frame:whitened:{info.model_name}"

    def run(self, ctx):
        head = ctx.lm.head
        W = np.asarray(head.W, np.float64)
        attrs = {}
        if self.p.frame == "native":
            U, gauge = W, ctx.info.native_frame
        else:
            frame = readout_frame(ctx, self.p.shrinkage)
            U, gauge = frame.direction_to_frame(W, ctx.info.model_name), frame.gauge
            attrs = {"frame_id": frame.id, "shrinkage_intensity": float(frame.provenance["models_fit"]
                                                                        [ctx.info.model_name]["shrinkage_intensity"])}
        names = list(head.objectives)
        arr = xr.DataArray(cosine_matrix(U), dims=("objective", "objective_b"),
                           coords={"objective": names, "objective_b": names})
        out = labelled(arr, "cosine", gauge, f"cosines of head rows ({self.p.frame} frame)")
        out.attrs.update(attrs)
        return out
