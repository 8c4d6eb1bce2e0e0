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
``_hydra_refusal``):

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
project's tree alone (``_baseline``), except where the allowlist accepts the difference.

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
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from .errors import SpecError
import os
import yaml
from .paths import conf_dir, user_dirs
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path, get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, QuotedString, RangeSweep
from hydra.types import RunMode
from omegaconf import OmegaConf, grammar_parser
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as P
from .spec import register_configs

ALLOWED_TARGETS = frozenset({
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
})
_LAUNCHER_OF_TARGET = {
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher": "basic",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": "joblib",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "submitit_local",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "submitit_slurm",
}
ALLOWED_FACTORIES = frozenset({"colorlog.ColoredFormatter"})     # Hydra's colorlog logging plugin
LAUNCHERS = ("basic", "joblib", "submitit_local", "submitit_slurm", "slurm")
LAUNCHER_KEYS = frozenset({
    # joblib (not temp_folder: a folder it writes)
    "n_jobs", "backend", "prefer", "require", "verbose", "timeout", "pre_dispatch", "batch_size", "max_nbytes",
    "mmap_mode",
    # submitit local and slurm (not submitit_folder, additional_parameters, srun_args, setup)
    "timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name",
    "stderr_to_stdout", "partition", "qos", "comment", "constraint", "exclude", "gres", "cpus_per_gpu",
    "gpus_per_task", "mem_per_gpu", "mem_per_cpu", "account", "signal_delay_s", "max_num_timeout",
    "array_parallelism",
})
SAFE_RESOLVERS: frozenset[str] = frozenset()          # user sources: plain ${a.b} node interpolation only
TRUSTED_RESOLVERS = frozenset({"hydra", "now"})       # Hydra's own config and the project's conf/ only
_HYDRA_RECORD = {("job", "name"), ("job", "config_name"), ("job", "id"), ("job", "num"),
                 ("job", "override_dirname")}        # Hydra's record of the job (set by Hydra, not a source)
TRUE_WORDS = {"true", "yes", "on", "1"}
_FIX = "remove it; this project runs no code named by a config (see docs/studies.md, 'Security')."
_FIX_HYDRA = "remove it; a config or override may set only the hydra keys docs/studies.md, 'Security', lists."
_WHY = {
    "env_set": "sets environment variables of the job (a PATH or LD_PRELOAD picks the programs it runs)",
    "env_copy": "copies environment variables into the job",
    "job_logging": "configures logging (a handler opens or truncates files; ext:// imports a module)",
    "hydra_logging": "configures logging (a handler opens or truncates files; ext:// imports a module)",
    "run": "makes Hydra create that folder",
    "sweep": "makes Hydra create that folder",
    "callbacks": "names code Hydra runs at startup",
    "chdir": "changes the working directory of the job",
    "output_subdir": "makes Hydra write a copy of the config there",
    "searchpath": "adds a config search path (pkg:// imports a Python module)",
    "launcher": "is not a launcher setting this project accepts (plain settings: "
                + ", ".join(sorted(LAUNCHER_KEYS)) + ")",
}
_MISSING = object()


def _segments(key: str) -> list[str]:
    return [s for s in re.split(r"[./\s:=]+", str(key).lstrip("+~")) if s]


# ----------------------------------------------------------------------------- names of code (as before)

def check_tree(node: Any, where: str, path: tuple[str, ...] = (), in_logging: bool = False) -> None:
    """Refuse callbacks, foreign ``_target_``, ``()`` factories, non-``logging`` classes and search paths in a
    config tree (dicts/lists as parsed from YAML or an override); ``where`` names the source for the error.
    (The ``hydra`` allowlist and the value rules are separate: ``check_user_tree``.)"""
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


# ----------------------------------------------------------------------------- values: resolvers, ext://

def _resolvers(text: str) -> list[str]:
    """Names of the resolvers an OmegaConf string calls (``[]`` for plain text or ``${a.b}``); a string with
    ``${`` that OmegaConf cannot parse gives ``['<unparsable interpolation>']``."""
    if "${" not in text:
        return []
    try:
        tree = grammar_parser.parse(text)
    except Exception:
        return ["<unparsable interpolation>"]
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, P.InterpolationResolverContext):
            out.append(node.resolverName().getText())
        for child in (node.getChildren() if hasattr(node, "getChildren") else ()):
            walk(child)

    walk(tree)
    return out


