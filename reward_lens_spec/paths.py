"""Where configs live: the package's own tree plus a user's config folders.

The built-in tree is ``conf/`` in a checkout and ``reward_lens_spec/conf`` in a wheel. A user's
folders hold the same layout (``observable/``, ``model/``, ``dataset/``, ``frame/``, ``store/``,
``experiment/``) and are searched after the built-in tree, in order (Hydra's order: the primary
tree, then ``hydra.searchpath``), so their option names must differ from the built-ins'. They come from ``--config-dir DIR``,
``hydra.searchpath=[DIR,...]`` (plain paths or ``file://`` URLs) and the environment variable
``REWARD_LENS_SPEC_CONFIG_PATH`` (``os.pathsep``-separated); the command line writes the first two
into that variable, so launcher workers and plan-time readers see the same folders.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "REWARD_LENS_SPEC_CONFIG_PATH"


def conf_dir() -> Path:
    """Absolute path of the built-in config tree (installed copy first, then the checkout's ``conf/``)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "conf", here.parent / "conf"):
        if (cand / "config.yaml").is_file():
            return cand
    raise FileNotFoundError(f"no config tree found next to {here}; reinstall the package.")


def user_dirs() -> list[Path]:
    """The user's config folders, in search order (from ``REWARD_LENS_SPEC_CONFIG_PATH``)."""
    return [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]


def add_user_dirs(dirs: list[str]) -> None:
    """Put ``dirs`` (absolute) in front of the user's config folders, for this process and its children."""
    new = [str(Path(d).expanduser().resolve()) for d in dirs]
    os.environ[ENV] = os.pathsep.join(dict.fromkeys(new + [str(p) for p in user_dirs()]))


def search_dirs() -> list[Path]:
    """The built-in tree, then the user's folders (the order Hydra composes from)."""
    return [conf_dir()] + user_dirs()


def shadowed(dirs: list[Path]) -> list[Path]:
    """Files in ``dirs`` whose ``<group>/<name>`` is also a built-in option (Hydra would use the built-in)."""
    root = conf_dir()
    return sorted(p for d in dirs for p in Path(d).rglob("*.yaml")
                  if (root / p.relative_to(d)).is_file())


def find_config(group: str, name: str) -> Path | None:
    """``<dir>/<group>/<name>.yaml`` in the first search folder that has it, else ``None``."""
    for d in search_dirs():
        path = d / group / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def group_options(group: str) -> list[str]:
    """Option names of a config group over every search folder (YAML files, sub-folders as ``sub/name``)."""
    names: set[str] = set()
    for d in search_dirs():
        root = d / group
        if root.is_dir():
            names |= {str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml")}
    return sorted(names)


def is_yaml_path(value: str) -> bool:
    """A group value that names a YAML file rather than an option (``./my_obs.yaml``, ``/abs/x.yml``)."""
    return value.endswith((".yaml", ".yml"))
