"""DataArrays built directly: what ``xr.DataArray(...)`` makes of in-memory values, without the constructor's
checks and deep copy of every coord (~40 Variable objects a call; ~150-250 µs for a variable with a run's pair
labels). The same coords, dims, dtypes and default indexes (``tests/test_arrays.py``)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr
from xarray.core.indexes import PandasIndex
from xarray.core.variable import as_variable


def data_array(var: xr.Variable, coords: dict, name) -> xr.DataArray:
    """``xr.DataArray(var, coords=coords, name=name)`` (``coords``: name -> Variable; its encoding left empty, as
    that constructor leaves it) with each coord's encoding (as read) on its own shallow copy, built directly:
    each dim coord's default index made as the constructor makes it, no copy or check beyond that (the
    constructor's ~40 Variable objects and deep copy of every coord were ~250 µs a variable). Coords whose dims
    do not fit ``var`` go through the constructor (its error)."""
    sizes = dict(zip(var.dims, var.shape))
    if any(sizes.get(d, -1) != n for c in coords.values() for d, n in zip(c.dims, c.shape)):
        return xr.DataArray(var, coords=coords, name=name)
    own, indexes = {}, {}
    for k, c in coords.items():
        v = c
        if c.dims == (k,):                       # a dim coord: its default index, as the constructor builds it
            indexes[k] = PandasIndex.from_variables({k: c}, options={})
            v = indexes[k].create_variables({k: c})[k]
        own[k] = v.copy(deep=False)
        own[k].encoding = dict(c.encoding) if c.encoding else {}
    data = var.copy(deep=False)
    data.encoding = {}
    return xr.DataArray(data, coords=own, name=name, indexes=indexes, fastpath=True)


def new_array(data, dims: tuple, coords: dict, name=None) -> xr.DataArray:
    """``xr.DataArray(data, dims=dims, coords=coords, name=name)`` for ``data`` in memory and ``coords`` a dict
    (name -> values along the dim of that name, or ``(dims, values)``, as the constructor takes them), each coord
    made a Variable as the constructor makes it (``as_variable``) and the array built by ``data_array``."""
    return data_array(xr.Variable(dims, data), {k: as_variable(v, name=k, auto_convert=False)
                                                for k, v in coords.items()}, name)



def bytes_index(raw: np.ndarray, name: str = "pair") -> pd.Index | None:
    """The index of fixed-width UTF-8 bytes ``raw`` (``S<w>``, dims ``pair``; trailing NULs not part of a value),
    in pandas' ``str`` dtype over an Arrow string array made from those bytes (no Python string per value, no
    allocation in Arrow's own memory pool); None where that is not how pandas holds strings (no pyarrow, numpy
    < 2) or the bytes are not valid UTF-8 (the caller decodes them)."""
    n, w = len(raw), raw.dtype.itemsize
    u8 = raw.view(np.uint8).reshape(n, w)
    nz = u8 != 0
    lengths = np.where(nz.any(axis=1), w - np.argmax(nz[:, ::-1], axis=1), 0)
    return _utf8_index(lengths, u8[np.arange(w) < lengths[:, None]], name)    # each row's bytes, in order


def str_index(values, name: str = "pair"):
    """``values`` (a sequence of ``str``, dims ``pair``) as the index pandas makes of them, in its ``str`` dtype
    over one Arrow string array made from their UTF-8 bytes (``bytes_index``): no object array, no type inference
    over every id and no allocation in Arrow's memory pool, whose first use alone costs ~13 MB of resident memory
    where it is mimalloc (Arrow's default; the command line sets the C library's, ``cli.ARROW_POOL``; issue 40
    item 5). Where pandas does not hold strings in Arrow, or a value is not a ``str`` that
    encodes (a lone surrogate), the list itself, which ``xr.DataArray`` indexes as before."""
    if hasattr(values, "raw"):                   # a models.pair_ids.PairIds: its bytes as they are
        data, off = values.raw()
        idx = _utf8_index(np.diff(off), np.frombuffer(data, np.uint8), name)
        if idx is not None:
            return idx
    values = list(values)
    try:
        data = "".join(values).encode("utf-8")
    except (TypeError, UnicodeError):
        return values
    lengths = np.fromiter(map(len, values), np.int64, count=len(values))
    if int(lengths.sum()) != len(data):          # not all ASCII: each value's length in UTF-8 bytes
        lengths = np.fromiter((len(v.encode("utf-8")) for v in values), np.int64, count=len(values))
    idx = _utf8_index(lengths, np.frombuffer(data, np.uint8), name)
    return values if idx is None else idx


def _utf8_index(lengths: np.ndarray, data: np.ndarray, name: str) -> pd.Index | None:
    dtype = pd.Index(np.array(["a"])).dtype
    if getattr(dtype, "storage", None) != "pyarrow" or not hasattr(np.dtypes, "StringDType"):
        return None
    import pyarrow as pa

    offsets = np.zeros(lengths.size + 1, np.int64)          # large_string: what pandas holds (no cast, no copy)
    np.cumsum(lengths, out=offsets[1:])
    try:
        arr = pa.Array.from_buffers(pa.large_binary(), lengths.size, [None, pa.py_buffer(offsets),
                                                                       pa.py_buffer(data)])
        arr = arr.cast(pa.large_string())                        # validates the UTF-8
    except pa.ArrowInvalid:
        return None
    return pd.Index(pd.array(arr, dtype=dtype), name=name, copy=False)