def _value_refusal(text: str, allowed: frozenset[str] = SAFE_RESOLVERS) -> str | None:
    if "ext://" in text:
        return "has an ext:// value, which would import a Python module"
    bad = [r for r in _resolvers(text) if r not in allowed]
    if bad:
        return (f"calls the resolver '{bad[0]}' (${{{bad[0]}:...}}); a config may use only plain ${{a.b}} "
                "interpolation, so nothing is read from the environment, decoded or stored unseen")
    return None


def check_values(node: Any, key: str, where: str, allowed: frozenset[str] = SAFE_RESOLVERS) -> None:
    """Refuse ``ext://`` and any resolver outside ``allowed`` in every string of ``node`` (at ``key``)."""
    if isinstance(node, dict):
        for k, v in node.items():
            check_values(v, f"{key}.{k}" if key else str(k), where, allowed)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            check_values(v, f"{key}.{i}" if key else str(i), where, allowed)
    elif isinstance(node, str):
        reason = _value_refusal(node, allowed)
        if reason:
            raise SpecError(key or "value", f"{where} {reason}.",
                            fix="write the value itself (no ${name:...}, no ext://).")


def _plain_refusal(value: Any) -> str | None:
    """``None`` for a value a launcher setting may take: a number, bool, null, or one-line string without
    ``ext://`` or a resolver."""
    if value is None or isinstance(value, (bool, int, float)):
        return None
    if isinstance(value, str):
        if any(ord(c) < 32 for c in value):
            return "is a string with control characters (a new line would add a line to a job script)"
        return _value_refusal(value)
    return "must be a plain value (a number, bool, null or one-line string)"


# ----------------------------------------------------------------------------- the hydra allowlist

def _hydra_refusal(rest: tuple[str, ...], value: Any, typed: bool) -> str | None:
    """Why ``hydra.<rest>`` may not be set to ``value`` from this source (``typed``: the person typed it on the
    command line), or ``None`` when the allowlist accepts it. The one rule for every source."""
    if not rest:
        return "replaces Hydra's whole config"
    head = rest[0]
    if head == "launcher" and len(rest) == 2:
        key = rest[1]
        if key == "_target_":
            return None if str(value) in ALLOWED_TARGETS else f"names _target_ {value!r}, which Hydra would import"
        if key in LAUNCHER_KEYS:
            return _plain_refusal(value)
        if key == "setup":
            if typed or not value:
                return None
            return (f"sets shell lines the launcher would run ({value!r}); type them on the command line if you "
                    "mean them")
        return _WHY["launcher"]
    if head == "sweeper" and len(rest) == 2:
        if rest[1] == "_target_":
            return None if str(value) == "hydra._internal.core_plugins.basic_sweeper.BasicSweeper" else \
                f"names sweeper _target_ {value!r}; only Hydra's basic sweeper is allowed"
        if rest[1] == "max_batch_size":
            return None if value is None or (isinstance(value, int) and not isinstance(value, bool)) else \
                "must be an integer or null"
    if rest == ("mode",):
        return None if value is None or str(getattr(value, "name", value)) in ("RUN", "MULTIRUN") else \
            "must be RUN or MULTIRUN"
    if rest == ("verbose",):
        vals = value if isinstance(value, (list, tuple)) else [value]
        return next((r for r in map(_plain_refusal, vals) if r), None)
    if rest == ("sweep", "dir"):
        if not typed:
            return ("makes Hydra create that folder; only a relative hydra.sweep.dir typed on the command line "
                    "is accepted")
        text = str(value)
        if (not isinstance(value, str) or not text or Path(text).is_absolute() or text.startswith("~")
                or ".." in Path(text).parts or _plain_refusal(value)):
            return "must be a relative folder inside the working directory (no /, ~, .., ${...})"
        return None
    return next((_WHY[s] for s in reversed(rest) if s in _WHY), "is not a Hydra key this project accepts")


def _split_key(key: Any) -> tuple[str, ...]:
    return tuple(s for s in str(key).split(".") if s)


