"""Frames in the result store: one run ``frame-<id>`` holding observable ``frame``.

The Dataset (float64) has dims ``model``, ``d_model``, ``rank`` (padded to the largest model's
rank; ``rank_used`` says how many columns are real) and, for shared frames, ``d_model_b``:
``mean (model × d_model)``, ``basis (model × d_model × rank)``, ``eigval (model × rank)``,
``iso (model)``, ``rank_used (model)``, ``rotation (model × d_model × d_model_b)`` with
``has_rotation (model)``. Run attrs are the frame's provenance (JSON), plus ``frame_id``,
``kind``, ``model`` and ``observable: frame``. Reuse is by id: saving a frame already stored
writes nothing; ``load_frame`` recomputes the id from the loaded arrays and refuses a mismatch.
Errors: ``StoreError`` (unknown frame id, corrupted content), plus the store's own errors.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from ..errors import StoreError
from .fit import Frame, make_frame
from ..store import write_run
from ..store import open_store

OBSERVABLE = "frame"


def frame_run_id(frame_id: str) -> str:
    return f"frame-{frame_id}"


def frame_to_dataset(frame: Frame) -> xr.Dataset:
    """The stored form of ``frame`` (see the module doc)."""
    m, d = len(frame.models), frame.d
    r = max([b.shape[1] for b in frame.basis] + [0])
    basis, eigval = np.zeros((m, d, r)), np.ones((m, r))
    for i in range(m):
        k = frame.basis[i].shape[1]
        basis[i, :, :k], eigval[i, :k] = frame.basis[i], frame.eigval[i]
    data = {
        "mean": (("model", "d_model"), np.stack(frame.mean)),
        "basis": (("model", "d_model", "rank"), basis),
        "eigval": (("model", "rank"), eigval),
        "iso": (("model",), np.asarray(frame.iso, np.float64)),
        "rank_used": (("model",), np.asarray([b.shape[1] for b in frame.basis], np.int64)),
    }
    if any(rot is not None for rot in frame.rotation):
        data["rotation"] = (("model", "d_model", "d_model_b"),
                            np.stack([np.eye(d) if rot is None else rot for rot in frame.rotation]))
        data["has_rotation"] = (("model",), np.asarray([rot is not None for rot in frame.rotation]))
    ds = xr.Dataset(data, coords={"model": list(frame.models)})
    for v in ds.data_vars:
        ds[v].attrs = {"units": "activation" if v in ("mean", "eigval", "iso") else "1", "gauge": frame.gauge}
    ds.attrs = {"frame_id": frame.id, "kind": frame.kind}
    return ds


def frame_from_dataset(ds: xr.Dataset, provenance: dict | None = None) -> Frame:
    """Rebuild a ``Frame``; raises ``StoreError`` if the content does not hash to its stored id."""
    models = tuple(str(m) for m in ds["model"].values)
    ranks = [int(k) for k in ds["rank_used"].values]
    basis = tuple(np.asarray(ds["basis"].values[i, :, :ranks[i]], np.float64) for i in range(len(models)))
    eigval = tuple(np.asarray(ds["eigval"].values[i, :ranks[i]], np.float64) for i in range(len(models)))
    if "rotation" in ds:
        rotation = tuple(np.asarray(ds["rotation"].values[i], np.float64) if bool(ds["has_rotation"].values[i])
                         else None for i in range(len(models)))
    else:
        rotation = (None,) * len(models)
    kind, want = str(ds.attrs["kind"]), str(ds.attrs["frame_id"])
    prov = {k: v for k, v in (provenance or {}).items() if k not in ("run_id", "observables", "created",
                                                                      "complete", "store_write_s")}
    frame = make_frame(kind, models, tuple(np.asarray(x, np.float64) for x in ds["mean"].values), basis, eigval,
                       tuple(float(x) for x in ds["iso"].values), rotation, prov)
    if frame.id != want:
        raise StoreError(f"frame {want[:12]}: stored arrays hash to {frame.id[:12]}; the stored frame is "
                         "corrupted or was edited. Fix: refit it and save it again.")
    return frame


def save_frame(frame: Frame, store, *, storage_options: dict | None = None) -> bool:
    """Store ``frame`` with its provenance in ``store`` (a store URL or handle, ``store.store_handle``); True if
    written, False if that id was already stored."""
    attrs = {**frame.provenance, "frame_id": frame.id, "kind": frame.kind, "model": "+".join(frame.models),
             "observable": OBSERVABLE, "gauge": {v: frame.gauge for v in ("mean", "basis", "eigval", "iso")}}
    return write_run(store, frame_run_id(frame.id), {OBSERVABLE: frame_to_dataset(frame)}, attrs,
                     storage_options=storage_options)


def load_frame(store, frame_id: str, *, storage_options: dict | None = None) -> Frame:
    """Load the frame ``frame_id`` (full sha256, or a unique prefix of ≥ 8 hex digits) from ``store`` (a store URL
    or handle, ``store.store_handle``)."""
    st = open_store(store, storage_options=storage_options)
    run_id = frame_run_id(frame_id)
    if len(frame_id) < 64:
        hits = [r for r in st.runs()["run_id"] if str(r).startswith(run_id)] if len(frame_id) >= 8 else []
        if len(hits) != 1:
            raise StoreError(f"frame id prefix {frame_id!r} matches {len(hits)} stored frames in {st.url}. "
                             "Fix: give the full id (Frame.id) or at least 8 unique hex digits.")
        run_id = hits[0]
    ds = st.load(run_id, OBSERVABLE, lazy=False)     # StoreError naming the run if absent
    return frame_from_dataset(ds, st.provenance(run_id))
