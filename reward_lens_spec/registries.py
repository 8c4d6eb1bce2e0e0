"""One generic registry, and one instance per extension point.

A ``Registry`` maps a name to one object that carries all its facts (an operator class, a dataset reader, a
calibration criterion, a command …). Things join it in one of two ways, both naming a real object:

- a decorator (or a call) on the object itself: ``@OPERATORS.register`` (the name is the object's ``name``
  attribute) or ``OPERATORS.register(obj, name="x")``;
- a lazy reference ``"package.module:attribute"`` (``REG.lazy("x", "pkg.mod:attr")``): the module is imported
  the first time the name is looked up, the attribute is checked (the registry's ``check``: its type, its
  ``name`` equal to the registered one) and then cached. A reference keeps a heavy module (torch,
  transformers) off the light paths (``validate``, ``ops``, a rerun) and is never string dispatch at a call
  site: callers ask ``REG.get(name)`` and receive the object.

Built-in members that register themselves by decorator are found by importing the modules named in
``builtins`` (a package path is scanned, one level) on the first lookup. Third-party members come from Python
entry points of the registry's ``group`` (``reward_lens_spec.<registry>``), only for distributions the user
allows (``plugins.py``); a name offered by a distribution that is not allowed gets a line saying so.

``get(name, where)`` raises ``SpecError`` naming ``where`` (the config field), with "did you mean" and the
valid names; ``describe()`` lists ``name → first docstring line``. A registry is a read-only mapping of
names to resolved objects (``reg[name]``, ``name in reg``, ``len(reg)``, ``reg.items()``).

Registries (the instances below): ``OPERATORS`` (``ops/``), ``DATASET_READERS`` (``dataset=<name>``),
``CRITERIA`` (calibration criteria, ``trust.criteria``), ``COMMANDS`` (``reward-lens-spec <command>``),
``FAMILIES`` (model family tables, ``models.families``), ``KINDS`` (``model.kind``, ``kinds/``), ``ORGANISMS``
(``calibrate organism=<name>``: families of model organisms, ``organisms/``).
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any, Iterator

from .errors import SpecError
from importlib.metadata import entry_points
from importlib.metadata import PackageNotFoundError, distribution

ENTRY_POINT_PREFIX = "reward_lens_spec."


def resolve_ref(ref: str) -> Any:
    """The object a ``"package.module:attribute"`` reference names (dotted attributes allowed).
    Raises ``SpecError`` (field ``plugins``) when the module or the attribute is missing."""
    mod, sep, attr = ref.partition(":")
    if not sep or not mod or not attr:
        raise SpecError("plugins", f"reference {ref!r} is not of the form 'package.module:attribute'.",
                        fix="write the reference as 'package.module:attribute'.")
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as exc:
        raise SpecError("plugins", f"reference {ref!r}: module {mod!r} cannot be imported ({exc}).",
                        fix="install the package that provides it, or correct the reference.") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError("plugins", f"reference {ref!r}: module {mod!r} has no attribute {attr!r}.",
                            fix="correct the reference.")
        obj = getattr(obj, part)
    return obj


def first_line(obj: Any) -> str:
    doc = getattr(obj, "description", None) or (obj.__doc__ if isinstance(obj, type) or callable(obj)
                                                 else type(obj).__doc__) or ""
    doc = str(doc).strip()
    return doc.splitlines()[0] if doc else ""


class Registry(Mapping):
    """Name → registered object, for one extension point (see the module docstring).

    ``what``: the thing's name in messages (``"operator"``); ``field``: the config field an unknown name is
    reported on; ``kind``: a class every member must be (an instance of, or for ``classes=True`` a subclass
    of); ``builtins``: modules (or packages, scanned one level) whose import registers the built-ins;
    ``fix``: how to list the valid names.
    """

    def __init__(self, what: str, field: str, *, kind: type | str | None = None, classes: bool = False,
                 builtins: tuple[str, ...] = (), fix: str = "", group: str | None = None, ordered: bool = False,
                 scan: bool = True):
        self.what, self.field, self.kind, self.classes, self.ordered = what, field, kind, classes, ordered
        self.scan = scan
        self.builtins, self.fix = builtins, fix
        self.group = group or f"{ENTRY_POINT_PREFIX}{what.replace(' ', '_')}s"
        self._items: dict[str, Any] = {}
        self._lazy: dict[str, str] = {}
        self._loaded = False

    # -- registration
    def register(self, obj: Any = None, *, name: str | None = None):
        """Register ``obj`` under ``name`` (default ``obj.name``); usable as a bare decorator, as
        ``@REG.register(name="x")`` or as a call. Returns ``obj``. Raises ``TypeError`` for a wrong type."""
        if obj is None:
            return lambda o: self.register(o, name=name)
        key = name or getattr(obj, "name", None)
        if not isinstance(key, str) or not key:
            raise TypeError(f"a {self.what} needs a non-empty string name (got {key!r}).")
        self._check(key, obj)
        self._items[key] = obj
        self._lazy.pop(key, None)
        return obj

    def lazy(self, name: str, ref: str) -> None:
        """Register ``name`` as the object ``ref`` (``"package.module:attribute"``) names, imported and checked
        on first lookup."""
        if name not in self._items:
            self._lazy[name] = ref

    def pop(self, name: str, default: Any = None) -> Any:
        """Remove ``name`` (a test's scratch member); returns what was registered, or ``default``."""
        self._lazy.pop(name, None)
        return self._items.pop(name, default)

    def _check(self, name: str, obj: Any) -> None:
        if self.kind is not None:
            if isinstance(self.kind, str):         # "pkg.mod:Class": the base class, imported when first needed
                self.kind = resolve_ref(self.kind)
            ok = (isinstance(obj, type) and issubclass(obj, self.kind)) if self.classes else isinstance(obj, self.kind)
            if not ok:
                raise TypeError(f"{self.what} '{name}' must be {'a subclass' if self.classes else 'an instance'} "
                                f"of {self.kind.__module__}.{self.kind.__qualname__}, got {obj!r}.")
        own = getattr(obj, "name", name)
        if isinstance(own, str) and own and own != name:
            raise TypeError(f"{self.what} registered as '{name}' names itself '{own}'.")

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for mod in self.builtins:
            m = importlib.import_module(mod)
            for sub in pkgutil.iter_modules(getattr(m, "__path__", ()) if self.scan else ()):
                if not sub.name.startswith("_") and sub.name != "base":
                    importlib.import_module(f"{mod}.{sub.name}")

    def _resolve(self, name: str) -> Any:
        ref = self._lazy.pop(name)
        obj = resolve_ref(ref)
        try:
            self._check(name, obj)
        except TypeError as exc:
            raise SpecError(self.field, f"{ref} does not give a {self.what}: {exc}",
                            fix="point the reference at the object itself.") from None
        self._items[name] = obj
        return obj

    # -- lookup
    def get(self, name: str, where: str | None = None, default: Any = ...) -> Any:  # type: ignore[override]
        """The object registered as ``name``; ``SpecError`` on field ``where`` (default ``self.field``) with
        "did you mean" and the valid names (or ``default`` when one is given)."""
        self._load()
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            return self._resolve(name)
        if default is not ...:
            return default
        dist = offered_by(self.group, name)      # a distribution the user did not allow offers it
        if dist:
            raise SpecError(where or self.field, f"{self.what} '{name}' comes from the Python distribution "
                            f"'{dist}', whose code is not loaded unless you allow it.",
                            fix=f"allow it in your config: +plugins.allow=[{dist}] (configs load no code otherwise).")
        raise SpecError(where or self.field, f"unknown {self.what} '{name}'.", value=name,
                        options=self.names(), fix=self.fix or None)

    def names(self) -> list[str]:
        """The registered names: sorted, or (``ordered``) in registration order."""
        self._load()
        return [*self._items, *self._lazy] if self.ordered else sorted({*self._items, *self._lazy})

    def describe(self) -> dict[str, str]:
        """Registered names → the first line of each object's ``description`` or docstring."""
        return {n: first_line(self[n]) for n in self.names()}

    def __getitem__(self, name: str) -> Any:
        self._load()
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            return self._resolve(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items or name in self._lazy

    def __repr__(self) -> str:
        return f"<Registry of {self.what}s: {', '.join(self.names())}>"



# ----------------------------------------------------------------------------- third-party members (entry points)

_ALLOWED: set[str] = set()


def _norm(dist: str) -> str:
    """A distribution name as packaging normalizes it (PEP 503: lower case, runs of ``-_.`` → ``-``)."""
    return "-".join(p for p in dist.lower().replace("_", "-").replace(".", "-").split("-") if p)


def _entry_points(group: str) -> list:
    return list(entry_points(group=group))


def offered_by(group: str, name: str) -> str | None:
    """The distribution whose entry point of ``group`` is named ``name`` and is not allowed (its metadata
    only: no code is imported), or ``None``."""
    for ep in _entry_points(group):
        dist = getattr(ep.dist, "name", None) or ""
        if ep.name == name and _norm(dist) not in _ALLOWED:
            return dist
    return None


def allow_plugins(dists) -> list[str]:
    """Register, as lazy references, the entry points of every registry's group that the distributions in
    ``dists`` (``plugins.allow`` of the user's config) declare; nothing else is ever loaded from entry points.
    Returns ``registry:name`` of each registered member. Raises ``SpecError`` (``plugins.allow``) for a
    distribution that is not installed, or one that declares no entry point of this package."""
    added = []
    for dist in dists or ():
        if not isinstance(dist, str) or not dist:
            raise SpecError("plugins.allow", f"must list distribution names, got {dist!r}.",
                            fix="e.g. plugins.allow=[my_pkg].")
        try:
            distribution(dist)
        except PackageNotFoundError:
            raise SpecError("plugins.allow", f"no installed Python distribution is named '{dist}'.",
                            fix=f"pip install {dist}, or drop it from plugins.allow.") from None
        _ALLOWED.add(_norm(dist))
        found = False
        for reg in REGISTRIES.values():
            for ep in _entry_points(reg.group):
                if _norm(getattr(ep.dist, "name", "") or "") == _norm(dist):
                    reg.lazy(ep.name, ep.value)
                    added.append(f"{reg.what}:{ep.name}")
                    found = True
        if not found:
            raise SpecError("plugins.allow", f"distribution '{dist}' declares no entry point in the groups "
                            f"{', '.join(r.group for r in REGISTRIES.values())}.",
                            fix="declare its members under [project.entry-points.\"reward_lens_spec.operators\"] "
                                "(…readers, …criteria, …kinds), or drop it from plugins.allow.")
    return added


# ----------------------------------------------------------------------------- the registries

OPERATORS = Registry("operator", "observable.steps", kind="reward_lens_spec.ops.base:Operator", classes=True,
                     builtins=("reward_lens_spec.ops",), group="reward_lens_spec.operators",
                     fix="`reward-lens-spec ops` lists the registered operators.")
DATASET_READERS = Registry("dataset reader", "dataset.kind", kind="reward_lens_spec.dataset_readers:DatasetReader",
                           builtins=("reward_lens_spec.dataset_readers",), group="reward_lens_spec.readers",
                           fix="`reward-lens-spec readers` lists them; set dataset=<name>.")
CRITERIA = Registry("criterion", "criterion", kind="reward_lens_spec.trust.criteria:Criterion", ordered=True,
                    builtins=("reward_lens_spec.trust.criteria",), group="reward_lens_spec.criteria",
                    fix="`reward-lens-spec criteria` lists them.")
COMMANDS = Registry("command", "command", kind="reward_lens_spec.commands:Command", ordered=True,
                    builtins=("reward_lens_spec.commands",),
                    fix="reward-lens-spec help lists the commands; a config choice is group=option.")
FAMILIES = Registry("model family", "model.family", kind="reward_lens_spec.models.families:Family",
                    builtins=("reward_lens_spec.models.families",), group="reward_lens_spec.families",
                    fix="add a table under reward_lens_spec/models/families/ (docs/extending.md).")
KINDS = Registry("kind of reward signal", "model.kind", kind="reward_lens_spec.kinds.base:Kind", ordered=True,
                 builtins=("reward_lens_spec.kinds",), scan=False, group="reward_lens_spec.kinds",
                 fix="set model.kind to one of the valid kinds (docs/reward-signals.md).")
ORGANISMS = Registry("organism", "organism", kind="reward_lens_spec.organisms.organism_base:OrganismFamily",
                     builtins=("reward_lens_spec.organisms",), group="reward_lens_spec.organisms",
                     fix="`reward-lens-spec organisms` lists them (docs/trust.md).")
REGISTRIES: dict[str, Registry] = {"operators": OPERATORS, "readers": DATASET_READERS, "criteria": CRITERIA,
                                   "families": FAMILIES, "kinds": KINDS, "organisms": ORGANISMS}
