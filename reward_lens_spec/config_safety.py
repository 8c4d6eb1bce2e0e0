"""No foreign code from configs: what a config may make Hydra import, call, write or read, checked before Hydra runs.

Hydra acts on its ``hydra`` node: it instantiates ``hydra.callbacks`` and every ``_target_``, configures
logging from ``hydra.job_logging``/``hydra.hydra_logging`` (a ``FileHandler`` opens, with ``mode: w``
truncates, a file; ``ext://module.attr`` imports a module), exports ``hydra.job.env_set`` into the job's
environment (``PATH``, ``LD_PRELOAD``), creates ``hydra.run.dir``/``hydra.sweep.dir``, writes
``hydra.output_subdir`` and changes directory with ``hydra.job.chdir``. OmegaConf resolvers read the
world (``${oc.env:SECRET}`` reads the environment, ``${oc.decode:...}`` parses strings), and the resolved
config is stored as the run's provenance in a store that may be shared. So a config someone shared, or a
command line pasted from one, could run code, write files or leak secrets. This module refuses all of
that by ALLOWLIST, with one ``SpecError`` line naming the key (and the file), before Hydra composes for
real or instantiates anything.

**Which ``hydra.*`` keys a user may set** (from command-line overrides, ``--config-dir`` folders, an
``experiment``, a file given by path, a stored study, a sweeper's params; all the same rule,
``hydra_refusal``):

- ``hydra/launcher=basic|joblib|submitit_local|submitit_slurm|slurm`` (or a launcher option in the user's
  own ``hydra/launcher/`` folder, whose keys pass this same rule);
- the launcher's plain settings ``hydra.launcher.<key>`` for ``key`` in ``LAUNCHER_KEYS`` (``n_jobs``,
  ``timeout_min``, ``cpus_per_task``, ``mem_gb``, ``partition``, ...): a number, bool, null or one-line
  string without ``ext://`` or a resolver; ``hydra.launcher._target_`` only one of ``ALLOWED_TARGETS``;
  ``hydra.launcher.setup`` (shell lines a SLURM job runs) only typed on the command line;
- ``hydra.sweeper.params`` (each param is checked as the override it becomes) and
  ``hydra.sweeper.max_batch_size``;
- ``hydra.mode`` (``RUN``/``MULTIRUN``) and ``hydra.verbose``;
- ``hydra.searchpath`` only in the form the command line builds from ``--config-dir``
  (``overrides.prepare_overrides``: ``file://`` local folders, each checked like this);
- ``hydra.sweep.dir`` only typed on the command line, and only as a relative path inside the working
  directory (``hydra.sweep.dir=sw``); never from a file.

Everything else under ``hydra`` is refused: ``env_set``/``env_copy``, ``job_logging``/``hydra_logging``
(any handler, any choice of them), ``run.dir``, ``sweep.subdir``, ``callbacks``, ``job.chdir``,
``output_subdir``, ``help``, a choice of any other ``hydra/<group>``, a defaults entry or ``@package``
that moves a config into ``hydra`` or ``_global_``. The project's own tree (``conf/``) is trusted to set
what it sets (``output_subdir: null``, ``run.dir: .``, ``sweep.subdir: .``, ``hydra/job_logging: none``,
the ``slurm`` launcher's settings): the composed ``hydra`` node must equal the one composed from the
project's tree alone (``_baseline_hydra``), except where the allowlist accepts the difference.

**Resolvers and ``ext://``.** A value from any user source may use plain node interpolation
(``${model.name}``) but no resolver call (``${oc.env:...}``, ``${oc.decode:...}``, ``${now:...}``, any
``${name:...}``): ``SAFE_RESOLVERS`` is empty. Hydra's own ``${hydra:...}``/``${now:...}`` appear only in
Hydra's and the project's trusted nodes, which are compared, not resolved. ``ext://`` anywhere in a value
is refused. Refusing (not scrubbing) is how ``oc.env`` values are kept out of provenance: a config that
would resolve a secret never runs, so ``OmegaConf.to_yaml(cfg)`` in ``cli._run_task`` never sees one.

**``model.trust_remote_code``** is honoured only when the person at the keyboard types
``model.trust_remote_code=true``; a config file (a model YAML in ``conf/`` or a user folder, an experiment,
a file given by path) that sets it true is refused naming that key.

Also refused, as before: ``_target_`` outside ``ALLOWED_TARGETS``, a logging ``()`` factory or non-``logging``
class anywhere, ``--experimental-rerun`` (it unpickles a file) and ``--config-path`` (use ``--config-dir``).

Entry points: ``check_argv(argv)`` runs everything for the main app's command line (after
``overrides.prepare_overrides``): every YAML under ``conf/`` (``check_tree``) and the user's folders
(``check_files``), the overrides (``check_overrides``), then composes the config (nothing instantiated;
once per option a group sweep or the sweeper's params select) and runs ``check_composed_config`` on each.
``check_composed_config(tree, cli_overrides)`` is the part that needs a composed tree; another command
that composes on its own calls it right after composing (and ``check_overrides`` before).

Modules: ``config_rules`` (one key or value: ``check_tree``, ``check_values``, ``hydra_refusal``, the allowed
targets, launchers and launcher keys), ``config_sources`` (files, folders, one user tree, overrides:
``check_files``, ``check_user_tree``, ``check_overrides``), and this one (the composed config, the command line).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path, get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from .config_rules import FIX_CODE, FIX_HYDRA, TRUE_WORDS, check_tree, check_values, hydra_refusal, trust_error
from .config_sources import check_files, check_hydra_node, check_overrides, search_dirs
from .errors import SpecError
from .paths import conf_dir, user_dirs
from .spec import register_configs

_LAUNCHER_OF_TARGET = {
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher": "basic",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": "joblib",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "submitit_local",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "submitit_slurm",
}
_HYDRA_RECORD = {("job", "name"), ("job", "config_name"), ("job", "id"), ("job", "num"),
                 ("job", "override_dirname")}        # Hydra's record of the job (set by Hydra, not a source)
_MISSING = object()


def _typed_true(cli_overrides: list[str], key: str) -> bool:
    for line in cli_overrides:
        k, eq, v = line.partition("=")
        if eq and k.lstrip("+~") == key and any(x.strip().strip("'\"").lower() in TRUE_WORDS for x in v.split(",")):
            return True
    return False


# ----------------------------------------------------------------------------- the composed config

@lru_cache(maxsize=16)
def _baseline_hydra(launcher: str | None) -> dict | None:
    """The ``hydra`` node composed from the project's own tree alone (Hydra's defaults plus ``conf/``), with
    ``launcher`` chosen: what a user may not change except where the allowlist says."""
    register_configs()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf_dir())))
    try:
        cfg = loader.load_configuration("config", [f"hydra/launcher={launcher}"] if launcher else [],
                                        run_mode=RunMode.RUN, from_shell=True)
    except Exception:
        return None
    return OmegaConf.to_container(cfg.hydra, resolve=False)


def _leaves(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if path in (("sweeper", "params"), ("searchpath",)) or not isinstance(node, dict) or not node:
        yield path, node
        return
    for k, v in node.items():
        yield from _leaves(v, path + (str(k),))


def _check_hydra_composed(hydra_node: dict, cli_overrides: list[str]) -> None:
    """The composed ``hydra`` node equals the project's own (``_baseline_hydra``) except where the allowlist
    accepts the difference; each difference is named by its key."""
    where = "the composed config"
    target = (hydra_node.get("launcher") or {}).get("_target_")
    baseline = _baseline_hydra(_LAUNCHER_OF_TARGET.get(str(target)))
    if baseline is None:
        baseline = _baseline_hydra(None) or {}
    typed = {line.partition("=")[0].lstrip("+~") for line in cli_overrides if "=" in line}
    base = dict(_leaves(baseline))
    got = dict(_leaves(hydra_node))
    for path, value in got.items():
        if path[:1] in (("runtime",), ("overrides",)) or path[:2] in _HYDRA_RECORD:
            continue
        if base.get(path, _MISSING) == value:
            continue
        key = ".".join(("hydra",) + path)
        if path == ("sweeper", "params"):
            if value is not None:
                check_hydra_node(value, ("hydra", "sweeper", "params"), where, typed=False)
            continue
        if path == ("searchpath",):
            _check_composed_searchpath(value)
            continue
        reason = hydra_refusal(path, value, typed=key in typed)
        if reason:
            raise SpecError(key, f"{where} {reason}.", fix=FIX_HYDRA)
    for path in base:
        if path not in got and not any(p[:len(path)] == path for p in got) and path[:1] != ("runtime",):
            key = ".".join(("hydra",) + path)
            if hydra_refusal(path, None, typed=key in typed):
                raise SpecError(key, f"{where} removes Hydra's {key}.", fix=FIX_HYDRA)


def _check_composed_searchpath(entries: Any) -> None:
    """``hydra.searchpath`` as the command line builds it: ``file://`` local folders, each checked."""
    if not entries:
        return
    if not isinstance(entries, list):
        raise SpecError("hydra.searchpath", "the composed config has a search path that is not a list.",
                        fix="pass config folders with --config-dir DIR.")
    for e in entries:
        path = str(e)[len("file://"):] if str(e).startswith("file://") else str(e)
        if "://" in path or not Path(path).is_dir():
            raise SpecError("hydra.searchpath", f"entry {e!r} is not a local config folder (pkg:// would import a "
                            "Python module).", fix="give folders (file://DIR or DIR), or use --config-dir DIR.")
        check_files(Path(path).resolve(), "config folder " + path)


