"""Intervention artifacts as files: a safetensors file and its provenance JSON, written and read safely.

An artifact is ``<name>.safetensors`` (tensors only; safetensors' format holds no code) and ``<name>.json``
beside it (its provenance: ``kind``, the sha256 of the safetensors file's bytes, each tensor's dtype, shape and
sha256, the store, run id, observable and variable each tensor came from with that array's sealed digest, the
source model's name and fingerprint, the site it was fitted at). Tensors by kind:

==========  ==========================================  ===============================================
kind        tensors (float, native frame of the model)  the model it makes
==========  ==========================================  ===============================================
``steer``   ``vector`` (d_model)                          x ← x + alpha · vector at ``site``, every position
``erase``   ``mean`` (d_model), ``projection``            x ← x − (x − mean) · projectionᵀ at ``site``,
            (d_model × d_model)                           every position (LEACE, Belrose et al. 2023)
``head``    ``weight`` (d_model, or output × d_model),    the reward head W, b replaced (a Bradley–Terry
            ``bias`` (output, optional)                   head fitted by ``reward-lens-spec fit``)
==========  ==========================================  ===============================================

``model.interventions: [{kind, path, site, alpha}]`` names them (``spec.InterventionSpec``). Every entry is
checked where a model spec crosses the door (``models.door.admit``: before any model loads) and again by the
loader on the bytes it reads (``read``): a path that is not ``.safetensors`` (a pickle can run code), a missing
or unreadable provenance JSON, a file whose sha256 differs from its provenance (tampered or replaced), a file
safetensors cannot parse, a kind or site that does not fit, each refused with one line naming the key
(``model.interventions.<i>.path``). The run identity covers ``identity(spec)``: kind, site, alpha and the file's
sha256 per entry (never the path), so a changed file gives a different run id.
Errors: ``SpecError``. This module imports no torch (``models.apply_artifacts`` applies them).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..errors import SpecError
from ..data.files import resolve_path
from ..model_checks import check_entry

FORMAT = "reward-lens-spec intervention 1"
TENSORS = {"steer": ("vector",), "erase": ("mean", "projection"), "head": ("weight",)}
OPTIONAL = {"head": ("bias",)}


def resolve(path, base_dir: str | None) -> Path:
    return resolve_path(path, base_dir)


def provenance_path(path: Path) -> Path:
    return path.with_suffix(".json")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read(entry, key: str, base_dir: str | None = None) -> tuple[dict, dict]:
    """``(tensors {name: ndarray}, provenance dict)`` of the entry at ``key``, checked (module doc). The tensors
    are parsed from the very bytes whose digest is checked."""
    check_entry(entry, key)
    path = resolve(entry.path, base_dir)
    where = key + ".path"
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise SpecError(where, f"cannot read {path} ({exc.strerror or exc}).", fix="give the path of an exported "
                        "artifact (relative paths are read from the directory you run in).") from None
    side = provenance_path(path)
    try:
        prov = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecError(where, f"{path.name} has no readable provenance file {side.name} "
                        f"({type(exc).__name__}).", fix="keep the .json that export wrote beside the file.") from None
    if not isinstance(prov, dict) or prov.get("format") != FORMAT:
        raise SpecError(where, f"{side.name} is not an intervention provenance file ({FORMAT}).",
                        fix="keep the .json that export wrote beside the file.")
    if prov.get("kind") != entry.kind:
        raise SpecError(where, f"{path.name} holds a {prov.get('kind')!r} artifact, not {entry.kind!r}.",
                        fix=f"set kind: {prov.get('kind')}, or name the right file.")
    if sha256(blob) != prov.get("sha256"):
        raise SpecError(where, f"{path.name} fails its provenance digest (sha256 {sha256(blob)[:12]}…, provenance "
                        f"says {str(prov.get('sha256'))[:12]}…): the file was changed after export.",
                        fix="export it again from its run.")
    from safetensors.numpy import load
    try:
        tensors = load(blob)
    except Exception as exc:                        # SafetensorError and friends: never another reader
        raise SpecError(where, f"{path.name} is not a safetensors file ({str(exc).splitlines()[0][:80]}).",
                        fix="export it with `reward-lens-spec export`; pickles are never read.") from None
    want, extra = TENSORS[entry.kind], OPTIONAL.get(entry.kind, ())
    if set(want) - set(tensors) or set(tensors) - set(want) - set(extra):
        raise SpecError(where, f"{path.name} holds tensors {sorted(tensors)}; a {entry.kind} needs {list(want)}"
                        + (f" (optional {list(extra)})" if extra else "") + ".", fix="export it again.")
    for name, t in tensors.items():
        if not (np.issubdtype(t.dtype, np.floating) and np.isfinite(t).all()):
            raise SpecError(where, f"tensor {name} of {path.name} is not finite floating point.",
                            fix="export it again.")
    return tensors, prov


def check_files(spec, key: str, base_dir: str | None = None) -> None:
    """Every entry of ``spec.interventions`` read and checked (the door's check: before any model loads)."""
    for i, entry in enumerate(getattr(spec, "interventions", None) or ()):
        read(entry, f"{key}.interventions.{i}", base_dir)


def identity(spec, base_dir: str | None = None) -> list[dict] | None:
    """What the run id covers of ``spec.interventions``: ``[{kind, site, alpha, sha256}]`` in order (the file's
    bytes, not its path); ``None`` without interventions (run ids as before). A file that cannot be read is
    refused (``read``)."""
    items = getattr(spec, "interventions", None) or ()
    if not items:
        return None
    return [record(e, read(e, f"model.interventions.{i}", base_dir)[1]["sha256"]) for i, e in enumerate(items)]


def record(entry, digest: str) -> dict:
    """One entry as identity and provenance record it."""
    return {"kind": entry.kind, "site": entry.site if entry.kind != "head" else "readout",
            "alpha": float(entry.alpha) if entry.kind == "steer" else None, "sha256": digest}


def resid_layers(records) -> tuple[int, ...]:
    """The layers (ascending, once each) whose output ``resid_post.<l>`` an applied intervention rewrites, from
    ``LoadedModel.interventions`` (``record``s; ``None`` or empty: none). What such an intervention adds to the
    residual stream is no block's output: the capture records it as its own DLA component ``intervention``
    (``models.capture``). Interventions at ``attn_out``/``mlp_out`` are part of what that block wrote."""
    return tuple(sorted({int(r["site"].split(".")[1]) for r in records or ()
                         if r["kind"] != "head" and r["site"].startswith("resid_post.")}))


def write(out: Path, kind: str, tensors: dict, source: dict) -> tuple[Path, Path]:
    """Write ``out`` (``.safetensors``) and its provenance JSON beside it: ``(file, provenance file)``.
    ``tensors``: name → ndarray (written as they are, dtype kept); ``source``: where they came from."""
    from safetensors.numpy import save

    if not str(out).endswith(".safetensors"):
        raise SpecError("out", f"{out} must end in .safetensors.", fix="e.g. out=eraser.safetensors.")
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    blob = save(arrays, metadata={"format": FORMAT, "kind": kind})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(blob)
    prov = {"format": FORMAT, "kind": kind, "file": out.name, "sha256": sha256(blob),
            "tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape), "sha256": sha256(v.tobytes())}
                        for k, v in arrays.items()}, "source": source}
    side = provenance_path(out)
    side.write_text(json.dumps(prov, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return out, side
