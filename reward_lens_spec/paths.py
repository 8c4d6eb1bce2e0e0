"""Where the one config tree lives: ``conf/`` in a checkout, ``reward_lens_spec/conf`` in a wheel."""
from __future__ import annotations

from pathlib import Path


def conf_dir() -> Path:
    """Absolute path of the config tree (installed copy first, then the checkout's ``conf/``)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "conf", here.parent / "conf"):
        if (cand / "config.yaml").is_file():
            return cand
    raise FileNotFoundError(f"no config tree found next to {here}; reinstall the package.")


def group_options(group: str) -> list[str]:
    """Option names of a config group (YAML files, sub-folders as ``sub/name``)."""
    root = conf_dir() / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
