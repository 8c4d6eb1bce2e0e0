"""bradley_terry: probability, loss and gradient of a margin under Bradley–Terry.

Bradley & Terry (1952): ``p = σ(Δ)``; loss ``−log σ(Δ) = softplus(−Δ)`` in nats;
``∂loss/∂Δ = σ(Δ) − 1 = −σ(−Δ)``, computed as ``−σ(−Δ)`` (no cancellation: exact to
relative precision for large Δ, where ``σ(Δ) − 1`` rounds to 0). Stable scipy ``expit``/``log_expit``.
Worked check: Δ = ln 3 → p = 0.75, loss 0.287682 nats, gradient −0.25.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, log_expit

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled

_Q = {"p": ("probability", lambda d: expit(d)), "loss": ("nats", lambda d: -log_expit(d)),
      "grad": ("nats/reward", lambda d: -expit(-d))}


def bt(delta, quantity: str):
    """Bradley–Terry ``quantity`` ∈ {p, loss, grad} of margins ``delta`` (array-like)."""
    return _Q[quantity][1](np.asarray(delta, np.float64))


@dataclass(frozen=True)
class BradleyTerryParams:
    quantity: str = "p"


@OPERATORS.register
class BradleyTerry(Operator):
    """Bradley–Terry p = σ(Δ), loss softplus(−Δ) (nats) or gradient −σ(−Δ) of a margin."""

    name = "bradley_terry"
    per_pair = True
    dims = "margin (pair [× objective]) → same dims"
    Params = BradleyTerryParams

    def out_dims(self, in_dims, info, where):
        if self.p.quantity not in _Q:
            raise SpecError(where + ".quantity", f"unknown quantity '{self.p.quantity}'.",
                            value=self.p.quantity, options=_Q)
        if "side" in in_dims[0]:
            raise SpecError(where + ".input", "Bradley–Terry reads a margin; the input still has a side dim.",
                            fix="insert a diff step before it.")
        return in_dims[0]

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, x):
        out = x.copy(deep=False, data=bt(x.values, self.p.quantity))     # new values; coords not copied again
        return labelled(out, _Q[self.p.quantity][0], INVARIANT)