def check_composed_config(tree: dict, cli_overrides: list[str]) -> None:
    """Every check that needs the composed, UNRESOLVED config tree (``OmegaConf.to_container(cfg,
    resolve=False)``), with or without its ``hydra`` node; ``cli_overrides``: what the person typed (the
    overrides of the command line, as given to Hydra). ``SpecError`` (one line, naming the key) for:

    - names of code anywhere (``check_tree``: callbacks, foreign ``_target_``, factories, logging classes);
    - any resolver call or ``ext://`` in a value outside ``hydra`` (plain ``${a.b}`` is fine), so no
      ``${oc.env:...}`` ever reaches the stored provenance;
    - ``model.trust_remote_code`` true unless ``model.trust_remote_code=true`` is in ``cli_overrides``;
    - a ``hydra`` node that differs from the one the project's own tree composes to, where the allowlist
      (module docstring) does not accept the difference; its search path folders are checked file by file;
    - the user's config folders (``paths.user_dirs()``) file by file (cached while unchanged).

    Call it right after composing, before anything reads the config; it composes nothing of the user's (it
    composes the project's own tree once per launcher, cached, for the comparison)."""
    for d in user_dirs():
        if Path(d).is_dir():
            check_files(Path(d).resolve(), "config folder " + str(d))
    tree = tree or {}
    hydra_node = tree.get("hydra") or {}
    body = {k: v for k, v in tree.items() if k != "hydra"}
    check_tree(body, "the composed config")
    check_values(body, "", "the composed config")
    if hydra_node:
        if hydra_node.get("callbacks"):
            raise SpecError("hydra.callbacks", "the composed config sets Hydra callbacks, which would run code at "
                            "startup.", fix=FIX_CODE)
        own = ("callbacks", "searchpath", "runtime", "overrides")     # runtime/overrides: Hydra's own record
        check_tree({"hydra": {k: v for k, v in hydra_node.items() if k not in own}}, "the composed config")
        _check_hydra_composed(hydra_node, cli_overrides)
    model = body.get("model")
    trust = model.get("trust_remote_code") if isinstance(model, dict) else None
    if trust not in (None, False) and str(trust).strip().lower() not in ("false", "no", "off", "0") \
            and not _typed_true(cli_overrides, "model.trust_remote_code"):
        choices = ((hydra_node.get("runtime") or {}).get("choices") or {})
        picked = ", ".join(f"{g}={choices[g]}" for g in ("model", "experiment") if choices.get(g))
        raise trust_error(f"the composed config ({picked})" if picked else "a config file")


