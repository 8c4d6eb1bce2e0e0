"""Observable specs by name: ``conf/observable/<name>.yaml`` read into ``ObservableSpec``."""
from __future__ import annotations

import copy
import functools

from omegaconf import OmegaConf

from .errors import SpecError
from .paths import conf_dir, group_options
from .spec import ObservableSpec


def load_observable(name: str) -> ObservableSpec:
    """Read ``conf/observable/<name>.yaml`` into an ``ObservableSpec`` (a fresh copy each call; the
    parse is cached per file version, so building a plan again does not re-read YAML)."""
    path = conf_dir() / "observable" / f"{name}.yaml"
    if not path.is_file():
        raise SpecError("observable", f"unknown observable '{name}'.", value=name, options=group_options("observable"))
    st = path.stat()
    return copy.deepcopy(_parse_observable(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=256)
def _parse_observable(path: str, mtime_ns: int, size: int) -> ObservableSpec:
    merged = OmegaConf.merge(OmegaConf.structured(ObservableSpec), OmegaConf.load(path))
    return OmegaConf.to_object(merged)
