"""What ``spec.validate`` checks on a merged ``RunConfig`` beyond its schema's types, before any model loads:
the model's values (``model_checks``), the dataset reader's name (``registries.DATASET_READERS``, did you mean)
and limit, ``observable``'s restrictions (``pairs``, ``layers``, ``components``) and the frame's settings
(``frame.shrinkage``: ``check_shrinkage``, also read by the operators that fit a covariance). Errors: ``SpecError``
naming the dotted key, the closest option and the fix. Enums are compared by value (their ``str`` mixin), so this
module needs no schema.
"""
from __future__ import annotations

from .errors import SpecError
from .model_checks import check_model
from .registries import DATASET_READERS


def check_values(run, partial: bool = False) -> None:
    """The values of a merged ``RunConfig`` that its schema's types cannot state: the model's
    (``model_checks.check_model``), ``dataset.kind`` / ``limit``, ``observable``'s restrictions and the frame's
    settings. ``partial``: ``run`` holds one command-line override (``spec.validate``), so checks that relate
    several keys wait. Raises ``SpecError`` naming the key."""
    check_model(run.model, partial)             # model.*: no model loads (model_checks)
    DATASET_READERS.get(run.dataset.kind, "dataset.kind")      # dataset=<name>: did you mean
    if run.dataset.limit is not None and run.dataset.limit <= 0:
        raise SpecError("dataset.limit", f"must be positive or null, got {run.dataset.limit}.",
                        fix="set dataset.limit=N with N ≥ 1 (the first N pairs), or dataset.limit=null (all).")
    _check_restrictions(run.observable)
    _check_frame(run.frame, partial)


def _check_restrictions(obs) -> None:
    """``observable.pairs`` ≥ 1; ``observable.layers`` / ``components`` non-empty and without repeats
    (an empty list would select nothing, a repeat would give a coordinate that ``sel`` returns twice)."""
    if obs.pairs is not None and obs.pairs <= 0:
        raise SpecError("observable.pairs", f"must be a positive integer or null (all pairs), got {obs.pairs}.",
                        value=obs.pairs, fix="set observable.pairs=N with N ≥ 1, or drop it.")
    for key in ("layers", "components"):
        vals = getattr(obs, key)
        if vals is None:
            continue
        if len(vals) == 0:
            raise SpecError(f"observable.{key}", "an empty list selects nothing.",
                            fix=f"list at least one, or drop observable.{key} (null = all).")
        dup = sorted({v for v in vals if list(vals).count(v) > 1}, key=str)
        if dup:
            raise SpecError(f"observable.{key}", f"{dup} listed more than once.", value=list(vals),
                            fix="list each once.")


def _check_frame(f, partial: bool) -> None:
    check_shrinkage(f.shrinkage, "frame.shrinkage")
    if f.reference_limit < 2:
        raise SpecError("frame.reference_limit", f"must be at least 2, got {f.reference_limit}.",
                        fix="a frame needs reference activations from at least 2 pairs (both sides); use 256 or more.")
    if partial:
        return
    if f.name == "shared" and not f.partner and not f.id:
        raise SpecError("frame.partner", "a shared frame is fitted for two models; the other one is not named.",
                        fix="add frame.partner=<another conf/model option or a model YAML path> "
                            "(or frame.id=<stored shared frame id>).")
    if f.name != "shared" and f.partner:
        raise SpecError("frame.partner", f"frame.partner is only used by frame=shared, not frame={f.name.value}.",
                        fix="drop frame.partner, or use frame=shared.")
    if f.name == "native" and (f.id or f.reference):
        key = "frame.id" if f.id else "frame.reference"
        raise SpecError(key, "frame=native is the model's own basis; it is not fitted or stored.",
                        fix=f"use frame=whitened or frame=shared with {key}, or drop {key}.")
    if f.id and (f.partner or f.reference):
        key = "frame.partner" if f.partner else "frame.reference"
        raise SpecError(key, f"frame.id names a stored frame, so {key} (a setting for fitting one) would be ignored.",
                        fix=f"drop {key}, or drop frame.id to fit a frame.")


SHRINKAGE = ("auto", "ledoit_wolf", "oas", "none")   # covariance shrinkage estimators (frames.covariance)


def check_shrinkage(value, where: str = "frame.shrinkage") -> str | float:
    """Normalise a shrinkage setting; raise ``SpecError`` naming ``where`` if it is invalid."""
    if isinstance(value, str) and value in SHRINKAGE:
        return value
    try:
        rho = float(value)
    except (TypeError, ValueError):
        raise SpecError(where, f"unknown shrinkage {value!r}.", value=str(value),
                        options=list(SHRINKAGE) + ["<number in [0, 1]>"]) from None
    if not 0.0 <= rho <= 1.0:
        raise SpecError(where, f"a fixed shrinkage must lie in [0, 1], got {rho}.")
    return rho
