"""What a kind of reward signal is: one ``Kind`` object, and ``Lazy``, a reference to a real function.

A ``Kind`` carries everything the package knows about one ``model.kind`` (the table of them is
``kinds.KINDS``; the recipe for a new one is in ``kinds/__init__.py``):

``load``       ``(spec, base_dir) -> LoadedModel``: the guarded loader of that kind (``inputs.load_lm`` calls it;
               every kind ends in ``models.loading.wrap_model``, so the readout is a ``ReadoutHead`` and every
               linear instrument applies unchanged).
``check``      ``(spec) -> None``: the kind's own settings (``model.<kind>.*``), ``SpecError`` before loading.
``encode``     ``(enc, lm, spec[, pairs]) -> EncodedPairs`` or None: how the kind moves the readout position after
               formatting (a PRM cuts each side after the chosen step's boundary token); ``encode_reads_pairs``:
               it also takes the pairs (their prompts: response starts).
``refuses``    ``(spec) -> {op: one-line reason}``: operators that do not apply (``planning.plan_for`` refuses them
               before any model loads).
``settings``   ``(spec) -> dict``: what of the kind's settings changes the numbers (run identity, fingerprint cache
               key); None for the classifier, so its run ids are as before.
``organisms``  ``{organism family: builder(strength, **kw) -> Organism}``: the kind's model organisms (a planted,
               known answer; ``organisms.kind_organisms`` registers each in ``registries.ORGANISMS``).
``criteria``   names of the trust criteria graded on those organisms (``trust.kind_criteria``).
``identities`` the exactness identities a run of the kind checks on its own outputs (``trust.identities``), in words.
``other_checkpoints``  the loader reads checkpoints beside ``model.source`` (a reference, members): no
               fingerprint is remembered without a load (``models.fingerprint_cache.weights_key``).
``package``    the kind's folder (a package): its ``.py`` files are what the fingerprint cache keys on
               (``Kind.files``, ``models.fingerprint_cache.weights_key``).

A function that imports torch or transformers, or reaches back through ``models.door`` (which builds a
``ModelSpec``), is held as a ``Lazy`` reference: ``spec`` validation imports the table without either, and the
package's import graph keeps no cycle. ``tests/test_kinds.py`` resolves every reference of every kind.
"""
from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping


@dataclass(frozen=True)
class Lazy:
    """``module.attr``, imported on first use; calling it calls the attribute. ``resolve()`` raises
    ``ImportError`` / ``AttributeError`` when the reference is wrong (a test resolves every one)."""

    module: str
    attr: str

    def resolve(self) -> Callable:
        return getattr(importlib.import_module(self.module), self.attr)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


@dataclass(frozen=True)
class Kind:
    """One kind of reward signal (the module docstring names every field)."""

    name: str
    doc: str
    package: str
    load: Callable
    check: Callable | None = None
    encode: Callable | None = None
    encode_reads_pairs: bool = False
    refuses: Callable | None = None
    settings: Callable | None = None
    organisms: Mapping[str, Callable] = field(default_factory=dict)
    criteria: tuple[str, ...] = ()
    identities: tuple[str, ...] = ()
    other_checkpoints: bool = False

    def files(self) -> tuple[Path, ...]:
        """The ``.py`` files of the kind's folder, sorted (its code: settings, loader, encode, organisms)."""
        root = Path(importlib.import_module(self.package).__file__).parent
        return tuple(sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts))

    def code_digest(self) -> str:
        """sha256 hex of the kind's code (each of ``files()``: its path in the folder and its bytes): in the
        fingerprint cache's key, so an edit to a kind's loader is never answered by a stale remembered fingerprint."""
        h = hashlib.sha256()
        root = Path(importlib.import_module(self.package).__file__).parent
        for p in self.files():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()

    def callables(self) -> dict[str, Callable]:
        """Every function the kind carries, by field (``organisms.<name>`` for its organism builders)."""
        out = {f: getattr(self, f) for f in ("load", "check", "encode", "refuses", "settings") if getattr(self, f)}
        return {**out, **{f"organisms.{k}": v for k, v in self.organisms.items()}}
