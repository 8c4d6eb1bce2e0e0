"""Command-line overrides: a user's config folders and files, then checks before Hydra composes.

``prepare_overrides`` turns what a user types into what Hydra composes: ``--config-dir DIR`` and
``hydra.searchpath=[...]`` become the user's config folders (``paths.add_user_dirs``) and one
``hydra.searchpath`` override; ``group=path/to/file.yaml`` registers that file as an option of the
group; ``dataset.fields.<name>=<key>`` adds a mapping entry (no ``+`` needed); ``model.checkpoints=...``
replaces the chosen option's sequence (a list over ``tiny_checkpoints``' ``{folder, steps}``, as its Fix says);
``-m`` / ``--multirun`` typed after an override moves ahead of the overrides (Hydra's parser takes it there only). ``precheck_overrides``
then checks ``group=option`` and ``group.key=value`` against the folders and schemas, so a typo gets
"did you mean" and a non-zero exit instead of Hydra's traceback; shared by the main app and ``fit``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path

from .errors import SpecError
from .paths import add_user_dirs, find_config, group_options, is_yaml_path, shadowed, user_dirs
from .spec import GROUP_SCHEMAS
from dataclasses import fields
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from .config_sources import check_user_tree
from .models.door import admit, grants
from .spec import group_config, validate

GROUPS = ("model", "dataset", "observable", "frame", "store", "experiment")
FILE_GROUPS = ("model", "dataset", "observable", "frame", "store")     # accept group=path/to/file.yaml
NAMED = ("model", "dataset", "observable")                               # a file without name: takes its stem
EXTRA = "pip install 'reward_lens_spec[full]'"
LAUNCHER_PLUGINS = {"joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
                    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
                    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
                    "slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher")}
REGISTERED: dict[str, dict[str, str]] = {}      # group -> {option: file} registered in this process


def _split_list(value: str) -> list[str]:
    return [v.strip().strip("'\"") for v in value.strip().strip("[]").split(",") if v.strip()]


def _take_config_dirs(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``(argv without them, user folders, other searchpath entries such as pkg://)``."""
    rest, dirs, other = [], [], []
    it = iter(argv)
    for arg in it:
        if arg in ("--config-dir", "-cd"):
            val = next(it, None)
            if val is None:
                raise SpecError("--config-dir", "needs a folder.", fix="reward-lens-spec --config-dir ./conf ...")
            dirs.append(val)
        elif arg.startswith("--config-dir="):
            dirs.append(arg.partition("=")[2])
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            for entry in _split_list(arg.partition("=")[2]):
                if entry.startswith("file://"):
                    dirs.append(entry[len("file://"):])
                elif "://" in entry:
                    other.append(entry)
                else:
                    dirs.append(entry)
        else:
            rest.append(arg)
    for d in dirs:
        if not Path(d).expanduser().is_dir():
            raise SpecError("--config-dir", f"{d!r} is not a folder.", value=d,
                            fix="give a folder holding observable/, model/, dataset/ ... sub-folders of YAML files.")
    return rest, dirs, other


def use_config_dirs(argv: list[str]) -> tuple[list[str], list[str]]:
    """Take the config-folder arguments out of ``argv`` and add them to the user's folders; return
    ``(argv, other searchpath entries)``. ``SpecError`` for a file that a built-in option would shadow."""
    argv, dirs, other = _take_config_dirs(argv)
    if dirs:
        add_user_dirs(dirs)
    clash = shadowed(user_dirs())
    if clash:
        raise SpecError("--config-dir", f"{clash[0]} has the name of a built-in option, which would be used instead.",
                        fix="rename your file (e.g. my_" + clash[0].name + ") and select it by that name.")
    return argv, other


def _register_file(group: str, value: str) -> str:
    """Put the YAML file ``value`` in Hydra's ConfigStore as an option of ``group``; return its name."""
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise SpecError(group, f"no {group} file {value!r} (looked at {path}).",
                        fix=f"give the path of an existing {group} YAML, or an option name "
                            "(`reward-lens-spec help` lists them).")
    node = OmegaConf.load(path)
    check_user_tree(OmegaConf.to_container(node, resolve=False), f"file {path}", (group,), group)
    if group in NAMED and "name" not in node:
        node.name = path.stem
    name, seen = path.stem, REGISTERED.setdefault(group, {})
    if name in group_options(group) or seen.get(name, str(path)) != str(path):   # never shadow another option
        name = f"{path.stem}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    ConfigStore.instance().store(group=group, name=name, node=node, provider="reward_lens_spec user file")
    seen[name] = str(path)
    return name


def _unnamed(group: str, option: str) -> bool:
    """The option's YAML (in a config folder) has no ``name:`` key, so the schema default would name it."""
    path = find_config(group, option)
    return path is not None and "name" not in OmegaConf.load(path)


def _check_launcher(value: str) -> None:
    plugin = LAUNCHER_PLUGINS.get(value)
    if plugin is None:
        return
    try:
        found = importlib.util.find_spec(plugin[0]) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise SpecError("hydra/launcher", f"launcher '{value}' needs the {plugin[1]} plugin, which is not installed.",
                        fix=EXTRA)


def _check_file(group: str, option: str, typed: list[str]) -> None:
    """A chosen option's YAML fits its group's schema (user files and built-ins alike); ``SpecError``
    naming the key, with "did you mean", instead of Hydra's composition traceback. A model file goes
    through the model door (``models.door.admit``) with what the person ``typed``."""
    if group not in GROUP_SCHEMAS:
        return
    path = REGISTERED.get(group, {}).get(option) or find_config(group, option)
    if path is None:
        return
    if group == "model":
        admit(str(path), group, granted=grants(typed))
    else:
        group_config(group, str(path), key=group)


