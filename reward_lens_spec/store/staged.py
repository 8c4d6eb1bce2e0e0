"""What this process wrote into new groups (``zarr_io.write_new_groups(staged=)``: a ``zarr_io.Written``, key
-> Buffer and each array's values), read back from what it kept instead of from the store.

A one-chunk run writes each array with its data in its skeleton (``run.stream_arrays.ensure_skeleton``); its
completion needs those arrays as a reader of the store gets them (values, dtypes, attrs, encoding: the seal's
digests, the observable group's attrs, the returned result). ``read_staged`` gives what ``zarr_read.read_groups``
would read, built in this thread from the values written (a copy of each, in the dtype zarr reads it back in:
strings as ``StringDType``; the metadata parsed from the stored documents as zarr parses them) by the decoding
a read goes through; ``staged_values`` one float array's values; ``update_staged_group`` writes a group's new
attrs from the document it wrote. ``tests/test_store_direct.py`` checks each against a read of the store.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import xarray as xr
from xarray.backends.zarr import FillValueCoder
from zarr.core.array import AsyncArray
from zarr.core.group import GroupMetadata
from zarr.storage import MemoryStore, StorePath

from .zarr_io import proto, put_batches
from .zarr_read import as_read, decoded
from .zarr_sync import DOCS_KEPT, metadata_of


_ARRAYS: dict = {}       # a stored array document (bytes) -> zarr's AsyncArray on it, no store behind it


def _staged_array(doc):
    """zarr's ``AsyncArray`` on the metadata parsed from an array document (``zarr_sync.metadata_of``), as
    ``zarr_read.as_read`` asks about it; never touches a store; None for a group's document. Made once per distinct
    document (the same kinds recur)."""
    raw = doc.to_bytes()
    if raw in _ARRAYS:
        return _ARRAYS[raw]
    arr = None
    if json.loads(raw).get("node_type") == "array":
        arr = AsyncArray(metadata=metadata_of(raw), store_path=StorePath(MemoryStore(), ""))
    if len(_ARRAYS) >= DOCS_KEPT:
        _ARRAYS.pop(next(iter(_ARRAYS)))
    _ARRAYS[raw] = arr
    return arr


def staged_attrs(staged: dict, group: str) -> dict:
    """The attrs of the group ``write_new_groups`` wrote at ``group`` (its document in ``staged``)."""
    return dict(GroupMetadata.from_dict(json.loads(staged[f"{group}/zarr.json"].to_bytes())).attributes)


def update_staged_group(zstore, staged: dict, group: str, attrs: dict) -> None:
    """Add ``attrs`` to the attrs of the group ``write_new_groups`` wrote at ``group`` (its document in
    ``staged``): the document zarr's ``group.attrs.update`` writes, put in one call (a fenced store checks its
    writer's role first); ``staged`` keeps the new document."""
    key = f"{group}/zarr.json"
    doc = GroupMetadata(attributes={**staged_attrs(staged, group), **attrs}, zarr_format=3)
    staged[key] = doc.to_buffer_dict(proto())["zarr.json"]
    put_batches(zstore, [([(key, staged[key])], False)])


def staged_values(staged: dict, path: str) -> np.ndarray | None:
    """The values of the float array ``write_new_groups`` wrote at ``path`` (its document and values in
    ``staged``), a copy of those it wrote: what ``xr.open_zarr`` gives for it (xarray's decoding of a float
    array whose only CF attr is a NaN ``_FillValue`` leaves the values as they are). None when ``staged`` does
    not hold it or xarray would decode it otherwise."""
    doc = staged.get(f"{path}/zarr.json")
    arr = None if doc is None else _staged_array(doc)
    if arr is None or arr.dtype.kind != "f":
        return None
    attrs = arr.attrs
    cf = ("missing_value", "scale_factor", "add_offset", "units", "calendar", "dtype")
    if any(k in attrs for k in cf) or ("_FillValue" in attrs and not np.isnan(
            FillValueCoder.decode(attrs["_FillValue"], arr.dtype))):
        return None
    return _values(staged, path, arr)


def _values(staged, path: str, arr) -> np.ndarray | None:
    """A copy of the values written at array ``path`` (``zarr_io.Written.arrays``) as zarr's read of the whole
    array ``arr`` returns them: a new C-ordered array of its native dtype object (e.g. ``dtype('<f8')``, not
    ``float64``: xarray's encoding keeps it). None when none were kept (an array created without its data)."""
    kept = staged.arrays.get(path)
    if kept is None:
        return None
    out = np.empty(kept.shape, dtype=arr.metadata.data_type.to_native_dtype())
    out[...] = kept
    return out


def read_staged(staged: dict, group: str, children, *, shared=(), max_bytes: int | None = None
                ) -> tuple[xr.Dataset | None, dict] | None:
    """``read_groups(zstore, group, children, shared=shared, max_bytes=max_bytes)`` of a store holding the keys
    ``staged`` (what ``write_new_groups(..., staged=)`` wrote there): the same Datasets (a child whose variable
    holds more than ``max_bytes``: None), built in this thread from the values written (``_values``). None
    when ``group`` or one of ``children`` was not written there, or an array of theirs without its values."""
    docs = {}
    for p in (group, *(f"{group}/{c}" for c in children)):
        if f"{p}/zarr.json" not in staged:
            return None
        docs[p] = staged_attrs(staged, p)

    def arrays(p, skip=(), big=None) -> dict | bool | None:
        names = sorted({k[len(p) + 1:].split("/", 1)[0] for k in staged if k.startswith(p + "/")
                        and k.endswith("/zarr.json") and k.count("/") == p.count("/") + 2} - set(skip))
        found = {}
        for name in names:
            arr = _staged_array(staged[f"{p}/{name}/zarr.json"])
            if arr is not None:
                found[name] = arr
        if max_bytes is not None and big in found and found[big].nbytes > max_bytes:
            return None
        out = {}
        for name, arr in found.items():
            values = _values(staged, f"{p}/{name}", arr)
            if values is None:
                return False                  # created without its data: read it from the store
            v = as_read(arr, values)
            v.attrs = copy.deepcopy(v.attrs)      # the cached array's attrs stay its own
            out[name] = v
        return out

    root = arrays(group)
    if root is False:
        return None
    skip = set(shared) & set(root)
    got = {c: arrays(f"{group}/{c}", skip, big=c) for c in children}
    if any(g is False for g in got.values()):
        return None
    out = {c: None if g is None else decoded(g, docs[f"{group}/{c}"]) for c, g in got.items()}
    return decoded(root, docs[group]), out
