"""The config sources a user supplies, each checked by every rule of ``config_rules`` before Hydra reads it: YAML
files and folders (``check_files``: names of code; for a user's folder also the ``hydra`` allowlist through each
file's package, its defaults list and the value rules), one user config tree (``check_user_tree``), and
command-line overrides (``check_overrides``: sweeps value by value, sweeper params as the overrides they become).
Module doc of ``config_safety``: what is refused and why."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, QuotedString, RangeSweep

from .config_rules import (FIX_CODE, FIX_HYDRA, LAUNCHERS, TRUE_WORDS, check_tree, check_values, hydra_refusal,
                           key_segments, split_key, trust_error)
from .errors import SpecError
from .paths import user_dirs


def check_hydra_node(node: Any, path: tuple[str, ...], where: str, typed: bool, field: str | None = None) -> None:
    """Apply ``hydra_refusal`` to every leaf of ``node`` set at ``path`` (which starts with ``hydra``);
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
            check_hydra_node(v, path + split_key(k), where, typed, field)
        return
    reason = hydra_refusal(path[1:], node, typed)
    if reason:
        raise SpecError(field or ".".join(path), f"{where} {reason}.", fix=FIX_HYDRA)


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
                        f"hydra/launcher ({', '.join(LAUNCHERS)}).", fix=FIX_HYDRA)


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
        check_hydra_node(body, package, where, typed=False)
    elif not package and "hydra" in body:
        check_hydra_node(body["hydra"], ("hydra",), where, typed=False)
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
                            fix=FIX_CODE)
        try:
            text = path.read_text(encoding="utf-8")
            docs = list(yaml.safe_load_all(text))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue             # Hydra reports unreadable configs when it loads them
        header = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
        if header and "callbacks" in key_segments(header.group(1)):
            raise SpecError(str(rel), f"{where} is packaged into Hydra callbacks ({header.group(0)}).", fix=FIX_CODE)
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
            for d in search_dirs(line):
                check_files(Path(d).resolve(), "config folder " + d)
            continue
        values = list(override_values(o._value)) if o is not None else [raw]
        if o is not None and o.is_delete():
            values = [None]
        for v in values:
            check_tree({key_typed: v}, src)
        if "callbacks" in key_segments(str(raw)) and "hydra" in key_segments(key):
            raise SpecError(key, f"{src} selects Hydra callbacks.", fix=FIX_CODE)
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
                                f"hydra/launcher ({', '.join(LAUNCHERS)}).", fix=FIX_HYDRA)
        elif split_key(key)[:1] == ("hydra",):
            for v in values:
                check_hydra_node(v, split_key(key), src, typed)
        for v in values:
            check_values(v, key, src)
        if o is None:
            check_values(raw, key, src)
        if key in ("model.trust_remote_code",) and not typed:
            if any(str(v).strip().lower() in TRUE_WORDS for v in values):
                raise trust_error(src)


def check_overrides(overrides: list[str], config_dirs: list | None = None) -> None:
    """Refuse forbidden keys and values in command-line overrides (``key=value``, ``group=option``, sweeps
    value by value): names of code (``check_tree``), the ``hydra`` allowlist (typed on the command line, so
    ``hydra.launcher.setup`` and a relative ``hydra.sweep.dir`` pass), resolvers and ``ext://``.
    ``config_dirs``: the user's config folders (default ``paths.user_dirs()``), where a launcher option of
    their own may live."""
    _check_override_list(list(overrides), typed=True, config_dirs=config_dirs)


def search_dirs(override: str) -> list[str]:
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