def _check_hydra_node(node: Any, path: tuple[str, ...], where: str, typed: bool, field: str | None = None) -> None:
    """Apply ``_hydra_refusal`` to every leaf of ``node`` set at ``path`` (which starts with ``hydra``);
    sweeper params are checked as the overrides they become."""
    if path[:3] == ("hydra", "sweeper", "params"):
        if len(path) > 3:
            _check_sweeper_params({".".join(path[3:]): node}, where)
        elif node is not None:
            if not isinstance(node, dict):
                raise SpecError("hydra.sweeper.params", f"{where} sets sweeper params that are not a mapping.",
                                fix="give key: value sweeps, e.g. model: a,b")
            _check_sweeper_params(node, where)
        return
    if isinstance(node, dict):
        for k, v in node.items():
            _check_hydra_node(v, path + _split_key(k), where, typed, field)
        return
    reason = _hydra_refusal(path[1:], node, typed)
    if reason:
        raise SpecError(field or ".".join(path), f"{where} {reason}.", fix=_FIX_HYDRA)


def _check_sweeper_params(params: dict, where: str) -> None:
    for k, v in params.items():
        value = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        _check_override_list([f"{k}={value}"], typed=False, where=f"{where} (sweeper param '{k}')")


def _check_defaults(defaults: Any, where: str, group: str) -> None:
    """A user file's defaults list may select configs of its own groups and a launcher, nothing else of Hydra's,
    and may not move a config into the ``hydra`` or ``_global_`` package."""
    if not isinstance(defaults, list):
        return
    for entry in defaults:
        if isinstance(entry, dict) and len(entry) == 1:
            (key, option), = entry.items()
        elif isinstance(entry, str):
            key, option = entry, None
        else:
            continue
        key = re.sub(r"^\s*((override|optional)\s+)+", "", str(key)).strip()
        if key == "_self_":
            continue
        path, _, package = key.partition("@")
        if package and any(s in package for s in ("hydra", "_global_", "_here_")):
            raise SpecError("defaults", f"{where} puts a config into package '{package}' ({key}), which could set "
                            "Hydra's own keys.", fix="drop the @package; configs go to their own group.")
        full = path.strip("/") if path.startswith("/") or not group else f"{group}/{path}"
        segs = [s for s in full.split("/") if s]
        if not segs or segs[0] != "hydra":
            continue
        names = option if isinstance(option, (list, tuple)) else [option]
        if segs == ["hydra", "launcher"] and all(isinstance(n, str) and re.fullmatch(r"[\w\-]+", n) for n in names):
            continue
        if segs[:2] == ["hydra", "launcher"] and len(segs) == 3 and option is None:
            continue
        chosen = "/".join(segs[:2])
        raise SpecError(chosen, f"{where} selects {key}: {option} in its defaults list; a config may choose only "
                        f"hydra/launcher ({', '.join(LAUNCHERS)}).", fix=_FIX_HYDRA)


def _package(rel: Path, text: str) -> tuple[str, ...]:
    """The package a config file's keys land in: its ``# @package`` header, else its group folder."""
    group = tuple(rel.parts[:-1])
    header = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
    if not header:
        return tuple(p for g in group for p in g.split("."))
    out: list[str] = []
    for seg in header.group(1).split("."):
        if seg == "_global_":
            continue
        out += list(group) if seg == "_group_" else [rel.stem] if seg == "_name_" else [seg]
    return tuple(out)


def check_user_tree(tree: Any, where: str, package: tuple[str, ...] = (), group: str = "") -> None:
    """Every rule for one config a user supplied (a file of a config folder, a file given by path, a stored
    study): names of code (``check_tree``), the defaults list, the ``hydra`` allowlist for keys that land under
    ``hydra`` (``package``: where the file's keys land), and the value rules (no resolver, no ``ext://``)."""
    check_tree(tree, where)
    if not isinstance(tree, dict):
        check_values(tree, ".".join(package), where)
        return
    _check_defaults(tree.get("defaults"), where, group)
    body = {k: v for k, v in tree.items() if k != "defaults"}
    if package and package[0] == "hydra":
        _check_hydra_node(body, package, where, typed=False)
    elif not package and "hydra" in body:
        _check_hydra_node(body["hydra"], ("hydra",), where, typed=False)
    check_values(body, ".".join(package), where)


