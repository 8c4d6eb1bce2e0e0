"""No foreign code from configs: what a config may make Hydra import or call, checked before Hydra runs.

Hydra calls (instantiates) whatever a config names: ``hydra.callbacks`` entries and every ``_target_``
run at startup, before our task and before any of our own checks, and logging configs name classes
(``class``) and factories (``()``). So a shared config that can set them can run any code (e.g. a
callback ``_target_: builtins.open`` or ``pathlib.Path.touch``). ``check_argv`` refuses, with one
``SpecError`` line naming the key and the file, before anything is composed or instantiated:

- ``hydra.callbacks`` (and any ``callbacks`` key or ``callbacks/`` config group) from ANY source;
- ``_target_`` anywhere unless its value is one of ``ALLOWED_TARGETS`` (the launchers this project
  supports: basic, joblib, submitit_local, submitit_slurm; and Hydra's basic sweeper);
- a ``()`` factory key, and a logging ``class`` outside the ``logging`` package;
- ``hydra.searchpath`` other than the one the command line builds from the user's config folders
  (``overrides.prepare_overrides``: ``file://`` folders only, each checked like ``conf/``; a ``pkg://``
  entry would import a Python module);
- ``--experimental-rerun`` (it unpickles a file) and ``--config-path`` (use ``--config-dir``).

Sources: command-line overrides (keys and parsed values, sweeps included), every YAML file of the
project's ``conf/`` and of ``--config-dir`` (so every experiment, study or option a sweep could select
is checked), and the composed primary config (Hydra's composition reads files and resolves nothing
executable; it is only the first step Hydra itself takes). A non-empty ``hydra.launcher.setup`` (shell
lines a SLURM job runs) is refused unless it was typed on the command line.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from .errors import SpecError

ALLOWED_TARGETS = frozenset({
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
})
ALLOWED_FACTORIES = frozenset({"colorlog.ColoredFormatter"})     # Hydra's colorlog logging plugin
_FIX = "remove it; this project runs no code named by a config (see README, 'Security')."


def _segments(key: str) -> list[str]:
    return [s for s in re.split(r"[./\s:=]+", str(key).lstrip("+~")) if s]


def check_tree(node: Any, where: str, path: tuple[str, ...] = (), in_logging: bool = False) -> None:
    """Refuse callbacks, foreign ``_target_``, ``()`` factories, non-``logging`` classes and search paths in a
    config tree (dicts/lists as parsed from YAML or an override); ``where`` names the source for the error."""
    if isinstance(node, dict):
        for k, v in node.items():
            key = str(k)
            full = ".".join(path + (key,))
            segs = _segments(key)
            last = segs[-1] if segs else key
            logging_here = in_logging or any("logging" in s for s in segs)
            if "callbacks" in segs:
                raise SpecError(full, f"{where} sets Hydra callbacks, which would run code at startup.", fix=_FIX)
            if "searchpath" in segs:
                raise SpecError(full, f"{where} adds a config search path (a source of configs and modules).",
                                fix="pass a config folder with --config-dir DIR instead.")
            if last == "_target_" and str(v) not in ALLOWED_TARGETS:
                raise SpecError(full, f"{where} names _target_ {v!r}, which Hydra would import and call; only the "
                                f"launchers this project supports are allowed ({', '.join(sorted(ALLOWED_TARGETS))}).",
                                fix=_FIX)
            if last == "()" and str(v) not in ALLOWED_FACTORIES:
                raise SpecError(full, f"{where} names a factory {v!r} that logging would call.", fix=_FIX)
            if last == "class" and logging_here and not str(v).startswith("logging."):
                raise SpecError(full, f"{where} names logging class {v!r} outside the logging package.", fix=_FIX)
            check_tree(v, where, path + (key,), logging_here)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            if isinstance(v, str) and "callbacks" in _segments(v.replace("override ", "")):
                raise SpecError(".".join(path) or "defaults", f"{where} selects Hydra callbacks ({v!r}).", fix=_FIX)
            check_tree(v, where, path + (str(i),), in_logging)


def _values(value: Any) -> Iterator[Any]:
    """Every value an override can take: sweep choices one by one, containers as they are."""
    from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, RangeSweep

    if isinstance(value, ChoiceSweep):
        for v in value.list:
            yield from _values(v)
    elif isinstance(value, (Glob, IntervalSweep, RangeSweep)):
        return
    else:
        yield value


def check_overrides(overrides: list[str]) -> None:
    """Refuse forbidden keys and values in command-line overrides (``key=value``, ``group=option``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:            # Hydra reports its own parse errors, with its own message
        parsed = None
    for i, line in enumerate(overrides):
        key, _, raw = line.partition("=")
        value = parsed[i]._value if parsed is not None else raw
        for v in _values(value):
            check_tree({key: v}, f"command-line override '{line}'")
        if "callbacks" in _segments(str(raw)) and "hydra" in _segments(key):
            raise SpecError(key, f"command-line override '{line}' selects Hydra callbacks.", fix=_FIX)


def check_files(root: Path, label: str) -> None:
    """Check every YAML file under ``root`` (``label`` names the source: ``conf/``, ``--config-dir``)."""
    import yaml

    for path in sorted(list(root.rglob("*.yaml")) + list(root.rglob("*.yml"))):
        rel = path.relative_to(root)
        where = f"{label} file {rel}"
        if "callbacks" in rel.parts[:-1]:
            raise SpecError(str(rel), f"{where} is a Hydra callbacks config, which would run code at startup.",
                            fix=_FIX)
        try:
            docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue             # Hydra reports unreadable configs when it loads them
        header = re.search(r"^#\s*@package\s+(\S+)", path.read_text(encoding="utf-8"), re.M)
        if header and "callbacks" in _segments(header.group(1)):
            raise SpecError(str(rel), f"{where} is packaged into Hydra callbacks ({header.group(0)}).", fix=_FIX)
        in_logging = any("logging" in p for p in rel.parts[:-1])
        for doc in docs:
            check_tree(doc, where, in_logging=in_logging)


def check_composed(config_dirs: list[str], config_name: str, overrides: list[str], multirun: bool) -> None:
    """Compose the primary config as Hydra will (nothing is instantiated) and check all of it, ``hydra`` included."""
    import os

    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from .paths import conf_dir
    from .spec import register_configs

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        first = [o.input_line if not o.is_sweep_override() else f"{o.get_key_element()}={o._value.list[0]}"
                 for o in parsed if not o.is_sweep_override() or isinstance(o._value, ChoiceSweep)]
        register_configs()
        search = create_config_search_path(str(conf_dir()))
        for config_dir in config_dirs:
            search.prepend(provider="command-line", path=f"file://{os.path.abspath(config_dir)}",
                           anchor=SearchPathQuery(provider="schema"))
        was = GlobalHydra.instance().is_initialized()
        hydra = Hydra.create_main_hydra2(task_name="reward_lens_spec_check", config_search_path=search)
        try:
            cfg = hydra.compose_config(config_name, first, run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN,
                                       with_log_configuration=False)
        finally:
            if not was:
                GlobalHydra.instance().clear()
        tree = OmegaConf.to_container(cfg, resolve=False)
    except SpecError:
        raise
    except Exception:            # composition errors are Hydra's to report, as before
        return
    hydra_node = tree.get("hydra", {}) or {}
    if hydra_node.get("callbacks"):
        raise SpecError("hydra.callbacks", "the composed config sets Hydra callbacks, which would run code at "
                        "startup.", fix=_FIX)
    check_tree({k: v for k, v in tree.items() if k != "hydra"}, "the composed config")
    own = ("callbacks", "searchpath", "runtime", "overrides")     # runtime/overrides: Hydra's own record
    check_tree({"hydra": {k: v for k, v in hydra_node.items() if k not in own}}, "the composed config")
    if hydra_node.get("searchpath"):
        raise SpecError("hydra.searchpath", "the composed config adds config search paths.",
                        fix="pass a config folder with --config-dir DIR instead.")
    setup = (hydra_node.get("launcher") or {}).get("setup")
    if setup and not any(o.lstrip("+~").startswith("hydra.launcher.setup") for o in overrides):
        raise SpecError("hydra.launcher.setup", "a config file sets shell lines the launcher would run "
                        f"({setup!r}).",
                        fix="remove them from the file; type them on the command line if you mean them.")


def check_argv(argv: list[str]) -> None:
    """Run every check above on the main app's command line (Hydra flags and overrides)."""
    from hydra._internal.utils import get_args_parser

    from .paths import conf_dir

    try:
        args, _ = get_args_parser().parse_known_args(argv)
    except SystemExit:           # Hydra prints its own usage error
        return
    if getattr(args, "experimental_rerun", None):
        raise SpecError("--experimental-rerun", "it unpickles a file, which can run any code.",
                        fix="rerun from the stored config_yaml of a run instead.")
    if args.config_path is not None:
        raise SpecError("--config-path", "replacing the project's config tree is not supported.",
                        fix="add your configs with --config-dir DIR (they are checked like the project's).")
    overrides = list(args.overrides or [])
    dirs = [args.config_dir] if args.config_dir is not None else []
    for o in [o for o in overrides if o.startswith("hydra.searchpath=")]:
        dirs += _search_dirs(o)
        overrides.remove(o)
    check_overrides(overrides)
    check_files(conf_dir(), "conf/")
    for d in dirs:
        if Path(d).is_dir():
            check_files(Path(d).resolve(), "config folder " + str(d))
    check_composed(dirs, args.config_name or "config", overrides, bool(args.multirun))


def _search_dirs(override: str) -> list[str]:
    """The folders of a ``hydra.searchpath=[...]`` override; ``SpecError`` for an entry that is not a
    local folder (``pkg://`` would import a Python module)."""
    entries = [e.strip().strip("'\"") for e in override.partition("=")[2].strip().strip("[]").split(",") if e.strip()]
    out = []
    for e in entries:
        path = e[len("file://"):] if e.startswith("file://") else e
        if "://" in path or not Path(path).is_dir():
            raise SpecError("hydra.searchpath", f"entry {e!r} is not a local config folder.",
                            fix="give folders (file://DIR or DIR), or use --config-dir DIR.")
        out.append(path)
    return out
