"""``diff``: chosen minus rejected by the ``side`` labels, whatever their order; the rest of the input as it was."""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.ops.base import NoParams
from reward_lens_spec.ops.diff import Diff


def test_diff_is_chosen_minus_rejected_by_label():
    rng = np.random.default_rng(0)
    x = xr.DataArray(rng.standard_normal((5, 2, 3)).astype(np.float32), dims=("pair", "side", "layer"),
                     coords={"pair": [f"p{i}" for i in range(5)], "side": ["rejected", "chosen"],
                             "layer": [-1, 0, 1], "dimension": ("pair", list("abcab"))},
                     attrs={"gauge": "g", "affine": "point"}, name="h")
    x.encoding = {"chunks": (5, 2, 3)}
    got = Diff(NoParams()).run(None, x)
    want = x.sel(side="chosen", drop=True) - x.sel(side="rejected", drop=True)
    assert got.identical(want.assign_attrs(gauge="g", affine="vector"))
    assert got.dtype == np.float32 and got.encoding == {} and x.attrs["affine"] == "point"
    np.testing.assert_array_equal(got.values, x.values[:, 1] - x.values[:, 0])
    with pytest.raises(KeyError):
        Diff(NoParams()).run(None, x.assign_coords(side=["chosen", "other"]))


def test_a_per_side_coord_does_not_survive_as_the_pairs():
    """A coord along ``side`` (e.g. ``implicit_reward``'s ``response_tokens``) differs between the sides: the
    margin must not carry one side's values as if they were the pair's."""
    x = xr.DataArray(np.arange(6.0).reshape(3, 2), dims=("pair", "side"),
                     coords={"pair": ["a", "b", "c"], "side": ["chosen", "rejected"],
                             "response_tokens": (("pair", "side"), [[1, 2], [3, 4], [5, 6]])})
    got = Diff(NoParams()).run(None, x)
    assert "response_tokens" not in got.coords
    np.testing.assert_array_equal(got.values, [-1.0, -1.0, -1.0])


def _by_label(x):
    """The definition: two selections by label and xarray's aligned subtraction, the input's attrs kept."""
    out = x.sel(side="chosen", drop=True) - x.sel(side="rejected", drop=True)
    out.attrs = dict(x.attrs)
    if "affine" in out.attrs:
        out.attrs["affine"] = "vector"
    return out


def _inputs():
    rng = np.random.default_rng(1)
    pair = [f"p{i}" for i in range(4)]
    yield xr.DataArray(rng.standard_normal((4, 2)).astype(np.float32), dims=("pair", "side"), name="reward",
                       coords={"pair": pair, "side": ["chosen", "rejected"], "dimension": ("pair", list("aabb")),
                               "flag": ("pair", [True, False, True, False])}, attrs={"units": "reward"})
    yield xr.DataArray(rng.standard_normal((3, 4, 2, 5)), dims=("layer", "pair", "side", "d_model"),
                       coords={"layer": [-1, 0, 1], "pair": pair, "side": ["rejected", "chosen"]})
    yield xr.DataArray(rng.integers(-9, 9, (2, 4)), dims=("side", "pair"), coords={"side": ["chosen", "rejected"]})
    yield xr.DataArray(rng.standard_normal((4, 3)), dims=("pair", "side"), name=None,
                       coords={"pair": pair, "side": ["ref", "rejected", "chosen"]}, attrs={"affine": "point"})
    yield xr.DataArray(rng.standard_normal((4, 2)), dims=("pair", "side"),            # a per-side coord
                       coords={"pair": pair, "side": ["chosen", "rejected"],
                               "response_tokens": (("pair", "side"), rng.integers(1, 9, (4, 2)))})
    yield xr.DataArray(rng.standard_normal((4, 2)), dims=("pair", "side"),
                       coords={"pair": pair, "side": ["chosen", "rejected"]}).chunk({"pair": 2})   # dask


@pytest.mark.parametrize("k", range(6))
def test_diff_equals_the_selections_by_label_and_a_naive_subtraction(k):
    """Every input kind gives exactly what the definition gives (numbers, coords, name, attrs), and the numbers of
    a plain numpy subtraction of the two sides' positions."""
    x = list(_inputs())[k]
    got = Diff(NoParams()).run(None, x)
    want = _by_label(x)
    xr.testing.assert_identical(got.compute(), want.compute())
    side = list(x["side"].values)
    ax = x.dims.index("side")
    naive = np.take(np.asarray(x.values), side.index("chosen"), axis=ax) - np.take(
        np.asarray(x.values), side.index("rejected"), axis=ax)
    np.testing.assert_array_equal(got.transpose(*[d for d in x.dims if d != "side"]).values, naive)