def _file_signature(root: Path) -> tuple:
    files = sorted(list(root.rglob("*.yaml")) + list(root.rglob("*.yml")))
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)


_CHECKED: dict[tuple[str, bool], tuple] = {}


def check_files(root: Path, label: str, trusted: bool = False) -> None:
    """Check every YAML file under ``root`` (``label`` names the source: ``conf/``, ``--config-dir``): names of
    code for all; for a user's folder (not ``trusted``) also the ``hydra`` allowlist (through each file's
    package), its defaults list and the value rules. A folder checked unchanged before is not read again."""
    root = Path(root)
    try:
        sig = _file_signature(root)
    except OSError:
        sig = None
    if sig is not None and _CHECKED.get((str(root), trusted)) == sig:
        return
    for path in sorted(list(root.rglob("*.yaml")) + list(root.rglob("*.yml"))):
        rel = path.relative_to(root)
        where = f"{label} file {rel}"
        if "callbacks" in rel.parts[:-1]:
            raise SpecError(str(rel), f"{where} is a Hydra callbacks config, which would run code at startup.",
                            fix=_FIX)
        try:
            text = path.read_text(encoding="utf-8")
            docs = list(yaml.safe_load_all(text))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue             # Hydra reports unreadable configs when it loads them
        header = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
        if header and "callbacks" in _segments(header.group(1)):
            raise SpecError(str(rel), f"{where} is packaged into Hydra callbacks ({header.group(0)}).", fix=_FIX)
        in_logging = any("logging" in p for p in rel.parts[:-1])
        for doc in docs:
            check_tree(doc, where, in_logging=in_logging)
            if not trusted:
                check_user_tree(doc, where, _package(rel, text), "/".join(rel.parts[:-1]))
    if sig is not None:
        _CHECKED[(str(root), trusted)] = sig


# ----------------------------------------------------------------------------- overrides

def _norm(value: Any) -> Any:
    if isinstance(value, QuotedString):
        return value.text
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    return value


def override_values(value: Any) -> Iterator[Any]:
    """Every value an override can take: sweep choices one by one, glob patterns, containers as they are."""
    if isinstance(value, ChoiceSweep):
        for v in value.list:
            yield from override_values(v)
    elif isinstance(value, Glob):
        yield from list(value.include) + list(value.exclude)
    elif isinstance(value, (IntervalSweep, RangeSweep)):
        return
    else:
        yield _norm(value)


def _launcher_option_ok(name: Any, config_dirs: list) -> bool:
    if not isinstance(name, str) or not re.fullmatch(r"[\w\-]+", name):
        return False
    return name in LAUNCHERS or any((Path(d) / "hydra" / "launcher" / f"{name}.yaml").is_file() for d in config_dirs)


def _check_override_list(overrides: list[str], typed: bool, where: str | None = None,
                         config_dirs: list | None = None) -> None:
    dirs = list(user_dirs()) if config_dirs is None else list(config_dirs)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:            # Hydra reports its own parse errors; the raw text is still checked
        parsed = None
    for i, line in enumerate(overrides):
        src = where or f"command-line override '{line}'"
        key_typed, _, raw = line.partition("=")
        o = parsed[i] if parsed is not None else None
        key = o.key_or_group if o is not None else key_typed.lstrip("+~").partition("@")[0]
        package = o.package if o is not None else key_typed.partition("@")[2] or None
        if key == "hydra.searchpath":
            if not typed:
                raise SpecError(key, f"{src} adds a config search path.", fix="pass --config-dir DIR instead.")
            for d in _search_dirs(line):
                check_files(Path(d).resolve(), "config folder " + d)
            continue
        values = list(override_values(o._value)) if o is not None else [raw]
        if o is not None and o.is_delete():
            values = [None]
        for v in values:
            check_tree({key_typed: v}, src)
        if "callbacks" in _segments(str(raw)) and "hydra" in _segments(key):
            raise SpecError(key, f"{src} selects Hydra callbacks.", fix=_FIX)
        if package and any(s in package for s in ("hydra", "_global_", "_here_")):
            raise SpecError(key_typed, f"{src} puts a config into package '{package}', which could set Hydra's "
                            "own keys.", fix="drop the @package.")
        segs = key.split("/")
        if len(segs) > 1 and segs[0] == "hydra":
            if key == "hydra/launcher" and all(_launcher_option_ok(v, dirs) for v in values):
                pass
            elif key == "hydra/launcher":
                bad = next(v for v in values if not _launcher_option_ok(v, dirs))
                raise SpecError(key, f"{src} chooses launcher {bad!r}.", value=str(bad), options=LAUNCHERS,
                                fix="choose one of these (or a launcher file of your --config-dir's hydra/launcher/).")
            else:
                raise SpecError(key, f"{src} chooses a Hydra config group this project does not accept; only "
                                f"hydra/launcher ({', '.join(LAUNCHERS)}).", fix=_FIX_HYDRA)
        elif _split_key(key)[:1] == ("hydra",):
            for v in values:
                _check_hydra_node(v, _split_key(key), src, typed)
        for v in values:
            check_values(v, key, src)
        if o is None:
            check_values(raw, key, src)
        if key in ("model.trust_remote_code",) and not typed:
            if any(str(v).strip().lower() in TRUE_WORDS for v in values):
                raise _trust_error(src)


