"""Kinds of reward signal: ``model.kind`` → how the model is built, its pairs encoded, what it refuses.

One row per kind in ``KINDS``. Builders are named as ``"module:function"`` strings and imported when
used, so this table imports nothing heavy (``spec`` checks ``model.kind`` through it before any model
loads, without an import cycle). A row:

``load``     ``(spec, base_dir) -> LoadedModel``: the guarded loader of that kind (``inputs.load_lm``
             calls it; every kind ends in ``models.loading.wrap_model``, so the readout is a
             ``ReadoutHead`` and every linear instrument applies unchanged).
``check``    ``(spec) -> None``: the kind's own settings (``model.<kind>.*``), ``SpecError`` before loading.
``encode``   ``(enc, lm, spec) -> EncodedPairs`` or null: how the kind moves the readout position after
             formatting (a PRM cuts each side after the chosen step's boundary token).
``refuses``  ``(spec) -> {op: one-line reason}``: operators that do not apply to this kind / mode
             (``planning.plan_for`` refuses them before any model loads).
``settings`` ``(spec) -> dict``: what of the kind's settings changes the numbers (run identity,
             fingerprint cache key); ``{}`` for the classifier, so its run ids are as before.

Rows: ``classifier`` (the sequence classifier with a linear or gated head, the default), ``judge``
(``models.judge``), ``prm`` (``models.prm``), ``implicit`` (``models.implicit``: DPO log-ratio; its own capture
pass, ``ImplicitModel.capture_pass``), ``ensemble`` (``models.ensemble``: members reduced). Errors: ``SpecError`` (``model.kind``) for an unknown
kind, with the closest name.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..errors import SpecError


@dataclass(frozen=True)
class Kind:
    """One kind of reward signal (see the module docstring); callables as ``"module:function"``."""

    name: str
    doc: str
    load: str
    check: str | None = None
    encode: str | None = None
    refuses: str | None = None
    settings: str | None = None
    encode_reads_pairs: bool = False      # ``encode`` also takes the pairs (their prompts: response starts)


_M = "reward_lens_spec.models."
KINDS: dict[str, Kind] = {
    "classifier": Kind("classifier", "sequence classifier: a linear (or gated) head at the last token",
                       load=_M + "loading:load_model"),
    "judge": Kind("judge", "generative judge: logit(yes) − logit(no) at the judgment position",
                  load=_M + "judge:load_judge", check=_M + "judge:check_judge", refuses=_M + "judge:refused_ops",
                  settings=_M + "judge:judge_settings"),
    "prm": Kind("prm", "process reward model: the head at every step boundary",
                load=_M + "prm:load_prm", check=_M + "prm:check_prm", encode=_M + "prm:cut_at_step",
                encode_reads_pairs=True, settings=_M + "prm:prm_settings"),
    "implicit": Kind("implicit", "DPO-implicit reward: β·Σ_t [log π − log π_ref] over the response tokens",
                     load=_M + "implicit:load_implicit", check=_M + "implicit:check_implicit",
                     encode=_M + "implicit:with_response_starts", encode_reads_pairs=True,
                     refuses=_M + "implicit:refused_ops", settings=_M + "implicit:implicit_settings"),
    "ensemble": Kind("ensemble", "ensemble: member rewards reduced per side (mean | min | quantile)",
                     load=_M + "ensemble:load_ensemble", check=_M + "ensemble:check_ensemble",
                     refuses=_M + "ensemble:refused_ops", settings=_M + "ensemble:ensemble_settings"),
}


def _fn(path: str) -> Callable:
    mod, name = path.split(":")
    return getattr(importlib.import_module(mod), name)


def kind_of(spec) -> str:
    """``model.kind`` of a ``ModelSpec`` (``classifier`` when the spec has none)."""
    return str(getattr(spec, "kind", None) or "classifier")


def get_kind(name: str) -> Kind:
    """The row for ``name``; ``SpecError`` (``model.kind``) naming the closest kind."""
    if name not in KINDS:
        raise SpecError("model.kind", f"unknown kind of reward signal '{name}'.", value=name, options=KINDS,
                        fix="set model.kind to one of the valid kinds (docs/reward-signals.md).")
    return KINDS[name]


def check_kind(spec) -> None:
    """``model.kind`` known and its own settings valid (before any model loads)."""
    k = get_kind(kind_of(spec))
    if k.check:
        _fn(k.check)(spec)


def load_kind(spec, base_dir: str | None = None):
    """The ``LoadedModel`` of ``spec`` built by its kind's loader."""
    return _fn(get_kind(kind_of(spec)).load)(spec, base_dir)


def encode_kind(enc, lm, spec=None, pairs=None):
    """``enc`` with the readout moved where the kind reads (identity for kinds without ``encode``).

    The kind comes from ``lm.signal`` when the model was loaded by a kind's loader, else from ``spec``."""
    sig = getattr(lm, "signal", None)
    name = getattr(sig, "kind", None) or (kind_of(spec) if spec is not None else "classifier")
    k = get_kind(name)
    if k.encode and k.encode_reads_pairs:
        return _fn(k.encode)(enc, lm, spec, pairs)
    return _fn(k.encode)(enc, lm, spec) if k.encode else enc


def refused_ops(spec) -> dict[str, str]:
    """``{operator name: one-line reason}`` this kind (and mode) refuses."""
    k = get_kind(kind_of(spec))
    return dict(_fn(k.refuses)(spec)) if k.refuses else {}


def kind_settings(spec) -> dict:
    """What of ``model.kind`` and its settings changes the numbers (``{}`` for the classifier)."""
    name = kind_of(spec)
    k = get_kind(name)
    if name == "classifier":
        return {}
    return {"kind": name, **(_fn(k.settings)(spec) if k.settings else {})}
