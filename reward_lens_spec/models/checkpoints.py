"""Checkpoint sequences: one model spec names an ordered list of checkpoints, recorded as a chain.

``model.checkpoints`` names the sequence, ``model.checkpoint`` (0-based index) the one a run loads:

  [A, B, C]                            each entry a model source (a checkpoint folder; anything
                                       ``model.source`` accepts), in training order
  {folder: F, steps: [100, 200, …]}    one training run's folder in the HF Trainer layout:
                                       ``F/checkpoint-100``, ``F/checkpoint-200``, …

``select_checkpoint`` (``model_checks``, called by ``spec.validate``; string work only, no file is read) sets
``model.source`` to checkpoint i's and names the model ``<name>@step<s>`` (``<name>@<folder name>``
for a list), so each checkpoint's runs are labelled apart. Without ``model.checkpoint`` a run is
refused; ``reward-lens-spec -m model=... model.checkpoint=all`` sweeps the whole sequence as one
Hydra multirun into one store (``checkpoint_indices`` gives the expansion; ``cli``).

The chain (``chain``): each checkpoint's content digest ``d_i`` (sha256 over its files' sorted
relative names and sha256s, ``fingerprint_cache.file_sha256``; for a hub id or built-in source, of the
source string and revision), and the chain hash ``c_0 = H(v1, d_0)``, ``c_i = H(c_{i-1}, d_i)``. A run
of checkpoint i records ``{index, n, step, label, content_sha256: d_i, chain_sha256: c_i}`` in its
identity and provenance: changing any checkpoint ≤ i changes ``c_i`` (and so the run id); the drift
command (``compare.drift``) checks the links ``c_i = H(c_{i-1}, d_i)`` before reading a sequence.
Errors: ``SpecError`` naming ``model.checkpoints`` / ``model.checkpoint``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..model_checks import select_checkpoint, sequence  # noqa: F401  (select_checkpoint: this module's public name)
from .fingerprint_cache import file_sha256
from .sources import resolve_source

def content_digest(source: str, revision: str | None = None, base_dir: str | None = None) -> str:
    """sha256 of one checkpoint's content: its files (folder) or its source string and revision."""
    kind, loc = resolve_source(source, base_dir)
    h = hashlib.sha256(b"reward_lens_spec.checkpoint.v1")
    if kind == "folder":
        root = Path(loc)
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root)
            if p.is_file() and not any(part.startswith(".") for part in rel.parts):
                h.update(f"{rel.as_posix()}\0{file_sha256(p)}\n".encode())
    else:
        h.update(f"{kind}:{loc}@{revision or ''}".encode())
    return h.hexdigest()


def link(previous: str | None, digest: str) -> str:
    """The chain hash after one more checkpoint: ``H(previous or "v1", digest)``."""
    return hashlib.sha256(f"{previous or 'reward_lens_spec.chain.v1'}|{digest}".encode()).hexdigest()


def chain(spec, base_dir: str | None = None) -> dict | None:
    """The record of checkpoint ``spec.checkpoint`` in its sequence (see the module doc); ``None`` without one.

    Reads checkpoints 0..i (their file digests are cached by path, size and mtime)."""
    seq = sequence(spec)
    if not seq:
        return None
    i = spec.checkpoint
    c, digests = None, []
    for cp in seq[: i + 1]:
        d = content_digest(cp.source, getattr(spec, "revision", None), base_dir)
        digests.append(d)
        c = link(c, d)
    cp = seq[i]
    return {"index": i, "n": len(seq), "step": cp.step, "label": cp.label, "content_sha256": digests[-1],
            "chain_sha256": c, "digests": digests}


