"""Composing a run: the one place a command line becomes a validated ``RunConfig``.

``prepare(argv)`` does everything before Hydra composes: the user's config folders (``--config-dir``,
``hydra.searchpath``, ``REWARD_LENS_SPEC_CONFIG_PATH``) become one ``hydra.searchpath`` override and
files given by path become options (``overrides.prepare_overrides``); then the safety rules
(``config_safety.check_argv``: no code, files or secrets reachable from a config) and the typo
checks ("did you mean", ``overrides.precheck_overrides``). ``finish(cfg, typed)`` does everything
after: the composed tree's safety checks and ``spec.validate``. The main app runs ``prepare`` before
``hydra.main`` and ``finish`` in its task; ``compose_run`` runs both around Hydra's compose API for
``fit``, ``freeze``/``amend`` (a study's design), ``frames`` and the tests — so every route sees the
same folders and the same rules.

A command line whose checks passed is remembered (``signed_cache``, kind ``argv``) under a digest of
everything those checks read (``checked_inputs``): the overrides, the working directory, every YAML
file of every config folder, the files given by path as Hydra holds them, the package's code and the
versions of Hydra, OmegaConf and PyYAML, and the Hydra plugins installed. The same command again skips
the checks (no dry compose, no YAML read); any change to any of these runs all of them again, and a
refusal is never remembered.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..config_safety import check_argv
from ..models.door import admit_run
from ..overrides import precheck_overrides, prepare_overrides
from importlib import metadata
import importlib.util
import json
import os
import sys
import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict
from .. import config_safety
from ..overrides import REGISTERED
from ..paths import ENV, conf_dir, search_dirs, user_dirs
from ..signed_cache import package_digest, read_signed, write_signed
from ..spec import register_configs, validate


_CHECK_LIBRARIES = ("hydra-core", "omegaconf", "PyYAML", "antlr4-python3-runtime")


def _yaml_files(root: Path) -> list[list[str]]:
    return [[p.relative_to(root).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest()]
            for p in sorted(list(root.rglob("*.yaml")) + list(root.rglob("*.yml"))) if p.is_file()]


def folders_digest(dirs: list | None = None) -> list:
    """``[[folder, [[file, sha256], ...]], ...]`` of every YAML of the config folders (default: the built-in
    tree, then the user's folders: ``paths.search_dirs``)."""
    return [[str(Path(d).resolve()), _yaml_files(Path(d).resolve())] for d in (search_dirs() if dirs is None else dirs)]


def _plugin_files() -> list[list]:
    """Every file of the installed ``hydra_plugins`` namespace (path, size, mtime): a plugin can add configs."""
    try:
        spec = importlib.util.find_spec("hydra_plugins")
    except (ImportError, ValueError):
        spec = None
    out = []
    for d in (list(spec.submodule_search_locations or ()) if spec else []):
        for p in sorted(Path(d).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                st = p.stat()
                out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def checked_inputs(overrides: list[str]) -> str | None:
    """sha256 of everything ``check_argv`` and ``precheck_overrides`` read for ``overrides`` (the output of
    ``prepare_overrides``): see the module doc. ``None`` when some input cannot be read (then check)."""
    dirs = [conf_dir()] + list(user_dirs())
    for o in overrides:
        if o.lstrip("+").startswith("hydra.searchpath="):
            for e in o.partition("=")[2].strip().strip("[]").split(","):
                e = e.strip().strip("'\"")
                d = Path(e[len("file://"):] if e.startswith("file://") else e)
                if "://" not in str(d) and d.is_dir():
                    dirs.append(d)
    try:
        versions = {lib: metadata.version(lib) for lib in _CHECK_LIBRARIES}
        registered = {f"{g}/{n}": OmegaConf.to_yaml(ConfigStore.instance().load(f"{g}/{n}.yaml").node)
                      for g, names in sorted(REGISTERED.items()) for n in sorted(names)}
        doc = {"v": 1, "argv": list(overrides), "cwd": os.getcwd(), "python": sys.version, "env": os.environ.get(ENV),
               "folders": folders_digest(dirs),
               "registered": registered, "package": package_digest(), "libraries": versions,
               "plugins": _plugin_files()}
    except Exception:                                     # unreadable input: no digest, so the checks run
        return None
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def prepare(argv: list[str]) -> list[str]:
    """The overrides Hydra should compose for ``argv`` (see the module doc); ``SpecError`` on any refusal.
    Checks that passed for exactly these inputs before are not run again (``checked_inputs``)."""
    overrides = prepare_overrides(list(argv))
    digest = checked_inputs(overrides)
    if digest is None or read_signed("argv", digest) is None:
        check_argv(overrides)
        precheck_overrides(overrides)
        if digest is not None:
            write_signed("argv", digest, {"checked": "check_argv, precheck_overrides"})
    if digest is not None:
        _PASSED[tuple(overrides)] = digest
    return overrides


_PASSED: dict[tuple, str] = {}      # overrides -> the digest of the inputs their checks passed on (this process)


def finish(cfg, typed: list[str]):
    """``(RunConfig, resolved YAML)`` of a composed config; ``typed``: the overrides the person typed
    (``model.trust_remote_code`` counts only there). ``SpecError`` on any refusal."""
    config_safety.check_composed_config(OmegaConf.to_container(cfg, resolve=False), list(typed))
    return admit_run(validate(cfg), list(typed)), OmegaConf.to_yaml(cfg)


def compose_run(argv: list[str], *, typed: list[str] | None = None):
    """Compose ``conf/config.yaml`` (plus the user's folders) with ``argv`` and validate it:
    ``(RunConfig, resolved YAML)``. ``typed``: what the person typed (default ``argv``; a stored study's
    design passes none, so it can never switch on ``model.trust_remote_code``). Raises ``SpecError``."""
    overrides = prepare(argv)
    register_configs()
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = hydra.compose(config_name="config", overrides=overrides)
    return finish(cfg, argv if typed is None else typed)


def compose_app(overrides: list[str]):
    """The main app's config for ``overrides`` (the output of ``prepare``) composed once, when it is a plain
    single run that Hydra's own runner would only compose (twice) and call: no flag, no ``hydra.*`` override
    but the search path, ``hydra.mode`` not MULTIRUN and no sweeper params. Returns ``(config without its
    hydra node, hydra.hydra_logging, hydra.verbose)``, or ``None`` (not plain, or composing fails: then
    Hydra runs the app and reports as it always does).

    The composed config is remembered (``signed_cache``, kind ``compose``) under the digest ``prepare``'s
    checks passed on (``checked_inputs``: every input of the composition), when its YAML reads back to the
    same YAML; the same inputs again skip Hydra (no plugin scan, no schema registration, no compose)."""
    if any(o.startswith("-") or (o.lstrip("+~").startswith(("hydra.", "hydra/"))
                                 and not o.startswith("hydra.searchpath=")) for o in overrides):
        return None
    digest = _PASSED.get(tuple(overrides))
    found = read_signed("compose", digest) if digest else None
    if found is not None and isinstance(found.get("yaml"), str) and isinstance(found.get("hydra_logging"), dict):
        return OmegaConf.create(found["yaml"]), OmegaConf.create(found["hydra_logging"]), found.get("verbose")
    cfg = _compose_with_hydra_node(overrides)
    if cfg is None:
        return None
    hc = cfg.hydra
    if str(hc.mode) not in ("None", "RunMode.RUN", "RUN") or (hc.sweeper.get("params") or {}):
        return None
    logging_cfg = OmegaConf.to_container(hc.hydra_logging, resolve=True)
    verbose = OmegaConf.to_container(hc.verbose) if OmegaConf.is_config(hc.verbose) else hc.verbose
    with open_dict(cfg):
        del cfg["hydra"]
    text = OmegaConf.to_yaml(cfg)
    if digest and OmegaConf.to_yaml(OmegaConf.create(text)) == text:
        write_signed("compose", digest, {"yaml": text, "hydra_logging": logging_cfg, "verbose": verbose})
    return cfg, OmegaConf.create(logging_cfg), verbose


def _compose_with_hydra_node(overrides: list[str]):
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with hydra.initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return hydra.compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    except Exception:
        return None
    finally:
        GlobalHydra.instance().clear()


def store_url(url: str | None, base_dir: str, sweep_dir: str | None = None) -> str:
    """The store a run writes to, for every command: ``store.url`` as given when it is a URL or an absolute
    path, else under ``base_dir``. No url: ``<base_dir>/outputs/store.zarr``, for a single run and a multirun
    alike (one stable store, so a rerun of a sweep finds its runs instead of recomputing them in a new dated
    folder), or ``<sweep_dir>/store.zarr`` when the person chose the sweep folder (``hydra.sweep.dir=DIR``)."""
    if url is None:
        if sweep_dir is not None:
            return str((Path(base_dir) / sweep_dir) / "store.zarr")
        return str(Path(base_dir) / "outputs" / "store.zarr")
    return url if "://" in url or Path(url).is_absolute() else str(Path(base_dir) / url)
