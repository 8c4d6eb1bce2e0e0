"""An ensemble's settings (``model.members``, ``model.ensemble.*``): checks, the reduce, what it refuses.

No torch: members are resolved through the guarded door (``models.door.nested``), so the kinds table reaches
these functions by lazy reference (``kinds.base.Lazy``). The model is ``kinds.ensemble.model``. Errors:
``SpecError`` naming ``model.members.<i>`` or ``model.ensemble.*``.
"""
from __future__ import annotations

import numpy as np

from ...errors import SpecError
from ...models.door import nested
from ..implicit.settings import LINEAR_OPS, canonical_spec

REDUCES = ("mean", "min", "quantile")


def reduce_members(r: np.ndarray, how: str, q: float = 0.5) -> np.ndarray:
    """Reduce member rewards ``r`` (..., member) by ``how`` (see the module doc); float64."""
    r = np.asarray(r, np.float64)
    if how == "mean":
        return r.mean(-1)
    if how == "min":
        return r.min(-1)
    if how == "quantile":
        return np.quantile(r, q, axis=-1)
    raise SpecError("model.ensemble.reduce", f"unknown reduce '{how}'.", value=how, options=REDUCES)


def check_ensemble(spec) -> None:
    """Plan-time checks of ``model.members`` / ``model.ensemble`` (configs only)."""
    e = spec.ensemble
    if e.reduce not in REDUCES:
        raise SpecError("model.ensemble.reduce", f"unknown reduce '{e.reduce}'.", value=e.reduce, options=REDUCES)
    if e.reduce == "quantile" and not 0.0 <= float(e.q) <= 1.0:
        raise SpecError("model.ensemble.q", f"must be in [0, 1], got {e.q!r}.", fix="e.g. model.ensemble.q=0.25")
    if len(spec.members) < 2:
        raise SpecError("model.members", f"an ensemble needs at least two members, got {len(spec.members)}.",
                        fix="list conf/model options, e.g. model.members=[tiny,tiny_llama].")
    for i, ref in enumerate(spec.members):
        m = nested(spec, ref, f"model.members.{i}")
        if str(getattr(m, "kind", "classifier")) != "classifier":
            raise SpecError(f"model.members.{i}", f"member '{m.name}' is model.kind={m.kind}; ensemble members are "
                            "sequence classifiers (one readout each).", fix="list classifier models as members.")


def ensemble_settings(spec, base_dir=None) -> dict:
    """The members' specs, ``reduce`` and ``q``: in the run id (``run.identity.numerics``)."""
    return {"members": [canonical_spec(nested(spec, r, f"model.members.{i}", base_dir))
                        for i, r in enumerate(spec.members)],
            "reduce": spec.ensemble.reduce, "q": float(spec.ensemble.q) if spec.ensemble.reduce == "quantile" else None}


def refused_ops(spec) -> dict:
    """``{op: one-line reason}`` for ``model.kind=ensemble`` (``kinds``)."""
    why = ("an ensemble has no single residual stream or head (each member has its own, and min/quantile are not "
           "linear); run this instrument per member (model=<member>)")
    return {op: why for op in LINEAR_OPS}
