"""Observable specs by name or path, read into ``ObservableSpec``.

A name is looked up as ``observable/<name>.yaml`` in the user's config folders, then in the
built-in tree (``paths.search_dirs``); a value ending in ``.yaml``/``.yml`` is a file path
(relative paths against the working directory). ``include:`` entries resolve the same way.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

from omegaconf import OmegaConf

from .errors import SpecError
from .paths import find_config, group_options, is_yaml_path
from .spec import ObservableSpec, keys_of


def observable_path(ref: str, key: str = "observable") -> Path:
    """The YAML file ``ref`` names (an option of any search folder, or a path); ``SpecError`` naming ``key``."""
    if is_yaml_path(ref):
        path = Path(ref).expanduser().resolve()
        if not path.is_file():
            raise SpecError(key, f"no observable file {ref!r} (looked at {path}).",
                            fix="give the path of an existing observable YAML, or an option name.")
        return path
    path = find_config("observable", ref)
    if path is None:
        raise SpecError(key, f"unknown observable '{ref}'.", value=ref, options=group_options("observable"),
                        fix="name an option listed by `reward-lens-spec help`, a file `observable=./my_obs.yaml`, "
                            "or add your folder with --config-dir DIR (holding DIR/observable/<name>.yaml).")
    return path


def load_observable(name: str) -> ObservableSpec:
    """Read an observable by option name or path (a fresh copy each call; the parse is cached per
    file version, so building a plan again does not re-read YAML). A file without ``name:`` is
    named after its stem."""
    path = observable_path(name)
    st = path.stat()
    return copy.deepcopy(_parse_observable(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=256)
def _parse_observable(path: str, mtime_ns: int, size: int) -> ObservableSpec:
    raw = OmegaConf.load(path)
    if "name" not in raw:
        raw.name = Path(path).stem
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ObservableSpec), raw)
    except Exception as exc:                   # unknown key / wrong type: name the file and the key
        key = str(getattr(exc, "key", "") or "")
        raise SpecError(f"observable.{key}" if key else "observable",
                        f"{path}: {str(exc).splitlines()[0]}", value=key or None,
                        options=keys_of(ObservableSpec) if key else None) from None
    return OmegaConf.to_object(merged)
