"""Store layout 3: one Zarr group per output variable, each with exactly its own coordinates.

Checked on a real CLI run of ``battery`` read back with plain xarray (warnings are errors), against
the operators' own coordinate sets; a layout-2 store (one Dataset per observable) is still read.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec import open_store
from reward_lens_spec.errors import StoreError
from reward_lens_spec.result import Result
from reward_lens_spec.store import migrate, write_run

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


def test_each_variable_has_the_coordinates_it_really_has(battery):
    url, run, attempt = battery
    group = f"runs/{run}/{attempt}/battery"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = xr.open_datatree(url, group=group, engine="zarr", consolidated=False)
    assert sorted(tree.children) == sorted(tree.attrs["output_variables"])
    for name, node in tree.children.items():
        assert list(node.dataset.data_vars) == [name]
    assert tree.attrs["run_id"] == run and tree.attrs["trust"] == "exploratory"
    assert set(tree.attrs["gauge"]) == set(tree.attrs["units"]) == set(tree.children)
    layers = list(range(N_LAYERS))
    patch = tree["patch_effect"].dataset["patch_effect"]
    assert list(patch.component.values) == ["resid", "attn", "mlp"] and list(patch.layer.values) == layers
    dla = tree["dla"].dataset["dla"]
    assert list(dla.component.values) == ["embed", "attn", "mlp"] and list(dla.layer.values) == [-1, *layers]
    assert list(tree["dla_heads"].dataset["dla_heads"].layer.values) == layers
    assert "component" not in tree["lens"].dataset.coords and "layer" not in tree["margin"].dataset.coords
    for name in ("patch_effect", "attribution_patch_effect", "dla_heads", "lens", "margin", "reward"):
        values = tree[name].dataset[name].values
        assert np.isfinite(values).all(), name                  # no cell padded to another variable's coords
    # dla's own grid: a cell is NaN exactly where it names no unit (layer −1: embed only; else attn, mlp)
    unit = np.array([str(u) for u in dla["unit"].values.ravel()]).reshape(dla["unit"].shape)
    assert (np.isnan(dla.values) == (unit == "")[None]).all()
    np.testing.assert_allclose(dla.sum(["layer", "component"]), tree["margin"].dataset["margin"], atol=1e-5)
    # the package's reader gives the same variables, and an explicit outer join is what pads
    res = open_store(url).load(run, "battery", lazy=False)
    assert isinstance(res, Result) and list(res) == list(tree.attrs["output_variables"])
    xr.testing.assert_equal(res["patch_effect"].reset_coords(drop=True), patch.load().reset_coords(drop=True))
    labels = {"dimension", "prompt_id", "prompt_truncated", "response_truncated", "empty_response", "identical_sides"}
    assert set(tree.dataset.coords) == {"pair"} | labels                # the run's pair labels, stored once
    assert not labels & set(patch.coords)                               # not again in each variable's group
    for k in labels:                                                    # and given back by the reader
        np.testing.assert_array_equal(res["patch_effect"][k].values, tree.dataset[k].values)
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


def test_a_layout_2_store_is_read_after_migrate(tmp_path):
    """Layout 2 wrote each observable as one Dataset in its group; such runs stay readable."""
    url = str(tmp_path / "old.zarr")
    lens = xr.Dataset({"raw": (("pair", "layer"), np.arange(6.0).reshape(2, 3), {"units": "reward"})},
                      coords={"pair": ["a", "b"], "layer": [-1, 0, 1]})
    write_run(url, "r", {"lens": lens}, {"model": "m"})
    att = json.load(open(os.path.join(url, "runs", "r", "zarr.json")))["attributes"]["attempt"]
    group = os.path.join(url, "runs", "r", att, "lens")
    shutil.rmtree(group)
    old = lens.copy()
    old.attrs = {"run_id": "r", "trust": "exploratory"}
    old.assign_coords(pair=np.array(["a", "b"], dtype=object)).to_zarr(
        url, group=f"runs/r/{att}/lens", mode="w", consolidated=False, zarr_format=3)
    root = os.path.join(url, "zarr.json")
    doc = json.load(open(root))
    doc["attributes"]["reward_lens_spec_layout"] = 2
    json.dump(doc, open(root, "w"))
    with pytest.raises(StoreError, match="older than this package's 3.*store migrate"):
        open_store(url)
    assert migrate(url) == 3
    res = open_store(url).load("r", "lens", lazy=False)
    assert list(res) == ["raw"] and res.attrs["run_id"] == "r"
    np.testing.assert_array_equal(res["raw"].values, lens["raw"].values)


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
    att = json.load(open(os.path.join(url, "runs", "r", "zarr.json")))["attributes"]["attempt"]
    doc_path = os.path.join(url, "runs", "r", att, "score", "zarr.json")
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
