"""A study from Python (a notebook), on the one path: ``reward_lens_spec.run(...)``.

``run(overrides, config_dir=...)`` takes what the command line takes — a list of ``key=value`` strings, or
a dict (nested dicts become dotted keys: ``{"observable": "dla", "dataset": {"limit": 20}}`` is
``["observable=dla", "dataset.limit=20"]``) — composes it with ``run.compose.compose_run`` (the same
folders, safety rules and "did you mean" as the command line; what the caller passes counts as typed),
and executes it with ``run.executor.execute`` (the same identity and reuse: a second call with the same
overrides is found in the store, not recomputed). There is no second route.

The returned ``RunHandle`` gives the results as labelled xarray objects read from the store: each output
variable of at most ``EAGER_BYTES`` is loaded into memory (``.item()``, ``.values`` work at once); a larger
one stays lazy (dask-backed: call ``.compute()`` or ``.load()`` when needed).
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import SpecError
from .run.executor import execute
from .run.compose import compose_run, store_url
from .store import open_store

EAGER_BYTES = 64 * 2**20          # per output variable: at most this many bytes are read now, larger ones lazily
_BARE = re.compile(r"^[\w./:+@-]*$")


def _value(v) -> str:
    """One override value in Hydra's grammar: bools and None as YAML, lists bracketed, other strings quoted
    unless they are a bare word."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    return s if _BARE.match(s) and s else "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def to_overrides(overrides) -> list[str]:
    """``overrides`` (``None``, a list of ``key=value`` strings, or a dict) as the command line's list.
    Raises ``SpecError`` (key ``overrides``) for anything else."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise SpecError("overrides", "is one string; it must be a list of key=value strings or a dict.",
                        value=overrides, fix=f"pass [{overrides!r}] or a dict such as {{'observable': 'dla'}}.")
    if isinstance(overrides, Mapping):
        out: list[str] = []

        def walk(prefix: str, node) -> None:
            for k, v in node.items():
                key = f"{prefix}.{k}" if prefix else str(k)
                if isinstance(v, Mapping):
                    walk(key, v)
                else:
                    out.append(f"{key}={_value(v)}")
        walk("", overrides)
        return out
    if isinstance(overrides, (list, tuple)) and all(isinstance(o, str) for o in overrides):
        return list(overrides)
    raise SpecError("overrides", f"is a {type(overrides).__name__}; it must be a list of key=value strings or a dict.",
                    fix="e.g. reward_lens_spec.run(['observable=dla', 'dataset.limit=20']).")


@dataclass
class RunHandle:
    """One executed (or reused) run: ``run_id``, ``store_url``, ``observable``, ``reused``; ``results`` the
    observable's outputs (a ``Result``: variable → ``xarray.DataArray``, each with its own coordinates —
    ``pair`` with ``dimension``/``prompt_id``, ``layer``, ``component``, ...; small ones in memory, see the
    module doc); ``provenance`` and ``trust`` read from the store; ``h["margin"]`` is ``h.results["margin"]``."""

    run_id: str
    store_url: str
    observable: str
    reused: bool
    _results: object = field(default=None, repr=False)
    _handle: object = field(default=None, repr=False)     # the run's store handle (store.store_handle)

    @property
    def store(self):
        return open_store(self._handle if self._handle is not None else self.store_url)

    @property
    def results(self):
        if self._results is None:
            self._results = self.store.load(self.run_id, self.observable, lazy=EAGER_BYTES)
        return self._results

    @property
    def provenance(self) -> dict:
        return self.store.provenance(self.run_id)

    @property
    def trust(self):
        return self.results.attrs.get("trust")

    def __getitem__(self, name):
        return self.results[name]

    def to_dataset(self):
        """The outputs as one ``xarray.Dataset`` (outer join of their coordinates; see ``Result.to_dataset``)."""
        return self.results.to_dataset()


def run(overrides=None, *, config_dir: str | os.PathLike | None = None, progress: bool = True) -> RunHandle:
    """Compose and execute one run as ``reward-lens-spec [overrides]`` would (see the module doc).

    ``config_dir``: a folder of the caller's own configs (as ``--config-dir``); relative store paths and data
    paths resolve against the working directory, as on the command line. ``progress``: print the pairs line
    and chunk progress. Raises ``SpecError`` (one line naming the key and the fix) for any refusal the
    command line would give; ``mode=validate`` is the command line's (``reward-lens-spec validate``)."""
    argv = to_overrides(overrides)
    if config_dir is not None:
        argv = ["--config-dir", os.fspath(config_dir)] + argv
    cfg, resolved_yaml = compose_run(argv)
    if cfg.mode.value != "run":
        raise SpecError("mode", f"is {cfg.mode.value!r}; reward_lens_spec.run executes a run.",
                        fix="drop mode=, or use `reward-lens-spec validate ...` to check a config.")
    base_dir = os.getcwd()
    out = execute(cfg, resolved_yaml=resolved_yaml, base_dir=base_dir, store_url=store_url(cfg.store.url, base_dir),
                  progress=progress)
    if getattr(out, "status", "complete") != "complete":
        raise SpecError("store.shards", f"this call stored shard {cfg.store.shard} of {cfg.store.shards}; the run "
                        "is listed when every shard is done.", fix="run the other shards, or drop store.shards.")
    return RunHandle(out.run_id, out.store_url, cfg.observable.name, bool(out.reused), _handle=out.store)
