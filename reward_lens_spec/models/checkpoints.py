"""Checkpoint sequences: one model spec names an ordered list of checkpoints, recorded as a chain.

``model.checkpoints`` names the sequence, ``model.checkpoint`` (0-based index) the one a run loads:

  [A, B, C]                            each entry a model source (a checkpoint folder; anything
                                       ``model.source`` accepts), in training order
  {folder: F, steps: [100, 200, …]}    one training run's folder in the HF Trainer layout:
                                       ``F/checkpoint-100``, ``F/checkpoint-200``, …

``select_checkpoint`` (called by ``spec.validate``; string work only, no file is read) sets
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
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from .fingerprint_cache import file_sha256
from .sources import resolve_source

ALL = "all"
_FIX = ("model.checkpoints=[folder_a, folder_b, ...] or model.checkpoints={folder: RUN_DIR, steps: [100, 200]} "
        "(RUN_DIR/checkpoint-<step>)")


@dataclass(frozen=True)
class Checkpoint:
    index: int
    source: str            # a model source (folder path, hub id, organism:...)
    step: int | None       # training step (the {folder, steps} form), else None
    label: str             # "step<s>" or the entry's folder name


def sequence(spec) -> list[Checkpoint]:
    """The checkpoints ``spec.checkpoints`` names, in order (``[]`` when none). ``SpecError`` on a bad form."""
    cps = getattr(spec, "checkpoints", None)
    if cps is None:
        return []
    if isinstance(cps, dict):
        unknown = sorted(set(cps) - {"folder", "steps"})
        if unknown or not cps.get("folder") or not cps.get("steps"):
            raise SpecError("model.checkpoints", f"a mapping needs exactly 'folder' and a non-empty 'steps' list "
                            f"(got keys {sorted(cps)}).", fix=_FIX)
        steps = list(cps["steps"])
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in steps):
            raise SpecError("model.checkpoints.steps", f"steps must be non-negative integers, got {steps}.", fix=_FIX)
        if steps != sorted(set(steps)):
            raise SpecError("model.checkpoints.steps", f"steps must increase strictly (training order), got {steps}.",
                            fix="list each step once, in increasing order.")
        folder = str(cps["folder"]).rstrip("/")
        return [Checkpoint(i, f"{folder}/checkpoint-{s}", int(s), f"step{s}") for i, s in enumerate(steps)]
    if isinstance(cps, (list, tuple)):
        if not cps or not all(isinstance(c, str) and c.strip() for c in cps):
            raise SpecError("model.checkpoints", f"a list must name at least one checkpoint, each a source string; "
                            f"got {list(cps)}.", fix=_FIX)
        if len(set(cps)) != len(cps):
            raise SpecError("model.checkpoints", "a checkpoint is listed twice.", value=list(cps), fix=_FIX)
        return [Checkpoint(i, str(c), None, str(c).rstrip("/").rsplit("/", 1)[-1] or str(c))
                for i, c in enumerate(cps)]
    raise SpecError("model.checkpoints", f"must be a list of checkpoints or a {{folder, steps}} mapping, got {cps!r}.",
                    fix=_FIX)


def select_checkpoint(spec) -> None:
    """Point ``spec`` (a ``ModelSpec``, changed in place) at checkpoint ``spec.checkpoint`` of its sequence:
    ``source`` and ``name`` (see the module doc). No sequence: nothing to do (``model.checkpoint`` alone is
    refused). Raises ``SpecError``."""
    seq = sequence(spec)
    i = getattr(spec, "checkpoint", None)
    if not seq:
        if i is not None:
            raise SpecError("model.checkpoint", "selects a checkpoint of model.checkpoints, which is not set.",
                            fix=f"set {_FIX}, or drop model.checkpoint.")
        return
    if i is None:
        raise SpecError("model.checkpoint", f"model.checkpoints names {len(seq)} checkpoints; a run reads one.",
                        fix=f"model.checkpoint=<0..{len(seq) - 1}>, or sweep them all: "
                            "reward-lens-spec -m ... model.checkpoint=all")
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(seq):
        raise SpecError("model.checkpoint", f"no checkpoint {i!r}: the sequence has indices 0..{len(seq) - 1}.",
                        value=i, fix="model.checkpoint=<index>, or model.checkpoint=all with -m.")
    cp = seq[i]
    spec.source = cp.source
    base = spec.name.split("@", 1)[0]
    spec.name = f"{base}@{cp.label}"


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


def checkpoint_indices(spec) -> list[int]:
    """Every index of ``spec``'s sequence (what ``model.checkpoint=all`` expands to); ``SpecError`` without one."""
    seq = sequence(spec)
    if not seq:
        raise SpecError("model.checkpoint", "'all' sweeps model.checkpoints, which is not set.", fix=f"set {_FIX}.")
    return [cp.index for cp in seq]
