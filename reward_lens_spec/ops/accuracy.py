"""accuracy: the fraction of pairs the reward model orders correctly, per group, with a cluster-bootstrap CI.

Input: a margin Δ = r_chosen − r_rejected with a ``pair`` dim (other dims, e.g. ``layer`` of a lens,
kept). ``accuracy = P(Δ > 0) + ½ P(Δ = 0)`` (ties count half, as the scorecard's AUC).
``by``: a pair coordinate (``dimension``, ``prompt_id``, …) for one estimate per group (``by``
replaces ``pair``); ``cluster``: ``prompt`` (default: pairs sharing a prompt resampled together)
or ``pair``. Output dims ([by] ×) others × ``bound`` (estimate, ci_low, ci_high), coords ``n``
and ``n_eff`` (distinct prompt clusters) per group; ``resamples`` seeded draws (``ops._bootstrap``,
``stats``). Units: fraction. Gauge: invariant.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import SpecError
from ..registries import OPERATORS
from ._bootstrap import by_group
from ._grid import choice
from .base import Operator, need_dim, without
from ..stats import correct


@dataclass(frozen=True)
class GroupStatParams:
    by: Optional[str] = None
    cluster: str = "prompt"
    ci: float = 0.95
    resamples: int = 1000
    seed: int = 0


def accuracy(d: np.ndarray) -> float:
    return float(correct(d).mean())


class GroupStat(Operator):
    Params = GroupStatParams
    units = ""

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "pair", where, "one value per pair")
        choice(self.p.cluster, ("prompt", "pair"), where + ".cluster")
        if not (isinstance(self.p.resamples, int) and self.p.resamples >= 2):
            raise SpecError(where + ".resamples", f"resamples must be an integer ≥ 2, got {self.p.resamples!r}.",
                            fix="e.g. resamples: 1000 in the step.")
        return ((self.p.by,) if self.p.by else ()) + without(in_dims[0], "pair") + ("bound",)

    def run(self, ctx, x):
        return by_group(ctx, x, self.statistic, self.p.by, self.p.cluster, self.p.ci, self.p.resamples, self.p.seed,
                        self.units, f"{self.name}{' by ' + self.p.by if self.p.by else ''}, "
                        f"{self.p.ci:g} cluster-bootstrap interval")


@OPERATORS.register
class Accuracy(GroupStat):
    """Pairwise accuracy P(Δ > 0) + ½P(Δ = 0), per group, with a cluster-bootstrap CI and effective n."""

    name = "accuracy"
    dims = "x (pair [× …]) → [by ×] … × bound"
    units = "fraction"
    statistic = staticmethod(accuracy)
