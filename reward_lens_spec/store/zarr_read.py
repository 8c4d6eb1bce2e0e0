"""Zarr v3 groups read back as ``xr.open_zarr`` decodes them, in one concurrent pass (the reading half of
``store.zarr_io``).

``read_groups`` reads a group and its child groups, every document and array in one concurrent pass;
``as_read`` / ``decoded`` are the steps of that read a caller holding the values already (``store.staged``)
repeats without a store; ``decoded_as_read`` gives a variable as a reader of ``write_new_groups``' bytes decodes it
(xarray's decoder applied to the encoded variable), so a writer can digest what it wrote without reading it back.
"""
from __future__ import annotations

import asyncio

import numpy as np
import xarray as xr
from xarray import conventions
from xarray.backends.memory import InMemoryDataStore
from xarray.backends.store import StoreBackendEntrypoint
from xarray.backends.zarr import FillValueCoder, encode_zarr_variable
from xarray.core import indexing


def decoded_as_read(name: str, var: xr.Variable) -> xr.Variable:
    """``var`` as ``xr.open_zarr`` gives it back from the array ``write_new_groups`` stores (xarray's Zarr
    encoding, then its CF decoding with ``open_zarr``'s defaults)."""
    enc = encode_zarr_variable(var, name=name, zarr_format=3)
    return conventions.decode_cf_variable(name, enc, concat_characters=True, mask_and_scale=True,
                                          decode_times=True, decode_endianness=True)


def as_read(arr, data) -> xr.Variable:
    """One stored array as ``ZarrStore.open_store_variable`` gives it (Zarr v3: dims from
    ``dimension_names``, ``_FillValue`` attr decoded, xarray's encoding), its data ``data`` in memory."""
    attrs = dict(arr.attrs)
    chunks = tuple(arr.chunks)
    dims = tuple(arr.metadata.dimension_names or ())
    enc = {"chunks": chunks, "preferred_chunks": dict(zip(dims, chunks))}
    if arr.dtype.kind == "T":
        enc["dtype"] = arr.dtype
    enc.update(compressors=arr.compressors, filters=arr.filters, shards=arr.shards, serializer=arr.serializer,
               fill_value=arr.metadata.fill_value)
    if "_FillValue" in attrs:
        attrs["_FillValue"] = FillValueCoder.decode(attrs["_FillValue"], arr.dtype)
    return xr.Variable(dims, data, attrs, enc)


def decoded(variables: dict, attrs: dict) -> xr.Dataset:
    """``xr.open_zarr``'s decoding (its defaults) of variables read as ``as_read``, handed over: the Dataset holds
    their data (not copies) and shallow copies of their attrs and encoding, as a store's read hands over what it
    read (``_Handed``)."""
    attrs = {k: v for k, v in attrs.items() if not k.lower().startswith("_nc")}
    return StoreBackendEntrypoint().open_dataset(_Handed(variables, attrs), mask_and_scale=True,
                                                 decode_times=True, concat_characters=True, decode_coords=True)


class _Handed(InMemoryDataStore):
    """xarray's in-memory store over variables the caller made for this read alone: each goes to the decoder as
    a shallow copy (data lazily indexed, as ``InMemoryDataStore`` gives it) where that store deep-copies it —
    data, attrs and the encoding's codec objects (~1 ms a small run's completion)."""

    def get_variables(self):
        out = {}
        for k, v in self._variables.items():
            v = v.copy(deep=False)
            v._data = indexing.LazilyIndexedArray(v._data)
            out[k] = v
        return out


def read_groups(zstore, group: str, children, *, shared=(), max_bytes: int | None = None,
                root_max_bytes: int | None = None, own: bool = True) -> tuple[xr.Dataset | None, dict]:
    """``group`` and its child groups ``children``, each as ``xr.open_zarr(..., chunks=None)`` decodes it
    (the same variables, attrs and encoding; no default indexes built: a caller building DataArrays makes
    its own) with its data read now: every metadata document and array in one concurrent pass.

    ``shared``: names of arrays not read from a child when ``group`` holds one itself (the ``pair`` index
    of store layout 3: ``open_zarr(..., drop_variables=["pair"])``). ``max_bytes``: a
    child whose variable (the array named as the child) holds more is not read (None in the returned dict:
    open it lazily instead). ``root_max_bytes``: when ``group``'s own arrays hold more together, nothing is read
    and ``(None, {})`` comes back (open it lazily instead). Returns ``(group's Dataset, {child: Dataset or
    None})``; ``KeyError`` for a child that is not a group of arrays. ``own=False``: ``group``'s own arrays are
    not read (its Dataset comes back empty; ``shared`` still names what the children skip): a caller holding
    them already (the pair labels of a run, issue 40 item 5).
    """
    import zarr.api.asynchronous as za
    from zarr.core.sync import sync

    async def go():
        root = await za.open_group(store=zstore, path=group, mode="r", zarr_format=3)
        nodes = {p: n async for p, n in root.members(max_depth=1 if children else 0)}
        picked = {"": {k: n for k, n in nodes.items() if "/" not in k and hasattr(n, "shape")}}
        if root_max_bytes is not None and sum(n.nbytes for n in picked[""].values()) > root_max_bytes:
            return None, None
        skip = set(shared) & set(picked[""])
        if not own:
            picked[""] = {}
        for c in children:
            if not hasattr(nodes.get(c), "members"):
                raise KeyError(f"{group}/{c}: no such group")
            arrays = {k.split("/", 1)[1]: n for k, n in nodes.items()
                      if k.startswith(c + "/") and hasattr(n, "shape") and k.split("/", 1)[1] not in skip}
            big = arrays.get(c)
            if max_bytes is not None and big is not None and big.nbytes > max_bytes:
                picked[c] = None
            else:
                picked[c] = arrays
        reads = [(c, k, n) for c, arrays in picked.items() if arrays for k, n in arrays.items()]
        data = await asyncio.gather(*(n.getitem(...) for _, _, n in reads))
        got: dict = {c: ({} if arrays is not None else None) for c, arrays in picked.items()}
        for (c, k, n), d in zip(reads, data):
            got[c][k] = as_read(n, np.asarray(d))
        attrs = {"": root.attrs, **{c: nodes[c].attrs for c in children}}
        return got, attrs

    got, attrs = sync(go())
    if got is None:
        return None, {}
    out = {c: None if v is None else decoded(v, attrs[c]) for c, v in got.items()}
    return out.pop(""), out