def prepare_overrides(argv: list[str]) -> list[str]:
    """Rewrite a user's command line for Hydra (see the module docstring); ``SpecError`` for a missing
    folder or file."""
    argv, other = use_config_dirs(argv)
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key in FILE_GROUPS and any(is_yaml_path(v) for v in value.split(",")):
            arg = f"{key}=" + ",".join(_register_file(key, v) if is_yaml_path(v) else v for v in value.split(","))
        elif eq and key in NAMED and not any(a.lstrip("+").startswith(f"{key}.name=") for a in argv):
            unnamed = [v for v in value.split(",") if _unnamed(key, v)]
            if unnamed and "," in value:
                raise SpecError(key, f"{find_config(key, unnamed[0])} has no 'name:' and is swept with others.",
                                fix=f"add 'name: {Path(unnamed[0]).name}' to that file.")
            if unnamed:                                  # a user's file without name: is named after its stem
                out += [arg, f"{key}.name={Path(value).name}"]
                continue
        elif eq and key.startswith("dataset.fields."):
            arg = "++" + arg                    # add or set one mapping entry
        elif eq and key == "model.checkpoints" and value.strip() not in ("", "null"):
            out.append("model.checkpoints=null")    # replace the option's sequence: a list over a mapping, or back
        elif eq and key.lstrip("+") == "hydra/launcher":
            for v in value.split(","):
                _check_launcher(v)
        out.append(arg)
    entries = [f"file://{d}" for d in user_dirs()] + other
    if entries:
        out.append(f"hydra.searchpath=[{','.join(entries)}]")
    flags = [a for a in out if a in MULTIRUN_FLAGS]   # Hydra's parser takes its flags before the overrides only
    return flags + [a for a in out if a not in MULTIRUN_FLAGS]


MULTIRUN_FLAGS = ("-m", "--multirun")


def _sweep_call(value: str) -> bool:
    """Hydra's override grammar: a sweep or value function (``range(3)``, ``choice(a,b)``, ``interval(0,1)``,
    ``glob(*)``) or an interpolation (``${...}``), whose jobs' values are checked when each job composes."""
    return "${" in value or re.fullmatch(r"[A-Za-z_]\w*\(.*\)", value.strip()) is not None


def precheck_overrides(args: list[str]) -> None:
    """Check ``group=option`` and ``group.key=value`` overrides against the folders and the schemas."""
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, _, value = arg.lstrip("+~").partition("=")
        if key.startswith("hydra"):
            continue
        if "trust" in key.split("."):
            raise SpecError(key, "trust is computed by gates from what the run has, never set in config.",
                            fix="remove the override; see `reward-lens-spec calibrate` and `freeze` for how trust rises.")
        head, _, rest = key.partition(".")
        if head in GROUPS and not rest:
            opts = group_options(head) + sorted(REGISTERED.get(head, ()))
            for v in value.split(","):
                if not v or v == "null" or any(c in v for c in "*?()[]$"):
                    continue
                if v not in opts:
                    raise SpecError(head, f"unknown option '{v}'.", value=v, options=opts,
                                    fix=f"name an option, a file ({head}=./my_{head}.yaml), or add your folder "
                                        f"with --config-dir DIR (holding DIR/{head}/<name>.yaml).")
                _check_file(head, v, args)
        elif (head in GROUP_SCHEMAS and rest) or (not rest and head in ("mode", "seed")):
            if rest:
                names = [f.name for f in fields(GROUP_SCHEMAS[head])]
                sub = rest.split(".")[0]
                if sub not in names:
                    raise SpecError(key, "unknown key.", value=sub, options=names)
            for v in _plain_values(value):            # a sweep's choices one by one, before any job starts
                _check_plain(key, v)
        elif not rest and head not in ("mode", "seed") and head not in GROUPS:
            raise SpecError(key, "unknown key.", value=head, options=("mode", "seed") + GROUPS)


def _plain_values(value: str) -> list[str]:
    """The values of an override to check now: the value itself; each choice of a plain comma sweep
    (``cpu,gpu``); none for a sweep or value function (``range(3)``) or a sweep whose choices are quoted,
    bracketed or interpolated, which each job's composition checks."""
    if _sweep_call(value):
        return []
    if "," not in value or value.startswith("["):
        return [value]
    return [] if any(c in value for c in "'\"[]{}()$\\") else value.split(",")


def _check_plain(key: str, value: str) -> None:
    """``key=value`` parsed as OmegaConf parses a dotlist and checked against the schema (``spec.validate``,
    partial). Raises ``SpecError`` naming ``key``."""
    try:
        parsed = OmegaConf.from_dotlist([f"{key}={value}"])
    except Exception as exc:                   # YAML (e.g. an unquoted ": ") or OmegaConf syntax
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(key, f"the value {value!r} is not a plain value ({why}).",
                        fix=f"quote the value: \"{key}='{value}'\" (single quotes inside, "
                            "double quotes for the shell).") from None
    try:
        validate(parsed, partial=True)
    except SpecError as exc:
        if exc.field != "config":
            raise
        raise SpecError(key, exc.detail, fix=exc.fix or f"set {key} to a value of its type in a config YAML.") from None
