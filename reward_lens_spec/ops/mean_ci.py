"""mean_ci: the mean of a per-pair value over pairs, per group, with a cluster-bootstrap CI.

Params, dims and coords as ``accuracy`` (``by``, ``cluster``, ``ci``, ``resamples``, ``seed``; ``bound`` ∈
estimate, ci_low, ci_high; ``n``, ``n_eff``); pairs with a NaN value (e.g. a fit split, or pairs outside
``observable.pairs``) are left out. Units: the input's. Gauge: invariant. Source: percentile bootstrap of
the mean over whole prompt clusters (``ops._bootstrap``; Field & Welsh 2007).
"""
from __future__ import annotations

import numpy as np

from ..registries import OPERATORS
from ._bootstrap import by_group
from .accuracy import GroupStat


def mean(d: np.ndarray) -> float:
    return float(d.mean()) if d.size else float("nan")


@OPERATORS.register
class MeanCI(GroupStat):
    """Mean over pairs of a per-pair value, per group, with a cluster-bootstrap CI and effective n."""

    name = "mean_ci"
    dims = "x (pair [× …]) → [by ×] … × bound"
    statistic = staticmethod(mean)

    def run(self, ctx, x):
        return by_group(ctx, x, self.statistic, self.p.by, self.p.cluster, self.p.ci, self.p.resamples, self.p.seed,
                        x.attrs.get("units", ""), f"mean{' by ' + self.p.by if self.p.by else ''}, "
                        f"{self.p.ci:g} cluster-bootstrap interval")
