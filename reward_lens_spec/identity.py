"""Run identity and provenance: the content hash of what determines the numbers, and versions.

The run id is ``<observable>-<spec_hash(parts)[:20]>``; ``parts`` are built by ``run.executor``.
Nothing here reads time or paths, so identical content always hashes identically.
"""
from __future__ import annotations

import hashlib
import json
import platform
import re
from pathlib import Path

from . import __version__
from .observables import load_observable
from .registry import expand_steps
import numpy
import xarray


def canonical_observable(obs) -> dict:
    steps, outputs = expand_steps(obs, load_observable)
    return {"name": obs.name, "version": obs.version, "steps": steps, "outputs": outputs,
            "layers": obs.layers, "components": obs.components, "pairs": obs.pairs}


def spec_hash(parts: dict) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def observable_hash(obs) -> str:
    """Canonical content hash of an ``ObservableSpec`` (expanded steps, outputs, version, restrictions): what a
    scorecard, a study's pins and the gate compare."""
    return spec_hash(canonical_observable(obs))


def versions() -> dict:
    import torch
    import transformers
    import zarr

    return {"reward_lens_spec": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "xarray": xarray.__version__, "zarr": zarr.__version__,
            "numpy": numpy.__version__}


_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _git_dir(start: Path) -> Path | None:
    """The git directory of the checkout holding ``start``: ``<dir>/.git``, or where a ``.git`` FILE points
    (``gitdir: <path>``, as in a worktree or submodule), searching up from ``start``."""
    for d in (start, *start.parents):
        dot = d / ".git"
        if dot.is_dir():
            return dot
        if dot.is_file():
            line = dot.read_text(encoding="utf-8").strip()
            if not line.startswith("gitdir:"):
                return None
            target = Path(line[len("gitdir:"):].strip())
            return (target if target.is_absolute() else d / target).resolve()
    return None


def _read_ref(git_dir: Path, common: Path, ref: str) -> str | None:
    """The content of ``ref`` (``refs/heads/main``): its loose file in the worktree's or the common git
    directory, else its line in ``packed-refs``."""
    parts = ref.split("/")
    if not ref or ref.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    for base in dict.fromkeys((git_dir, common)):
        loose = base.joinpath(*parts)
        if loose.is_file():
            return loose.read_text(encoding="utf-8").strip()
    for base in dict.fromkeys((common, git_dir)):
        packed = base / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                sha, _, name = line.strip().partition(" ")
                if name.strip() == ref and _SHA.fullmatch(sha):
                    return sha
    return None


def git_sha() -> str | None:
    """The commit of the git checkout this package runs from, or ``None`` (not a checkout, unreadable, a
    ref format we do not read). Read from files only: ``.git/HEAD``, then the ref it names (its loose file
    or ``packed-refs``), following a ``.git`` file (``gitdir: ...``) and a worktree's ``commondir``. It
    never runs a program: a ``git`` found on ``PATH`` could be anyone's."""
    try:
        git_dir = _git_dir(Path(__file__).resolve().parent)
        if git_dir is None or not git_dir.is_dir():
            return None
        common = git_dir
        if (git_dir / "commondir").is_file():
            target = Path((git_dir / "commondir").read_text(encoding="utf-8").strip())
            common = (target if target.is_absolute() else git_dir / target).resolve()
        head: str | None = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
        for _ in range(8):                       # HEAD -> ref -> (a symbolic ref) -> sha
            if head is None:
                return None
            if _SHA.fullmatch(head):
                return head
            if not head.startswith("ref:"):
                return None
            head = _read_ref(git_dir, common, head[len("ref:"):].strip())
        return None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
