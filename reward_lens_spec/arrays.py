"""DataArrays built directly: what ``xr.DataArray(...)`` makes of in-memory values, without the constructor's
checks and deep copy of every coord (~40 Variable objects a call; ~150-250 µs for a variable with a run's pair
labels). The same coords, dims, dtypes and default indexes (``tests/test_arrays.py``)."""
from __future__ import annotations

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