def check_composed(config_dirs: list[str], config_name: str, overrides: list[str], multirun: bool) -> None:
    """Compose the config as Hydra will (nothing is instantiated), ``hydra`` included, and run
    ``check_composed_config`` on it: once with every sweep at its first value, then once more for each other
    option a group sweep (``model=a,b``, ``model=glob(*)``) or the sweeper's params select."""
    search = [f"hydra.searchpath=[{','.join('file://' + os.path.abspath(d) for d in config_dirs)}]"] \
        if config_dirs else []
    cli = list(overrides) + search
    mode = RunMode.MULTIRUN if multirun or any(o.lstrip("+") == "hydra.mode=MULTIRUN" for o in overrides) \
        else RunMode.RUN
    try:
        register_configs()
        loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf_dir())))
        parser = OverridesParser.create(config_loader=loader)
        base, sweeps = _first_and_options(parser.parse_overrides(overrides), loader)
    except SpecError:
        raise
    except Exception:            # parse errors are Hydra's to report, as before
        return

    def compose(lines: list[str]) -> dict | None:
        try:
            cfg = loader.load_configuration(config_name, lines + search, run_mode=mode, from_shell=True)
        except Exception:        # composition errors are Hydra's to report, as before
            return None
        return OmegaConf.to_container(cfg, resolve=False)

    tree = compose(base)
    if tree is None:
        return
    check_composed_config(tree, cli)
    params = ((tree.get("hydra") or {}).get("sweeper") or {}).get("params") if mode == RunMode.MULTIRUN else None
    if isinstance(params, dict):
        typed_keys = {line.partition("=")[0].lstrip("+~") for line in overrides}
        extra = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in params.items()
                 if k not in typed_keys]
        try:
            more_base, more = _first_and_options(parser.parse_overrides(extra), loader)
        except Exception:
            more_base, more = [], []
        sweeps += [(len(base) + i, opts) for i, opts in more]
        base = base + more_base
        if more_base:
            tree = compose(base)
            if tree is not None:
                check_composed_config(tree, cli)
    seen = set()
    for i, options in sweeps:
        for opt in options:
            variant = base[:i] + [opt] + base[i + 1:]
            if tuple(variant) in seen:
                continue
            seen.add(tuple(variant))
            tree = compose(variant)
            if tree is not None:
                check_composed_config(tree, cli)


