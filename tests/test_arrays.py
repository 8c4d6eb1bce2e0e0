"""``arrays``: DataArrays built directly are what ``xr.DataArray`` makes of the same values."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from reward_lens_spec.arrays import data_array, new_array, str_index


def _same(a: xr.DataArray, b: xr.DataArray) -> None:
    assert a.identical(b) and a.name == b.name and a.encoding == b.encoding and list(a.coords) == list(b.coords)
    for k in a.coords:
        x, y = a.coords.variables[k], b.coords.variables[k]
        assert type(x) is type(y) and x.dtype == y.dtype and x.encoding == y.encoding, k
    assert set(a.xindexes) == set(b.xindexes)
    for k, i in a.xindexes.items():
        j = b.xindexes[k]
        assert type(i) is type(j) and i.index.dtype == j.index.dtype and i.coord_dtype == j.coord_dtype, k


def test_new_array_is_the_constructors():
    n = 6
    coords = {"pair": np.array([f"p{i}" for i in range(n)]), "dimension": ("pair", np.array(["a", "bb"] * 3)),
              "flag": ("pair", np.arange(n) % 2 == 0), "side": ["chosen", "rejected"], "d": np.arange(3)}
    data = np.arange(n * 2 * 3, dtype=np.float32).reshape(n, 2, 3)
    dims = ("pair", "side", "d")
    _same(new_array(data, dims, coords), xr.DataArray(data, dims=dims, coords=coords))
    _same(new_array(data, dims, coords, name="h"), xr.DataArray(data, dims=dims, coords=coords, name="h"))
    with pytest.raises(ValueError):
        new_array(data, dims, {**coords, "flag": ("pair", np.zeros(n + 1, bool))})


def test_data_array_is_the_constructors_with_coord_encodings_kept():
    ids = pd.Index(np.array(["x", "y", "z"], dtype=object), dtype=object, name="pair")
    pair = xr.Coordinates({"pair": ids}).variables["pair"]
    other = xr.Variable("pair", np.array([1, 2, 3]), {"units": "n"}, {"dtype": "int16"})
    var = xr.Variable(("pair", "k"), np.zeros((3, 2)), {"gauge": "g"}, {"chunks": (3, 2)})
    got = data_array(var, {"pair": pair, "other": other}, None)
    want = xr.DataArray(var, coords={"pair": ids, "other": other})
    _same(got, want)
    assert got.coords["other"].encoding == {"dtype": "int16"} and got.encoding == {}


def test_new_array_takes_variables_as_the_constructor_does():
    """Coords given as Variables (an operator passing its input's coords on) plus a new dim's labels."""
    x = xr.DataArray(np.zeros((3, 2, 4)), dims=("pair", "side", "d_model"),
                     coords={"pair": ["a", "b", "c"], "side": ["chosen", "rejected"],
                             "flag": ("pair", [True, False, True])})
    coords = {k: v for k, v in x.coords.variables.items() if "d_model" not in v.dims}
    data = np.ones((3, 2, 2))
    as_arrays = {k: v for k, v in x.coords.items() if "d_model" not in v.dims}
    want = xr.DataArray(data, dims=("pair", "side", "objective"), coords={**as_arrays, "objective": ["h", "s"]})
    _same(new_array(data, ("pair", "side", "objective"), {**coords, "objective": ["h", "s"]}), want)
    _same(data_array(xr.Variable(("pair", "side"), data[..., 0]), coords, None),
          xr.DataArray(data[..., 0], dims=("pair", "side"), coords=as_arrays))


@pytest.mark.parametrize("ids", [["q1", "b\u00e9", "\u4e2d\u6587", ""], ["a", "a"], [], ["x\ud800", "y"]])
def test_a_str_index_is_the_index_xarray_makes_of_the_list(ids):
    """``str_index``: the same labels, order and alignment as ``xr.DataArray`` indexing the plain list (non-ASCII,
    an empty string, repeats, no ids, a lone surrogate Arrow refuses: then the list itself)."""
    new = xr.DataArray(np.arange(len(ids), dtype=float), dims=("pair",), coords={"pair": str_index(ids)})
    old = xr.DataArray(np.arange(len(ids), dtype=float), dims=("pair",), coords={"pair": list(ids)})
    assert list(new.indexes["pair"]) == ids and new.indexes["pair"].equals(old.indexes["pair"])
    if len(set(ids)) == len(ids) and "x\ud800" not in ids:       # (pandas cannot align a lone surrogate either way)
        assert (new - old.isel(pair=slice(None, None, -1))).sizes["pair"] == len(ids)      # aligned by label
        assert np.array_equal((new - old.isel(pair=slice(None, None, -1))).values, np.zeros(len(ids)))
    assert isinstance(str_index(ids), list) == ("x\ud800" in ids)


def test_a_str_index_takes_nothing_from_arrows_memory_pool():
    """The index's Arrow array lies in memory numpy and Python allocated: Arrow's own pool (mimalloc, ~13 MB of
    resident memory on its first use) holds no byte of it."""
    pa = pytest.importorskip("pyarrow")
    ids = [f"q{i}\u00e9" for i in range(5000)]
    before = pa.default_memory_pool().bytes_allocated()
    idx = str_index(ids)
    assert isinstance(idx, pd.Index) and list(idx) == ids
    assert pa.default_memory_pool().bytes_allocated() == before
