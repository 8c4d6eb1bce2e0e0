"""Store layout 4 read by plain xarray, as a user without this package reads it; ``store migrate``.

Every plain read runs with warnings as errors. The old store is ``tests/data/store_layout3.tar.gz``, written
by the previous layout's writer (``tests/data/make_store_layout3.py``); its numbers are checked against the
same values read from its layout-3 arrays directly with zarr, before migration.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from reward_lens_spec.errors import StoreError
from reward_lens_spec.result import Result
from reward_lens_spec.store import LAYOUT_VERSION, migrate, open_store, write_run
from reward_lens_spec.store.catalog_cli import main as store_cli
from test_store import make_attrs, make_results, run_concurrently

OLD = Path(__file__).parent / "data" / "store_layout3.tar.gz"
INTERNALS = ("attempt-", "_stage", "_ctl", "_internal", "log", "keys")


def plain_tree(url, **kw) -> xr.DataTree:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_datatree(url, engine="zarr", **kw)


def plain_group(url, group, **kw) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_zarr(url, group=group, **kw)


def paths(tree: xr.DataTree) -> list[str]:
    return [node.path for node in tree.subtree]


def battery_like(seed=0):
    """dla and patch_effect: one dim name, different coordinates (layers −1…2 vs 0…2, components)."""
    rng = np.random.default_rng(seed)
    c = {"pair": ["a", "b", "c"], "dimension": ("pair", ["x", "y", "x"]), "prompt_id": ("pair", ["q", "q", "r"]),
         "empty_response": ("pair", [False, True, False])}
    dla = xr.DataArray(rng.normal(size=(3, 4, 3)), dims=("pair", "layer", "component"),
                       coords={**c, "layer": [-1, 0, 1, 2], "component": ["embed", "attn", "mlp"]},
                       attrs={"units": "reward", "gauge": "invariant"})
    patch = xr.DataArray(rng.normal(size=(3, 3, 3)), dims=("pair", "layer", "component"),
                         coords={**c, "layer": [0, 1, 2], "component": ["resid", "attn", "mlp"]},
                         attrs={"units": "reward", "gauge": "invariant"})
    margin = xr.DataArray(rng.normal(size=3), dims="pair", coords=c, attrs={"units": "reward"})
    heads = xr.DataArray(rng.normal(size=(3, 3)), dims=("pair", "layer"), coords={**c, "layer": [0, 1, 2]})
    return Result({"margin": margin, "dla": dla, "patch_effect": patch, "dla_heads": heads})


def test_open_datatree_shows_runs_and_observables_only_and_open_zarr_gives_the_same_dataset(tmp_path):
    url = str(tmp_path / "s.zarr")
    res = battery_like()
    write_run(url, "r1", {"battery": res, **make_results(0)}, make_attrs(0))
    write_run(url, "r2", make_results(1), make_attrs(1))
    tree = plain_tree(url)
    assert sorted(paths(tree)) == ["/", "/runs", "/runs/r1", "/runs/r1/battery", "/runs/r1/lens", "/runs/r1/score",
                                   "/runs/r2", "/runs/r2/lens", "/runs/r2/score"]
    assert not [p for p in paths(tree) if any(x in p for x in INTERNALS)]
    assert tree["runs/r1"].attrs["complete"] is True and tree["runs/r2"].attrs["model"] == "tiny1"
    ds = plain_group(url, "runs/r1/battery")
    xr.testing.assert_identical(ds, tree["runs/r1/battery"].to_dataset())
    assert sorted(ds.data_vars) == sorted(res) == sorted(ds.attrs["output_variables"])
    # the pair labels are coordinates of every pair variable; units, gauge and trust are attrs
    for name in res:
        assert {"dimension", "prompt_id", "empty_response"} <= set(ds[name].coords), name
        np.testing.assert_array_equal(ds[name]["dimension"].values, ["x", "y", "x"])
    assert ds.attrs["units"]["dla"] == "reward" and ds.attrs["gauge"]["patch_effect"] == "invariant"
    assert ds.attrs["trust"] == "exploratory" and ds["dla"].attrs["units"] == "reward"
    # numbers: plain values equal what was written; each variable keeps its own coordinates, never padded
    np.testing.assert_array_equal(ds["dla"].values, res["dla"].values)
    np.testing.assert_array_equal(ds["dla"]["layer"].values, [-1, 0, 1, 2])
    patch = ds["patch_effect"]
    dims = ds.attrs["stored_as"]["patch_effect"]["dims"]            # published under their own dim names
    assert sorted(dims.values()) == ["component", "layer"] and "layer" not in patch.dims
    back = patch.rename({k: v for k, v in dims.items()})
    np.testing.assert_array_equal(back["layer"].values, [0, 1, 2])
    np.testing.assert_array_equal(back["component"].values, ["resid", "attn", "mlp"])
    np.testing.assert_array_equal(back.values, res["patch_effect"].values)
    assert np.isfinite(patch.values).all() and patch.shape == (3, 3, 3)
    heads = ds["dla_heads"]                  # layer 0…2 again: a third coordinate set is not the second's name
    np.testing.assert_array_equal(heads.values, res["dla_heads"].values)
    # the package reads the same numbers, each variable under its own names, verified against the seal digests
    st = open_store(url)
    got = st.load("r1", "battery", lazy=False)
    for name, want in res.items():
        xr.testing.assert_identical(got[name].drop_attrs(), want.rename(name).drop_attrs())
    assert st.verify("r1")["status"] == "verified"
    lens = plain_group(url, "runs/r2/lens")
    xr.testing.assert_equal(lens["raw"].drop_attrs(), make_results(1)["lens"]["raw"].drop_attrs())


def test_consolidated_metadata_lists_every_run_of_concurrent_writers(tmp_path):
    url = str(tmp_path / "c.zarr")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    run_concurrently(url, 4, barrier)               # 4 processes complete runs at the same time
    tree = plain_tree(url)
    assert sorted(tree["runs"].children) == [f"run{i}" for i in range(4)]
    for i in range(4):
        np.testing.assert_array_equal(tree[f"runs/run{i}/score"]["margin"].values,
                                      make_results(i)["score"]["margin"].values)


def test_force_republishes_and_an_unfinished_run_stays_out_of_sight(tmp_path):
    url = str(tmp_path / "f.zarr")
    write_run(url, "r", make_results(0), make_attrs(0))
    assert write_run(url, "r", make_results(3), make_attrs(3), force=True)
    ds = plain_group(url, "runs/r/lens")
    np.testing.assert_array_equal(ds["raw"].values, make_results(3)["lens"]["raw"].values)
    assert ds.attrs["attempt"] == open_store(url).document("r")["attempt"]
    from reward_lens_spec.store._backend import Backend
    from reward_lens_spec.store.attempts import Attempt
    att = Attempt.create(Backend(url), "half", {"kind": "write"}, role="write")   # a writer still at work
    try:
        assert "half" not in plain_tree(url)["runs"].children
    finally:
        att.close()


def _old(tmp_path) -> str:
    with tarfile.open(OLD) as t:
        t.extractall(tmp_path, filter="data")
    return str(tmp_path / "store_layout3.zarr")


def _layout3_values(url) -> dict:
    """Every variable of every complete run of a layout-3 store, read with zarr alone (the attempt the run
    document names, one group per variable)."""
    out = {}
    for run in sorted(os.listdir(os.path.join(url, "runs"))):
        doc = os.path.join(url, "runs", run, "zarr.json")
        if not os.path.isfile(doc):
            continue
        attrs = json.load(open(doc))["attributes"]
        if not attrs.get("complete"):
            continue
        for obs in attrs["observables"]:
            for var in json.load(open(os.path.join(url, "runs", run, attrs["attempt"], obs, "zarr.json"))
                                 )["attributes"]["output_variables"]:
                a = zarr.open_array(zarr.storage.LocalStore(url), path=f"runs/{run}/{attrs['attempt']}/{obs}/{var}/{var}",
                                    mode="r")
                out[(run, obs, var)] = np.asarray(a[...])
    return out


def test_migrate_moves_a_layout_3_store_and_every_number_survives(tmp_path):
    url = _old(tmp_path)
    before = _layout3_values(url)
    docs = {r: json.load(open(os.path.join(url, "runs", r, "zarr.json"))) for r in ("r0", "r1")}
    log = sorted(os.listdir(os.path.join(url, "log")))
    assert len(before) == 6 and json.load(open(os.path.join(url, "zarr.json")))["attributes"] == {
        "reward_lens_spec_layout": 3}
    with pytest.raises(StoreError, match="older than this package's 4.*store migrate"):
        open_store(url)
    assert store_cli(["migrate", f"url={url}"]) == 0
    assert json.load(open(os.path.join(url, "zarr.json")))["attributes"] == {"reward_lens_spec_layout": LAYOUT_VERSION}
    assert sorted(os.listdir(url)) == ["_internal", "runs", "zarr.json"]
    assert sorted(os.listdir(os.path.join(url, "_internal", "log"))) == log
    for r, doc in docs.items():                        # run documents (and their seals) are not touched
        assert json.load(open(os.path.join(url, "runs", r, "zarr.json"))) == doc
    st = open_store(url)
    assert sorted(st.runs().run_id) == ["r0", "r1"] and st.incomplete() == ["crashed"]
    tree = plain_tree(url)
    assert not [p for p in paths(tree) if any(x in p for x in INTERNALS)]
    for (run, obs, var), values in before.items():
        np.testing.assert_array_equal(st.load(run, obs, lazy=False)[var].values, values)
        plain = tree[f"runs/{run}/{obs}"].to_dataset()[var]
        np.testing.assert_array_equal(plain.values, values)
        assert st.verify(run)["status"] == "verified"
    assert st.remove_incomplete(older_than_s=0) == ["crashed"]
    assert migrate(url) == LAYOUT_VERSION                  # a current store: nothing to move
    assert write_run(url, "r2", make_results(2), make_attrs(2))
    assert sorted(plain_tree(url)["runs"].children) == ["r0", "r1", "r2"]


def test_migrate_refuses_a_zarr_group_this_package_did_not_write(tmp_path, capsys):
    url = str(tmp_path / "foreign.zarr")
    zarr.open_group(url, mode="w", zarr_format=3, attributes={"title": "someone's data"})
    before = {p: open(p, "rb").read() for p in map(str, Path(url).rglob("*")) if os.path.isfile(p)}
    with pytest.raises(StoreError, match="did not write") as e:
        migrate(url)
    assert "\n" not in str(e.value) and "Fix: point url=" in str(e.value)
    assert store_cli(["migrate", f"url={url}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not write" in err[0]
    empty = str(tmp_path / "empty.zarr")                   # an empty group: no layout attr, no runs/
    zarr.open_group(empty, mode="w", zarr_format=3)
    with pytest.raises(StoreError, match="did not write"):
        migrate(empty)
    assert {p: open(p, "rb").read() for p in map(str, Path(url).rglob("*")) if os.path.isfile(p)} == before
    assert json.load(open(os.path.join(empty, "zarr.json")))["attributes"] == {}


def test_a_layout_2_run_is_published_as_it_was(tmp_path):
    """Layout 2 held each observable as one Dataset in its attempt; migration publishes it unchanged."""
    url = _old(tmp_path)
    doc = json.load(open(os.path.join(url, "runs", "r0", "zarr.json")))["attributes"]
    group = os.path.join(url, "runs", "r0", doc["attempt"], "lens")
    shutil.rmtree(group)
    lens = xr.Dataset({"raw": (("pair", "layer"), np.arange(6.0).reshape(2, 3), {"units": "reward"})},
                      coords={"pair": np.array(["a", "b"], dtype=object), "layer": [-1, 0, 1]},
                      attrs={"run_id": "r0"})
    lens.to_zarr(url, group=f"runs/r0/{doc['attempt']}/lens", mode="w", consolidated=False, zarr_format=3)
    root = os.path.join(url, "zarr.json")
    rd = json.load(open(root))
    rd["attributes"]["reward_lens_spec_layout"] = 2
    json.dump(rd, open(root, "w"))
    assert migrate(url) == LAYOUT_VERSION
    ds = plain_group(url, "runs/r0/lens")
    assert list(ds.data_vars) == ["raw"] and ds.attrs["output_variables"] == ["raw"]
    np.testing.assert_array_equal(ds["raw"].values, lens["raw"].values)


def test_a_coordinate_named_like_another_variable_is_published_under_its_own_name(tmp_path):
    url = str(tmp_path / "n.zarr")
    a = xr.DataArray([1.0, 2.0], dims="pair", coords={"pair": ["p", "q"], "weight": ("pair", [0.5, 0.25])})
    w = xr.DataArray([[3.0, 4.0]], dims=("k", "pair"), coords={"pair": ["p", "q"]})
    write_run(url, "r", {"obs": Result({"a": a, "weight": w})}, {"model": "m"})
    ds = plain_group(url, "runs/r/obs")
    np.testing.assert_array_equal(ds["weight"].values, [[3.0, 4.0]])          # the variable keeps its name
    own = ds.attrs["stored_as"]["a"]["coords"]["weight"]
    assert own != "weight" and list(ds[own].values) == [0.5, 0.25]
    got = open_store(url).load("r", "obs", lazy=False)
    xr.testing.assert_identical(got["a"].drop_attrs(), a.rename("a"))
    xr.testing.assert_identical(got["weight"].drop_attrs(), w.rename("weight"))
