"""``Result.load`` reads every variable and coord into memory, in place: after it, the store they came from can
go and every value still reads, equal to what was written (dask-backed variables and lazily indexed ones from a
backend alike)."""
from __future__ import annotations

import shutil

import numpy as np
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
