"""effect_size: the standardized mean margin d_z = mean(Δ) / sd(Δ), per group, with a cluster-bootstrap CI.

Cohen's d for paired observations (d_z; Cohen 1988, "Statistical Power Analysis", §2.3): the
mean chosen − rejected margin in units of its own standard deviation over pairs (ddof = 1; NaN for
fewer than 2 pairs or zero spread). Params, dims and coords as ``accuracy`` (``by``, ``cluster``,
``ci``, ``resamples``, ``seed``; ``bound`` ∈ estimate, ci_low, ci_high; ``n``, ``n_eff``). Units: standard deviations. Gauge: invariant.
"""
from __future__ import annotations

import numpy as np

from ..registries import OPERATORS
from .accuracy import GroupStat


def d_z(d: np.ndarray) -> float:
    if d.size < 2:
        return float("nan")
    sd = d.std(ddof=1)
    return float(d.mean() / sd) if sd > 0 else float("nan")


@OPERATORS.register
class EffectSize(GroupStat):
    """Standardized effect size d_z = mean(Δ)/sd(Δ), per group, with a cluster-bootstrap CI and effective n."""

    name = "effect_size"
    dims = "x (pair [× …]) → [by ×] … × bound"
    units = "standard deviations"
    statistic = staticmethod(d_z)
