"""A DPO-implicit reward's settings (``model.implicit.*``): checks, what changes the numbers, what it refuses.

No torch: the reference model is resolved through the guarded door (``models.door.nested``), which builds a
``ModelSpec`` — so the kinds table reaches these functions by lazy reference (``kinds.base.Lazy``). The model
is ``kinds.implicit.model``. Errors: ``SpecError`` naming ``model.implicit.*``.
"""
from __future__ import annotations

import dataclasses
from enum import Enum

import numpy as np

from ...errors import SpecError
from ...models.door import nested

class KindConfig:
    """What the fingerprint reads as a container's config (``models.fingerprint.config_dict``)."""

    def __init__(self, d: dict):
        self._d = d

    def to_diff_dict(self) -> dict:
        return dict(self._d)


# operators that read a linear head or one readout vector: none applies to a log-probability readout
LINEAR_OPS = ("capture", "project", "final_norm", "ablate", "ablate_rescue", "patch", "attribution_patch",
              "patch_heads", "attribution_patch_heads", "path_patch", "steer", "prefix", "gate_weights",
              "objective_geometry", "direction", "contested_direction", "effective_objectives", "mean_direction",
              "position_bias", "swap_consistency")


def refused_ops(spec) -> dict:
    """``{op: one-line reason}`` for ``model.kind=implicit`` (``kinds``)."""
    why = ("the implicit reward β·Σ_t log π/π_ref is a nonlinear readout of every response position, not a "
           "linear head on one readout vector (no w_r); use implicit_reward / implicit_lens / implicit_patch")
    return {op: why for op in LINEAR_OPS}


def canonical_spec(spec) -> dict:
    """A ``ModelSpec`` as plain JSON values (enums by value): what of a reference or member changes numbers."""
    def plain(v):
        if isinstance(v, Enum):
            return v.value
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    skip = {"batch_size", "max_tokens", "threads", "device", "name", "device_map", "max_memory", "offload_folder"}
    return {k: x for k, x in plain(spec).items() if k not in skip}


def implicit_settings(spec, base_dir=None) -> dict:
    """β, the normalization and the reference (its spec, or null): in the run id (``run.identity.numerics``)."""
    ref = spec.implicit.reference
    return {"beta": float(spec.implicit.beta), "length_normalize": bool(spec.implicit.length_normalize),
            "reference": None if ref is None else canonical_spec(nested(spec, ref, "model.implicit.reference",
                                                                             base_dir))}


def check_implicit(spec) -> None:
    """Plan-time checks of ``model.implicit``; ``SpecError`` naming the key."""
    beta = spec.implicit.beta
    if spec.implicit.reference is not None:
        nested(spec, spec.implicit.reference, "model.implicit.reference")
    if not isinstance(beta, (int, float)) or not np.isfinite(beta) or beta <= 0:
        raise SpecError("model.implicit.beta", f"must be a positive number, got {beta!r}.", fix="e.g. 0.1")