def _first_and_options(parsed: list, loader: Any) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """``(overrides with each discrete sweep at its first value, [(index, other values of a group sweep)])``;
    interval sweeps (numbers) are left out."""
    base: list[str] = []
    sweeps: list[tuple[int, list[str]]] = []
    for o in parsed:
        if not o.is_sweep_override():
            base.append(o.input_line)
            continue
        if not o.is_discrete_sweep():
            continue
        o.config_loader = loader
        key = o.get_key_element()
        try:
            vals = [f"{key}={v}" for v in o.sweep_string_iterator()]
        except Exception:
            continue
        if not vals:
            continue
        base.append(vals[0])
        if "." not in o.key_or_group:                   # a config group: its options are other files
            sweeps.append((len(base) - 1, vals[1:]))
    return base, sweeps


def check_argv(argv: list[str]) -> None:
    """Run every check above on the main app's command line (Hydra flags and overrides, after
    ``overrides.prepare_overrides``): flags, ``conf/`` and the user's folders file by file, the overrides,
    then the composed config (``check_composed``). ``SpecError`` with one line naming the key."""
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
    for o in [o for o in overrides if o.lstrip("+").startswith("hydra.searchpath=")]:
        dirs += search_dirs(o)
        overrides.remove(o)
    check_files(conf_dir(), "conf/", trusted=True)
    for d in dirs:
        if Path(d).is_dir():
            check_files(Path(d).resolve(), "config folder " + str(d))
    check_overrides(overrides, config_dirs=[Path(d) for d in dirs])
    check_composed(dirs, args.config_name or "config", overrides, bool(args.multirun))
