"""``Result.load`` reads every variable and coord into memory, in place: after it, the store they came from can
go and every value still reads, equal to what was written (dask-backed variables and lazily indexed ones from a
backend alike)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.result import Result


def test_load_holds_every_value_after_the_store_is_gone(tmp_path):
    rng = np.random.default_rng(0)
    ds = xr.Dataset({"margin": ("pair", rng.standard_normal(6)),
                     "lens": (("pair", "layer"), rng.standard_normal((6, 3)).astype(np.float32))},
                    coords={"pair": [f"p{i}" for i in range(6)], "layer": [-1, 0, 1],
                            "dimension": ("pair", list("aabbcc")), "length": (("pair", "layer"), np.ones((6, 3)))})
    path = tmp_path / "s.zarr"
    ds.to_zarr(path, zarr_format=3, consolidated=False)
    lazy = xr.open_zarr(path, chunks=None, consolidated=False)          # lazily indexed backend arrays
    chunked = xr.open_zarr(path, chunks={"pair": 2}, consolidated=False)  # dask
    res = Result({"margin": lazy["margin"], "lens": chunked["lens"], "again": lazy["lens"]})
    assert res.load() is res
    shutil.rmtree(path)
    for name, var in (("margin", "margin"), ("lens", "lens"), ("again", "lens")):
        v = res[name]
        assert v.chunks is None
        np.testing.assert_array_equal(v.values, ds[var].values)
        for c in v.coords:
            np.testing.assert_array_equal(v.coords[c].values, ds.coords[c].values)


def test_a_name_no_variable_holds_is_missing_without_comparing_coords(monkeypatch):
    """``res.get(name)`` / ``name in``-style lookups of an absent output (the identities ask for ``patch_restored``
    on every run) raise ``KeyError`` at once: the coords' agreement, which compares every variable's labels value by
    value (100,000 pair ids made into Python strings twice over), is computed only for a name some variable holds.
    A held coord is still given back where the variables agree and refused where they differ."""
    ids = [f"q{i}" for i in range(5)]
    a = xr.DataArray(np.zeros(5), dims=("pair",), coords={"pair": list(ids), "w": ("pair", np.arange(5))})
    b = xr.DataArray(np.ones(5), dims=("pair",), coords={"pair": list(ids), "w": ("pair", np.arange(5) + 1)})
    res = Result({"a": a, "b": b})
    calls = []
    real = xr.Variable.identical
    monkeypatch.setattr(xr.Variable, "identical", lambda self, other: calls.append(1) or real(self, other))
    assert res.get("patch_restored") is None and calls == []
    with pytest.raises(KeyError, match="no variable 'patch_restored'"):
        res["patch_restored"]
    assert calls == [] and list(res["pair"].values) == ids and calls
    with pytest.raises(KeyError, match="differs between variables"):
        res["w"]
