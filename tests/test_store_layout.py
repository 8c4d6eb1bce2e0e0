"""Store layout 4: each observable one plain Dataset, each variable with exactly its own coordinates.

Checked on a real CLI run of ``battery`` read back with plain xarray (warnings are errors), against
the operators' own coordinate sets (a coordinate two variables hold differently is published under the
later one's own name, never padded); a layout-2 run is read after migrate (``test_store_plain``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec import open_store
from reward_lens_spec.errors import StoreError
from reward_lens_spec.result import Result
from reward_lens_spec.store import write_run

N_LAYERS = 4          # tiny_llama


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("battery")
    url = str(tmp / "store.zarr")
    out = subprocess.run([sys.executable, "-m", "reward_lens_spec", "observable=battery", "model=tiny_llama",
                          "dataset.limit=6", "model.threads=1", f"store.url={url}"], cwd=tmp,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    st = open_store(url)
    (run,) = list(st.runs().run_id)
    return url, run, st.document(run)["attempt"]


def _own(ds: xr.Dataset, name: str) -> xr.DataArray:
    """A published variable under its own dim names (``stored_as``), with only its own coordinates."""
    spec = ds.attrs["stored_as"][name]
    v = ds[name].reset_coords(drop=True).rename(spec["dims"])
    dims = spec["dims"]
    return v.assign_coords({own: ([dims.get(d, d) for d in ds[stored].dims], ds[stored].values)
                            for own, stored in spec["coords"].items()})


def test_each_variable_has_the_coordinates_it_really_has(battery):
    url, run, attempt = battery
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(url, group=f"runs/{run}/battery")
        tree = xr.open_datatree(url, engine="zarr")
    xr.testing.assert_identical(tree[f"runs/{run}/battery"].to_dataset(), ds)
    assert sorted(ds.data_vars) == sorted(ds.attrs["output_variables"])
    assert ds.attrs["run_id"] == run and ds.attrs["trust"] == "exploratory" and ds.attrs["attempt"] == attempt
    assert set(ds.attrs["gauge"]) == set(ds.attrs["units"]) == set(ds.data_vars)
    layers = list(range(N_LAYERS))
    patch = _own(ds, "patch_effect")
    assert list(patch.component.values) == ["resid", "attn", "mlp"] and list(patch.layer.values) == layers
    dla = _own(ds, "dla")
    assert list(dla.component.values) == ["embed", "attn", "mlp"] and list(dla.layer.values) == [-1, *layers]
    assert list(_own(ds, "dla_heads").layer.values) == layers
    assert "component" not in _own(ds, "lens").coords and "layer" not in _own(ds, "margin").coords
    for name in ("patch_effect", "attribution_patch_effect", "dla_heads", "lens", "margin", "reward"):
        values = ds[name].values
        assert np.isfinite(values).all(), name                  # no cell padded to another variable's coords
    # dla's own grid: a cell is NaN exactly where it names no unit (layer −1: embed only; else attn, mlp)
    unit = np.array([str(u) for u in dla["unit"].values.ravel()]).reshape(dla["unit"].shape)
    assert (np.isnan(dla.values) == (unit == "")[None]).all()
    np.testing.assert_allclose(dla.sum(["layer", "component"]), ds["margin"], atol=1e-5)
    # the package's reader gives the same variables, and an explicit outer join is what pads
    res = open_store(url).load(run, "battery", lazy=False)
    assert isinstance(res, Result) and list(res) == list(ds.attrs["output_variables"])
    xr.testing.assert_equal(res["patch_effect"].reset_coords(drop=True), patch.load().reset_coords(drop=True))
    labels = {"dimension", "prompt_id", "prompt_truncated", "response_truncated", "empty_response", "identical_sides"}
    assert labels <= set(ds.coords) and labels <= set(ds["patch_effect"].coords)    # the run's pair labels, once
    for k in labels:                                                    # and given back by the reader
        np.testing.assert_array_equal(res["patch_effect"][k].values, ds[k].values)
    assert "component" not in res.coords and "layer" not in res.sizes and res.sizes["pair"] == 6
    joined = res.to_dataset()
    assert np.isnan(joined["patch_effect"].sel(component="embed")).all()
    assert np.isnan(joined["dla_heads"].sel(layer=-1)).all()


def test_export_one_variable_and_refuse_to_pad(battery, tmp_path):
    url, run, _ = battery
    st = open_store(url)
    with pytest.raises(StoreError, match="different coordinate sets.*Fix: add var=NAME"):
        st.export(run, "battery", str(tmp_path / "all.csv"))
    with pytest.raises(StoreError, match="no variable 'patch_efect'. Did you mean 'patch_effect'"):
        st.export(run, "battery", str(tmp_path / "x.csv"), variable="patch_efect")
    from reward_lens_spec.store.catalog_cli import main
    out = tmp_path / "patch.csv"
    assert main(["export", f"url={url}", f"run={run}", "observable=battery", "var=patch_effect", f"out={out}"]) == 0
    import pandas as pd
    df = pd.read_csv(out)
    assert len(df) == 6 * N_LAYERS * 3 and set(df["component"]) == {"resid", "attn", "mlp"}
    assert df["patch_effect"].notna().all()


def test_result_reads_like_a_dataset_where_unambiguous():
    a = xr.DataArray(np.ones((2, 3)), dims=("pair", "component"),
                     coords={"pair": ["p", "q"], "component": ["embed", "attn", "mlp"], "dimension": ("pair", ["x", "y"])})
    b = xr.DataArray(np.zeros((2, 2)), dims=("pair", "component"),
                     coords={"pair": ["p", "q"], "component": ["resid", "attn"]})
    res = Result({"dla": a, "patch_effect": b}, {"trust": "exploratory"})
    assert res["dla"] is a and res.dla is a and list(res.pair.values) == ["p", "q"]
    assert res.sizes == {"pair": 2} and set(res.coords) == {"pair", "dimension"}
    assert "dla" in res and "pair" not in res and len(res) == 2 and res.nbytes == a.nbytes + b.nbytes
    with pytest.raises(KeyError, match="Did you mean 'dla'"):
        res["dlaa"]
    with pytest.raises(TypeError, match="not an xarray.DataArray"):
        Result({"x": a.to_dataset(name="x")})
    assert res.identical(Result({"dla": a.copy(), "patch_effect": b.copy()}, {"trust": "exploratory"}))
    assert not res.identical(Result({"dla": a, "patch_effect": b + 1}, {"trust": "exploratory"}))


def test_a_group_without_its_listing_is_refused_not_read_as_empty(tmp_path):
    url = str(tmp_path / "s.zarr")
    write_run(url, "r", {"score": xr.Dataset({"margin": ("pair", [1.0, -2.0])}, coords={"pair": ["a", "b"]})},
              {"model": "m"})
    doc_path = os.path.join(url, "runs", "r", "score", "zarr.json")          # the published group
    doc = json.load(open(doc_path))
    assert doc["attributes"]["output_variables"] == ["margin"]
    np.testing.assert_array_equal(open_store(url).load("r", "score", lazy=False)["margin"].values, [1.0, -2.0])
    del doc["attributes"]["output_variables"]
    json.dump(doc, open(doc_path, "w"))
    with pytest.raises(StoreError, match="cannot read run r observable score.*lists no output_variables"):
        open_store(url).load("r", "score")


def test_variables_with_different_pair_orders_keep_their_own_labels(tmp_path):
    """The group shares pair labels only when every variable's pair index agrees; else each keeps its own."""
    url = str(tmp_path / "s.zarr")
    a = xr.DataArray([1.0, 2.0], dims="pair", coords={"pair": ["p", "q"], "dimension": ("pair", ["x", "y"])})
    b = xr.DataArray([3.0, 4.0], dims="pair", coords={"pair": ["q", "p"], "dimension": ("pair", ["y", "x"])})
    write_run(url, "r", {"obs": Result({"a": a, "b": b})}, {"model": "m"})
    res = open_store(url).load("r", "obs", lazy=False)
    for name, want in (("a", a), ("b", b)):
        assert list(res[name].pair.values) == list(want.pair.values)
        assert list(res[name].dimension.values) == list(want.dimension.values)
        np.testing.assert_array_equal(res[name].values, want.values)
    assert res["b"].sel(pair="p").item() == 4.0
