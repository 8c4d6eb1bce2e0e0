"""Errors every layer raises, each naming the bad field and the fix.

``SpecError`` is raised before any model loads (config, plan, data schema);
``CaptureError`` is raised while running a model (self-check mismatch,
non-finite scores); ``GaugeError`` refuses a frame-dependent comparison;
``StoreError`` refuses a store that cannot be used as asked.
"""
from __future__ import annotations

import difflib
from typing import Iterable


def did_you_mean(value: str, options: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest option, or ``""``."""
    opts = [str(o) for o in options]
    close = difflib.get_close_matches(str(value), opts, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


class RewardLensError(Exception):
    """Base class of every error this package raises on purpose."""


class SpecError(RewardLensError, ValueError):
    """A config, plan or data problem found before any model runs.

    ``field`` is the dotted config key (or data field) at fault; ``detail`` what is wrong (the message with
    its "did you mean" and valid values), ``fix`` the fix: a re-raise under another key passes both on.
    """

    def __init__(self, field: str, message: str, *, value=None, options: Iterable[str] | None = None,
                 fix: str | None = None):
        self.field, self.fix = field, fix
        detail = message
        if options is not None:
            opts = sorted({str(o) for o in options})
            if value is not None:
                detail += did_you_mean(str(value), opts)
            detail += f" Valid: {', '.join(opts)}."
        self.detail = detail
        super().__init__(f"{field}: {detail}" + (f" Fix: {fix}" if fix else ""))


class CaptureError(RewardLensError, RuntimeError):
    """A model run produced something that must not become a result."""


class GaugeError(RewardLensError, ValueError):
    """A frame-dependent quantity was compared outside a shared frame."""


class StoreError(RewardLensError, RuntimeError):
    """A store cannot be read or written as asked; nothing else is touched."""


def schema_error(key: str, what: str, exc: Exception, names, *, fix: str | None = None) -> SpecError:
    """The ``SpecError`` for a config file (``what``: e.g. "x.yaml is not a valid model config") that does not fit
    its schema (``exc``: OmegaConf's error; ``names``: the schema's keys): a bad value of a known key names
    ``<key>.<that key>``; an unknown key names ``key`` with a "did you mean" among ``names`` and ``fix``."""
    bad, names = str(getattr(exc, "key", "") or ""), list(names)
    first = str(exc).splitlines()[0]
    if bad in names:
        return SpecError(f"{key}.{bad}", f"{what}: {first}.", fix=f"give {bad} a value of its type in that file.")
    return SpecError(key, f"{what}: {first}.{did_you_mean(bad, names) if bad else ''}", options=names, fix=fix)
