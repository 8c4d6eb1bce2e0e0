"""Kinds of reward signal: ``model.kind`` → how the model is built, its pairs encoded, what it refuses.

Each kind is one ``Kind`` object (``kinds.base``) in its own folder, ``kinds/<kind>/__init__.py``, carrying its
loader, settings check, encode, refused operators, settings in the run identity, organisms, criteria,
exactness identities and code files; the table below registers each in ``registries.KINDS`` with one line. This table imports
nothing heavy: ``spec`` checks ``model.kind`` through it before any model loads.

Kinds: ``classifier`` (the sequence classifier with a linear or gated head, the default), ``judge``, ``prm``,
``implicit`` (DPO log-ratio; its own capture pass, ``ImplicitModel.capture_pass``), ``ensemble`` (members
reduced). Errors: ``SpecError`` (``model.kind``) for an unknown kind, with the closest name.

Adding a kind (``tests/test_kinds.py`` follows this on a scratch folder, through the real executor):

1. ``kinds/<name>/__init__.py`` with ``KIND = Kind("<name>", "<one line>", __name__, load=..., ...)``: ``load``
   ``(spec, base_dir) -> LoadedModel`` ending in ``models.loading.wrap_model`` (held as ``Lazy(__name__ +
   ".loader", "load_<name>")`` when the loader imports torch); optional ``check``, ``encode``, ``refuses``,
   ``settings``, ``organisms``, ``criteria``, ``identities`` (``kinds.base`` says what each takes and returns).
2. One registration line in the table below: ``from .<name> import KIND as <NAME>``.
3. A settings node ``model.<name>`` in ``spec_kinds`` only when the kind has its own keys.
"""
from __future__ import annotations

from ..registries import KINDS
from .base import Kind, Lazy  # noqa: F401  (what a kind's folder builds its KIND from)

# The registration table: one line per kind, in this order (``model.kind``'s options, docs, did-you-mean).
from .classifier import KIND as CLASSIFIER
from .judge import KIND as JUDGE
from .prm import KIND as PRM
from .implicit import KIND as IMPLICIT
from .ensemble import KIND as ENSEMBLE

for _kind in [k for k in dict(globals()).values() if isinstance(k, Kind)]:
    KINDS.register(_kind)           # registries.KINDS: model.kind's options (did you mean), plugins' kinds after


def kind_of(spec) -> str:
    """``model.kind`` of a ``ModelSpec`` (``classifier`` when the spec has none)."""
    return str(getattr(spec, "kind", None) or "classifier")


def get_kind(name: str) -> Kind:
    """The ``Kind`` named ``name``; ``SpecError`` (``model.kind``) naming the closest kind."""
    return KINDS.get(name, "model.kind")


def check_kind(spec) -> None:
    """``model.kind`` known and its own settings valid (before any model loads)."""
    k = get_kind(kind_of(spec))
    if k.check:
        k.check(spec)


def load_kind(spec, base_dir: str | None = None):
    """The ``LoadedModel`` of ``spec`` built by its kind's loader."""
    return get_kind(kind_of(spec)).load(spec, base_dir)


def encode_kind(enc, lm, spec=None, pairs=None):
    """``enc`` with the readout moved where the kind reads (identity for kinds without ``encode``).

    The kind comes from ``lm.signal`` when the model was loaded by a kind's loader, else from ``spec``."""
    sig = getattr(lm, "signal", None)
    name = getattr(sig, "kind", None) or (kind_of(spec) if spec is not None else "classifier")
    k = get_kind(name)
    if k.encode and k.encode_reads_pairs:
        return k.encode(enc, lm, spec, pairs)
    return k.encode(enc, lm, spec) if k.encode else enc


def refused_ops(spec) -> dict[str, str]:
    """``{operator name: one-line reason}`` this kind (and mode) refuses."""
    k = get_kind(kind_of(spec))
    return dict(k.refuses(spec)) if k.refuses else {}


def kind_settings(spec) -> dict:
    """What of ``model.kind`` and its settings changes the numbers (``{}`` for the classifier)."""
    name = kind_of(spec)
    k = get_kind(name)
    if name == "classifier":
        return {}
    return {"kind": name, **(k.settings(spec) if k.settings else {})}
