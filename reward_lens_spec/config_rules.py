"""The rules of ``config_safety`` that read one key or value: names of code (``check_tree``), values (no resolver
call, no ``ext://``: ``check_values``), the ``hydra`` allowlist for one key (``hydra_refusal``), and the constants
they allow (``ALLOWED_TARGETS``, ``LAUNCHERS``, ``LAUNCHER_KEYS``). Every refusal is a ``SpecError`` naming the key;
which sources these rules are applied to is ``config_sources`` (files, folders, overrides) and ``config_safety``
(the composed config, the command line)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import grammar_parser
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as P

from .errors import SpecError

ALLOWED_TARGETS = frozenset({
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
})
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
TRUE_WORDS = {"true", "yes", "on", "1"}
FIX_CODE = "remove it; this project runs no code named by a config (see docs/studies.md, 'Security')."
FIX_HYDRA = "remove it; a config or override may set only the hydra keys docs/studies.md, 'Security', lists."
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


def key_segments(key: str) -> list[str]:
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
            segs = key_segments(key)
            last = segs[-1] if segs else key
            logging_here = in_logging or any("logging" in s for s in segs)
            if "callbacks" in segs:
                raise SpecError(full, f"{where} sets Hydra callbacks, which would run code at startup.", fix=FIX_CODE)
            if "searchpath" in segs:
                raise SpecError(full, f"{where} adds a config search path (a source of configs and modules).",
                                fix="pass a config folder with --config-dir DIR instead.")
            if last == "_target_" and str(v) not in ALLOWED_TARGETS:
                raise SpecError(full, f"{where} names _target_ {v!r}, which Hydra would import and call; only the "
                                f"launchers this project supports are allowed ({', '.join(sorted(ALLOWED_TARGETS))}).",
                                fix=FIX_CODE)
            if last == "()" and str(v) not in ALLOWED_FACTORIES:
                raise SpecError(full, f"{where} names a factory {v!r} that logging would call.", fix=FIX_CODE)
            if last == "class" and logging_here and not str(v).startswith("logging."):
                raise SpecError(full, f"{where} names logging class {v!r} outside the logging package.", fix=FIX_CODE)
            check_tree(v, where, path + (key,), logging_here)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            if isinstance(v, str) and "callbacks" in key_segments(v.replace("override ", "")):
                raise SpecError(".".join(path) or "defaults", f"{where} selects Hydra callbacks ({v!r}).", fix=FIX_CODE)
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

def hydra_refusal(rest: tuple[str, ...], value: Any, typed: bool) -> str | None:
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


def split_key(key: Any) -> tuple[str, ...]:
    return tuple(s for s in str(key).split(".") if s)


def trust_error(where: str) -> SpecError:
    return SpecError("model.trust_remote_code", f"{where} sets it true, which would run the checkpoint's own "
                     "Python; only the person at the keyboard may allow that.",
                     fix="type model.trust_remote_code=true on the command line if you trust this checkpoint's code.")
