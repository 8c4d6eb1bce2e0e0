"""effective_objectives: how many independent objectives a K-row reward head really has.

Reads the head W (objective × d_model; a gated head's regression rows) and, as
``objective_geometry`` does, maps each row into the whitened frame of this run's readout
activations (``readout_frame``; ``frames.fit_whitened`` with ``shrinkage``): Ũ = W Σ̂^{1/2}, so
the Gram matrix G = Ũ Ũᵀ is the covariance of the objectives' rewards over the captured h
(Σ̂ shrunk). With λ its eigenvalues, the participation ratio

    PR = (Σ λ)² / Σ λ²     (1 ≤ PR ≤ K; 1: one objective in K copies; K: K uncorrelated, equal ones)

is the effective number of objectives (the participation ratio of a spectrum; e.g. Gao et al.
2017, "A theory of multineuronal dimensionality"). ``frame: native`` uses W Wᵀ instead (basis
dependent). Output ``effective_statistic``: participation_ratio (objectives), top_share = λ₁/Σλ
(fraction), n_objectives. Gauge: ``frame:whitened:<frame id>`` (``…:<model>`` in the plan) or
the native frame. Errors: ``SpecError`` at plan time for a one-row head, an unknown frame or
shrinkage. No input step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..spec_checks import check_shrinkage
from ..registries import OPERATORS
from .base import Operator, labelled
from .objective_geometry import FRAMES, readout_frame

STATS = ["participation_ratio", "top_share", "n_objectives"]


@dataclass(frozen=True)
class EffectiveObjectivesParams:
    frame: str = "whitened"
    shrinkage: str = "auto"                 # plain covariance when invertible (exact invariance), else Ledoit–Wolf


def participation_ratio(U: np.ndarray) -> tuple[float, float]:
    """(PR, top share) of the Gram spectrum of rows ``U`` (K × d); NaN for an all-zero U."""
    lam = np.clip(np.linalg.eigvalsh(U @ U.T), 0.0, None)
    tot = lam.sum()
    if tot <= 0:
        return float("nan"), float("nan")
    return float(tot * tot / (lam * lam).sum()), float(lam.max() / tot)


@OPERATORS.register
class EffectiveObjectives(Operator):
    """Effective number of objectives: participation ratio of the head rows' Gram spectrum (whitened)."""

    name = "effective_objectives"
    dims = "() → effective_statistic"
    reads_capture = True           # the whitened frame is fitted on every pair's readout h
    Params = EffectiveObjectivesParams
    n_inputs = 0

    def out_dims(self, in_dims, info, where):
        if self.p.frame not in FRAMES:
            raise SpecError(where + ".frame", f"unknown frame '{self.p.frame}'.", value=self.p.frame, options=FRAMES)
        check_shrinkage(self.p.shrinkage, where + ".shrinkage")
        if info.n_objectives < 2:
            raise SpecError(where, f"the model has {info.n_objectives} head row; there is one objective.",
                            fix="use a model with model.num_labels ≥ 2 (or a gated head).")
        return ("effective_statistic",)

    def gauge(self, in_gauges, info):
        return info.native_frame if self.p.frame == "native" else f"frame:whitened:{info.model_name}"

    def run(self, ctx):
        W = np.asarray(ctx.lm.head.W, np.float64)
        attrs = {}
        if self.p.frame == "native":
            U, gauge = W, ctx.info.native_frame
        else:
            frame = readout_frame(ctx, self.p.shrinkage)
            U, gauge = frame.direction_to_frame(W, ctx.info.model_name), frame.gauge
            attrs = {"frame_id": frame.id}
        pr, top = participation_ratio(U)
        arr = xr.DataArray(np.array([pr, top, W.shape[0]], np.float64), dims=("effective_statistic",),
                           coords={"effective_statistic": STATS})
        out = labelled(arr, "statistic", gauge, f"effective number of objectives ({self.p.frame} frame)")
        out.attrs.update(attrs)
        return out
