"""Run identity and provenance: the content hash of what determines the numbers, and versions.

The run id is ``<observable>-<spec_hash(parts)[:20]>``; ``parts`` are built by ``run.execute``.
Nothing here reads time or paths, so identical content always hashes identically.
"""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from pathlib import Path

from . import __version__
from .observables import load_observable
from .registry import expand_steps


def canonical_observable(obs) -> dict:
    steps, outputs = expand_steps(obs, load_observable)
    return {"name": obs.name, "version": obs.version, "steps": steps, "outputs": outputs,
            "layers": obs.layers, "components": obs.components, "pairs": obs.pairs}


def spec_hash(parts: dict) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def versions() -> dict:
    import numpy
    import torch
    import transformers
    import xarray
    import zarr

    return {"reward_lens_spec": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "xarray": xarray.__version__, "zarr": zarr.__version__,
            "numpy": numpy.__version__}


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
