"""The run's ``frame`` config → a fitted ``Frame``: found in the result store, or fitted and stored.

  native    no frame (``None``): outputs stay in the model's own basis.
  whitened  ``fit_whitened`` on this model's readout activations h, both sides of the first
            ``frame.reference_limit`` pairs of ``frame.reference`` (default: the run's dataset
            config, whatever its ``dataset.limit``).
  shared    ``fit_shared`` for this model and ``frame.partner`` on the same reference pairs
            (pairs either model's tokenizer excludes are dropped for both). The two models are
            ordered by name, so ``model=a frame.partner=b`` and ``model=b frame.partner=a`` fit,
            store and reuse the one frame.

Reuse: a frame's *fit key* is the sha256 of what determines the fit (kind, each model's name and
content fingerprint, the reference dataset checksum, reference_limit, shrinkage, and each model's
formatting numerics). A stored frame with the same fit key is loaded, not refitted;
``frame.id`` names a stored frame directly. A stored frame is checked against this model (its name
and body fingerprint — the weights without the head, ``body_fingerprint`` — must be among those
it was fitted for; a model with a new head keeps its frames). Errors: ``SpecError`` naming the
``frame.*`` key and the fix; a ``UserWarning`` for an underdetermined shared frame.
"""
from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np

from ..errors import SpecError, StoreError
from .fit import Frame, fit_shared, fit_whitened
from .io import load_frame, save_frame
from ..inputs import batch_size, encode, load_dataset, load_lm
from ..models.door import nested
from ..inputs import numerics
from ..spec import group_config
from ..store import open_store


def body_fingerprint(lm) -> str:
    """Fingerprint of ``lm`` without its head: what its activations, and so a frame, depend on."""
    from ..models.fingerprint import model_fingerprint
    return model_fingerprint(lm.model, lm.tokenizer, without_head=lm.family.head)


def _reference_pairs(run, base_dir):
    f = run.frame
    ds = run.dataset if f.reference is None else group_config("dataset", f.reference, key="frame.reference",
                                                                 base_dir=base_dir)
    # reference_limit, not the dataset's own limit, sets how many pairs: runs of one dataset at
    # different dataset.limit share one frame
    try:
        loaded = load_dataset(ds, base_dir, limit=f.reference_limit)
    except SpecError as exc:
        where = "frame.reference" if f.reference is not None else "dataset"
        raise SpecError(where, f"the frame's reference dataset '{ds.name}' cannot be loaded ({exc}).",
                        fix="set frame.reference to a conf/dataset option that needs no path, or to a dataset "
                            "YAML file naming its path.") from None
    return ds.name, loaded


def _readout(lm, spec, pairs) -> dict[str, np.ndarray]:
    """pair id → (2, d) readout activations h (chosen, rejected) of ``lm`` on ``pairs``."""
    from ..engine.capture import capture
    enc = encode(lm, pairs, spec)
    cap = capture(lm, enc, (), batch_size=batch_size(spec, lm, enc), max_tokens=spec.max_tokens,
                  padding_side=spec.padding_side.value)
    return {pid: cap.h[i] for i, pid in enumerate(enc.pair_ids)}


def _stack(h: dict, ids: list[str]) -> np.ndarray:
    return np.concatenate([h[i] for i in ids], axis=0).astype(np.float64)