def check_overrides(overrides: list[str], config_dirs: list | None = None) -> None:
    """Refuse forbidden keys and values in command-line overrides (``key=value``, ``group=option``, sweeps
    value by value): names of code (``check_tree``), the ``hydra`` allowlist (typed on the command line, so
    ``hydra.launcher.setup`` and a relative ``hydra.sweep.dir`` pass), resolvers and ``ext://``.
    ``config_dirs``: the user's config folders (default ``paths.user_dirs()``), where a launcher option of
    their own may live."""
    _check_override_list(list(overrides), typed=True, config_dirs=config_dirs)


def _typed_true(cli_overrides: list[str], key: str) -> bool:
    for line in cli_overrides:
        k, eq, v = line.partition("=")
        if eq and k.lstrip("+~") == key and any(x.strip().strip("'\"").lower() in TRUE_WORDS for x in v.split(",")):
            return True
    return False


def _trust_error(where: str) -> SpecError:
    return SpecError("model.trust_remote_code", f"{where} sets it true, which would run the checkpoint's own "
                     "Python; only the person at the keyboard may allow that.",
                     fix="type model.trust_remote_code=true on the command line if you trust this checkpoint's code.")


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
                _check_hydra_node(value, ("hydra", "sweeper", "params"), where, typed=False)
            continue
        if path == ("searchpath",):
            _check_composed_searchpath(value)
            continue
        reason = _hydra_refusal(path, value, typed=key in typed)
        if reason:
            raise SpecError(key, f"{where} {reason}.", fix=_FIX_HYDRA)
    for path in base:
        if path not in got and not any(p[:len(path)] == path for p in got) and path[:1] != ("runtime",):
            key = ".".join(("hydra",) + path)
            if _hydra_refusal(path, None, typed=key in typed):
                raise SpecError(key, f"{where} removes Hydra's {key}.", fix=_FIX_HYDRA)


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
                            "startup.", fix=_FIX)
        own = ("callbacks", "searchpath", "runtime", "overrides")     # runtime/overrides: Hydra's own record
        check_tree({"hydra": {k: v for k, v in hydra_node.items() if k not in own}}, "the composed config")
        _check_hydra_composed(hydra_node, cli_overrides)
    model = body.get("model")
    trust = model.get("trust_remote_code") if isinstance(model, dict) else None
    if trust not in (None, False) and str(trust).strip().lower() not in ("false", "no", "off", "0") \
            and not _typed_true(cli_overrides, "model.trust_remote_code"):
        choices = ((hydra_node.get("runtime") or {}).get("choices") or {})
        picked = ", ".join(f"{g}={choices[g]}" for g in ("model", "experiment") if choices.get(g))
        raise _trust_error(f"the composed config ({picked})" if picked else "a config file")


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
        dirs += _search_dirs(o)
        overrides.remove(o)
    check_files(conf_dir(), "conf/", trusted=True)
    for d in dirs:
        if Path(d).is_dir():
            check_files(Path(d).resolve(), "config folder " + str(d))
    check_overrides(overrides, config_dirs=[Path(d) for d in dirs])
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