def fit_key(kind: str, models: list[tuple[str, str, dict]], reference_checksum: str, limit: int, shrinkage) -> str:
    blob = json.dumps({"kind": kind, "models": sorted(models, key=lambda m: m[0]), "reference": reference_checksum,
                       "reference_limit": limit, "shrinkage": str(shrinkage)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _find(store, key: str) -> Frame | None:
    try:
        st = open_store(store)
        runs = st.runs(observable="frame")
    except StoreError:
        return None                                  # no store yet: nothing to reuse
    for run_id in runs["run_id"]:
        if st.provenance(run_id).get("fit_key") == key:
            return load_frame(store, str(run_id)[len("frame-"):])
    return None


def _load_by_id(store, fid: str) -> Frame:
    fid = fid[len("frame-"):] if fid.startswith("frame-") else fid
    if len(fid) < 8 or any(c not in "0123456789abcdef" for c in fid):
        raise SpecError("frame.id", f"'{fid}' is not a frame id: give at least 8 hex digits of one.",
                        fix="list stored frames with `reward-lens-spec store ls url=...` (runs named frame-<id>).")
    try:
        return load_frame(store, fid)
    except StoreError as exc:
        raise SpecError("frame.id", str(exc), fix="name a frame stored in this run's store.url.") from None


def _check_covers(frame: Frame, model: str, fingerprint: str, kind: str) -> Frame:
    if frame.kind != kind:
        raise SpecError("frame.id", f"stored frame {frame.id[:12]} is a {frame.kind} frame, not {kind}.",
                        fix=f"use frame={frame.kind} with this id, or another frame.id.")
    fps = frame.provenance.get("fingerprints", {})
    if model not in frame.models or fps.get(model) != fingerprint:
        fitted = {m: str(fps.get(m, "?"))[:12] for m in frame.models}
        raise SpecError("frame.id", f"stored frame {frame.id[:12]} was fitted for {fitted} (name: fingerprint), "
                        f"not for model '{model}' with fingerprint {fingerprint[:12]}.",
                        fix="fit a frame for this model (drop frame.id) or name one fitted for it.")
    return frame


def resolve_frame(run, lm, store, base_dir: str | None = None) -> Frame | None:
    """The run's frame (``None`` for native); fits, stores and reuses as the module doc says, in ``store`` (the
    run's store handle, ``store.store_handle``)."""
    f, kind = run.frame, run.frame.name.value
    if kind == "native":
        return None
    name, fingerprint = run.model.name, body_fingerprint(lm)
    if f.id:
        return _check_covers(_load_by_id(store, f.id), name, fingerprint, kind)
    ref_name, ref_pairs = _reference_pairs(run, base_dir)
    models = [(name, fingerprint, numerics(run.model))]
    partner = None
    if kind == "shared":
        pspec = nested(run.model, f.partner, "frame.partner", base_dir)
        partner = load_lm(pspec, base_dir)
        models.append((pspec.name, body_fingerprint(partner), numerics(pspec)))
    key = fit_key(kind, models, ref_pairs.checksum, f.reference_limit, f.shrinkage)
    found = _find(store, key)
    if found is not None:
        return _check_covers(found, name, fingerprint, kind)
    prov = {"fit_key": key, "fingerprints": {m[0]: m[1] for m in models},
            "numerics": {m[0]: m[2] for m in models}, "reference_dataset": ref_name,
            "reference_checksum": ref_pairs.checksum, "reference_limit": f.reference_limit, "site": "readout h"}
    h = _readout(lm, run.model, ref_pairs)
    if kind == "whitened":
        ids = list(h)
        frame = fit_whitened(_stack(h, ids), name, shrinkage=f.shrinkage, provenance={**prov, "n_pairs": len(ids)})
    else:
        h_p = _readout(partner, pspec, ref_pairs)
        ids = [i for i in h if i in h_p]
        if len(ids) < 2:
            raise SpecError("frame.reference", f"only {len(ids)} reference pairs fit both models' max_length.",
                            fix="use a reference dataset with shorter pairs, or raise model.max_length.")
        acts = {name: _stack(h, ids), pspec.name: _stack(h_p, ids)}
        a, b = sorted(acts)
        frame = fit_shared(acts[a], acts[b], models=(a, b), shrinkage=f.shrinkage,
                           provenance={**prov, "n_pairs": len(ids)})
        if frame.provenance["underdetermined"]:
            warnings.warn(f"shared frame {frame.id[:12]}: {2 * len(ids)} reference activations for d_model "
                          f"{frame.d}: the alignment is fixed only on the data's span, and `compare` will refuse "
                          f"its directions. Raise frame.reference_limit above {frame.d // 2}.", stacklevel=2)
    save_frame(frame, store)
    return frame
