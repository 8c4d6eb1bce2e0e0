"""Store layout 3 written and read through ``store.zarr_io`` (one concurrent pass of zarr's async API):
the same bytes as ``Dataset.to_zarr``, read by plain xarray exactly, digests equal to a read-back, a
flipped bit still failing its crc32c checksum, and never writing over an existing group."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import xarray as xr
import zarr

from reward_lens_spec.errors import StoreError
from reward_lens_spec.result import Result
from reward_lens_spec.store import open_store, write_run
from reward_lens_spec.store.groups import (WRITE_KW, ZARR_KW, set_group_attrs, shared_pair_labels,
                                           variable_dataset, write_labels, write_variables, written_digests)
from reward_lens_spec.store.writer import stored_digests
from reward_lens_spec.store.zarr_read import read_groups

N = 12


def mixed() -> Result:
    """Every dtype a result holds: float32 with NaN, float64, int, bool, strings, a 0-d value, times; shared
    pair labels (a string and a bool flag) and a label one variable lacks."""
    rng = np.random.default_rng(3)
    pair = [f"p{i:03d}" for i in range(N)]
    lab = {"pair": pair, "dimension": ("pair", np.array(["helpful", "harmless"] * (N // 2))),
           "flag": ("pair", np.arange(N) % 3 == 0)}
    f = rng.standard_normal((N, 4)).astype(np.float32)
    f[2, 1] = np.nan
    out = {
        "margin": xr.DataArray(rng.standard_normal(N), dims="pair", coords=lab,
                               attrs={"units": "reward units", "gauge": "margin"}),
        "lens": xr.DataArray(f, dims=("pair", "layer"), coords={**lab, "layer": np.arange(-1, 3)},
                             attrs={"units": "reward units", "list": [1, 2]}),
        "count": xr.DataArray(np.arange(N) % 4, dims="pair", coords={**lab, "extra": ("pair", np.arange(N) * 2.0)}),
        "agree": xr.DataArray(np.arange(N) % 2 == 0, dims="pair", coords=lab),
        "best": xr.DataArray(np.array([f"tok{i}" for i in range(N)]), dims="pair", coords=lab),
        "total": xr.DataArray(np.float64(1.5), attrs={"units": "nats"}),
        "when": xr.DataArray(np.array(["2026-01-01", "2026-06-01"], dtype="datetime64[ns]"), dims="t",
                             coords={"t": ["a", "b"]}),
    }
    return Result(out, {"note": "mixed"})


def files(root: str) -> dict:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            raw = open(p, "rb").read()
            out[os.path.relpath(p, root)] = json.loads(raw) if n == "zarr.json" else raw
    return out


def xarray_layout(zs, res: Result, group: str, attrs: dict) -> None:
    """Store layout 3 written variable by variable with ``Dataset.to_zarr`` (the path before zarr_io)."""
    pair = next(v["pair"].variable for v in res.values() if "pair" in v.dims)
    shared = shared_pair_labels(res)
    write_labels(zs, group, pair, shared)
    for name, da in res.items():
        if "pair" in da.dims:
            da = da.drop_vars([k for k in shared if k in da.coords])
        variable_dataset(da, name).to_zarr(zs, group=f"{group}/{name}", mode="w-", **WRITE_KW)
    set_group_attrs(zs, group, {**attrs, "output_variables": list(res)})


def new_store(path) -> zarr.storage.LocalStore:
    zs = zarr.storage.LocalStore(str(path))
    zarr.open_group(zs, mode="w-", zarr_format=3)
    return zs


def test_same_bytes_as_to_zarr_and_plain_xarray_reads_it(tmp_path):
    res, attrs = mixed(), {"run_id": "r", "trust": "exploratory"}
    a, b = new_store(tmp_path / "a"), new_store(tmp_path / "b")
    xarray_layout(a, res, "obs", attrs)
    chunks = write_variables(b, res, "obs", attrs)
    assert chunks is not None and set(chunks) == set(res)
    fa, fb = files(str(tmp_path / "a")), files(str(tmp_path / "b"))
    assert sorted(fa) == sorted(fb) and len(fa) > 30
    for k in fa:
        assert fa[k] == fb[k], k                       # every document and every encoded chunk
    # every array carries the crc32c checksum codec
    docs = [v for k, v in fb.items() if k.endswith("zarr.json") and v["node_type"] == "array"]
    assert docs and all(any(c["name"] == "crc32c" for c in d["codecs"]) for d in docs)
    # plain xarray: one variable by pair id, with its own coords, values and attrs
    url = str(tmp_path / "b")
    for name, da in res.items():
        got = xr.open_zarr(url, group=f"obs/{name}", **ZARR_KW)[name].load()
        assert got.dims == da.dims and got.attrs == da.attrs
        np.testing.assert_array_equal(got.values, da.values)
        for c in got.coords:
            np.testing.assert_array_equal(got[c].values, da[c].values)
    tree = xr.open_datatree(url, group="obs", engine="zarr", consolidated=False)
    assert set(tree.children) == set(res)
    assert tree.attrs["output_variables"] == list(res) and tree.attrs["trust"] == "exploratory"
    np.testing.assert_array_equal(tree["flag"].values, res["margin"]["flag"].values)


def test_read_groups_as_open_zarr_and_digests_as_read_back(tmp_path):
    res = mixed()
    zs = new_store(tmp_path / "s")
    chunks = write_variables(zs, res, "obs", {"x": 1})
    labels, read = read_groups(zs, "obs", list(res), shared=("pair",))
    want = xr.open_zarr(zs, group="obs", chunks=None, **ZARR_KW).load()
    assert labels.load().identical(want.drop_indexes(list(want.xindexes)))
    for name in res:
        ref = xr.open_zarr(zs, group=f"obs/{name}", chunks=None, drop_variables=["pair"], **ZARR_KW).load()
        got = read[name].load()
        assert set(got.variables) == set(ref.variables) and got.attrs == ref.attrs
        for k in ref.variables:
            assert got.variables[k].identical(ref.variables[k]), (name, k)
            ea, eb = got[k].encoding, ref[k].encoding
            assert set(ea) == set(eb), (name, k)
            for e in ea:                         # fill values may be NaN
                nan = isinstance(ea[e], (float, np.floating)) and math.isnan(ea[e]) and math.isnan(eb[e])
                same = nan or ea[e] == eb[e]
                assert same, (name, k, e)
    # the digests sealed with the run: of the values written, equal to reading the stored arrays back
    assert written_digests(res, chunks) == stored_digests(zs, "obs")
    # a size limit leaves big variables to a lazy read
    _, some = read_groups(zs, "obs", list(res), shared=("pair",), max_bytes=N * 8)
    assert some["lens"] is None and some["margin"] is not None


def test_loaded_run_equals_what_was_written_and_a_flipped_bit_fails(tmp_path):
    url, res = str(tmp_path / "store.zarr"), mixed()
    write_run(url, "r1", {"obs": res}, {"note": "t"})
    store = open_store(url)
    back = store.load("r1", "obs", lazy=False)
    for name, da in res.items():
        assert back[name].dims == da.dims
        np.testing.assert_array_equal(back[name].values, da.values)
        assert {c: list(np.asarray(back[name][c].values)) for c in back[name].coords} == \
            {c: list(np.asarray(da[c].values)) for c in da.coords}
    assert store.verify("r1")["status"] == "verified"
    chunk = os.path.join(url, "runs", "r1", "obs", "lens", "c.0.0")      # the published array
    raw = bytearray(open(chunk, "rb").read())
    raw[len(raw) // 2] ^= 0x01
    open(chunk, "wb").write(bytes(raw))
    with pytest.raises(Exception, match="(?i)checksum|crc"):      # plain xarray: the crc32c codec
        xr.open_zarr(url, group="runs/r1/obs", **ZARR_KW).load()
    with pytest.raises(StoreError, match="(?i)checksum|crc"):
        open_store(url).load("r1", "obs", lazy=False)
    v = open_store(url).verify("r1")
    assert not v["ok"] and v["status"] == "FAILED"


def test_never_writes_over_an_existing_group(tmp_path):
    zs = new_store(tmp_path / "s")
    res = mixed()
    write_variables(zs, res, "obs", {"x": 1})
    before = files(str(tmp_path / "s"))
    with pytest.raises(Exception, match="exists"):
        write_variables(zs, res, "obs", {"x": 2})
    assert files(str(tmp_path / "s")) == before
    with pytest.raises(ValueError, match="never one that deletes"):
        write_variables(zs, res, "obs2", mode="w")


def test_skeleton_of_dask_arrays_as_to_zarr_compute_false(tmp_path):
    """A streamed run's skeleton (dask zeros on the run's pair chunks): created, chunk grid as the dask
    chunks, coords written, data chunks not written; the same documents as ``to_zarr(compute=False)``."""
    import dask.array as dsk

    from reward_lens_spec.store.zarr_io import write_new_groups

    pair = [f"p{i}" for i in range(N)]
    tmpl = xr.DataArray(dsk.zeros((N, 3), chunks=(5, 3), dtype=np.float32), dims=("pair", "layer"),
                        coords={"pair": pair, "layer": [0, 1, 2]}, attrs={"units": "nats"})
    a, b = new_store(tmp_path / "a"), new_store(tmp_path / "b")
    variable_dataset(tmpl, "lens").to_zarr(a, group="obs/lens", mode="w-", compute=False, **WRITE_KW)
    zarr.open_group(b, path="obs", mode="w-", zarr_format=3)
    got = write_new_groups(b, {}, {"obs/lens": variable_dataset(tmpl, "lens")})
    assert got["obs/lens"]["lens"] == (5, 3)
    fa, fb = files(str(tmp_path / "a")), files(str(tmp_path / "b"))
    assert sorted(fa) == sorted(fb) and not any(k.startswith("obs/lens/lens/c") for k in fb)
    assert all(fa[k] == fb[k] for k in fa)


def test_group_labels_read_in_one_pass_equal_open_zarr(tmp_path):
    """A group's shared pair labels (``group_labels``: the group's own arrays in one concurrent read) are what
    plain ``xr.open_zarr`` of the group gives: every label, its values, dtype and attrs, in pair order."""
    from reward_lens_spec.store.groups import group_labels

    zs = new_store(tmp_path / "s")
    res = mixed()
    write_variables(zs, res, "obs", {"x": 1})
    got = group_labels(zs, "obs")
    want = xr.open_zarr(zs, group="obs", chunks=None, **ZARR_KW)
    want = want.set_coords(list(want.data_vars)).load()
    assert set(got.coords) == set(want.coords) == {"pair", "dimension", "flag"}
    for k in want.coords:
        assert got[k].dims == want[k].dims and got[k].attrs == want[k].attrs, k
        np.testing.assert_array_equal(got[k].values, want[k].values, err_msg=k)
        assert got[k].dtype == want[k].dtype, k
    assert list(got["pair"].values) == [f"p{i:03d}" for i in range(N)]


def test_region_writes_in_one_pass_as_to_zarr_region(tmp_path):
    """A streamed chunk's regions (``zarr_io.write_regions``: float with NaN, int, bool, an operator's own
    per-pair coord) give the same stored bytes as ``to_zarr(region=...)`` into the same skeleton, the last
    chunk partial; a string or CF-encoded variable is refused before anything is written."""
    import dask.array as dsk

    from reward_lens_spec.store.zarr_io import plain_region, write_regions

    rng = np.random.default_rng(5)
    f = rng.standard_normal((N, 3)).astype(np.float32)
    f[4, 2] = np.nan
    full = {"lens": xr.DataArray(f, dims=("pair", "layer"), coords={"n_tok": ("pair", np.arange(N) * 3)}),
            "flag": xr.DataArray(np.arange(N) % 3 == 0, dims="pair"),
            "count": xr.DataArray(np.arange(N, dtype=np.int64) * 7, dims="pair")}
    trees = {}
    for way in ("xarray", "one_pass"):
        zs = new_store(tmp_path / way)
        for name, v in full.items():
            coords = {k: xr.Variable(c.dims, dsk.zeros(c.shape, chunks=5, dtype=c.dtype)) for k, c in v.coords.items()}
            tmpl = xr.DataArray(dsk.zeros(v.shape, chunks=(5,) + v.shape[1:], dtype=v.dtype), dims=v.dims,
                                coords=coords)
            variable_dataset(tmpl, name).to_zarr(zs, group=f"obs/{name}", mode="w-", compute=False, **WRITE_KW)
        for a in range(0, N, 5):
            sl = slice(a, min(a + 5, N))
            for name, v in full.items():
                part = v.isel(pair=sl)
                if way == "xarray":
                    part.to_dataset(name=name).to_zarr(zs, group=f"obs/{name}", region={"pair": sl}, **WRITE_KW)
                else:
                    own = [(name, part.variable), *((c, part.coords[c].variable) for c in part.coords)]
                    assert all(plain_region(x) for _, x in own)
                    write_regions(zs, [(f"obs/{name}/{k}", (sl,) + (slice(None),) * (x.ndim - 1), x)
                                       for k, x in own])
        trees[way] = files(str(tmp_path / way))
    assert sorted(trees["xarray"]) == sorted(trees["one_pass"])
    assert any(k.startswith("obs/lens/lens/c") for k in trees["one_pass"])
    assert all(trees["xarray"][k] == trees["one_pass"][k] for k in trees["xarray"]), \
        [k for k in trees["xarray"] if trees["xarray"][k] != trees["one_pass"][k]]
    back = xr.open_zarr(str(tmp_path / "one_pass"), group="obs/lens", chunks=None, **ZARR_KW)
    np.testing.assert_array_equal(back["lens"].values, f)
    zs = zarr.storage.LocalStore(str(tmp_path / "one_pass"))
    s = xr.Variable("pair", np.array(["a"] * 5, dtype=object))
    before = files(str(tmp_path / "one_pass"))
    with pytest.raises(ValueError, match="to_zarr"):
        write_regions(zs, [("obs/count/count", (slice(0, 5),), full["count"].variable[:5]),
                           ("obs/flag/flag", (slice(0, 5),), s)])
    assert files(str(tmp_path / "one_pass")) == before


def _same_encoding(ea: dict, eb: dict, where) -> None:
    assert set(ea) == set(eb), where
    for e in ea:                                   # fill values may be NaN
        nan = isinstance(ea[e], (float, np.floating)) and math.isnan(ea[e]) and math.isnan(eb[e])
        assert nan or ea[e] == eb[e], (where, e)


def test_read_staged_equals_a_read_of_the_store(tmp_path):
    """What ``write_new_groups`` wrote, built from the values it kept (``read_staged``: no store read, no
    decode of its bytes), is what ``read_groups`` reads from the store: every variable, value, dtype, attr and
    encoding, in arrays of its own; a group it did not write, or an array kept without its values, gives None."""
    from reward_lens_spec.store.staged import read_staged
    from reward_lens_spec.store.zarr_io import Written, write_new_groups

    res = mixed()
    zs = new_store(tmp_path / "s")
    staged = Written()
    pair = res["margin"]["pair"].variable
    shared = shared_pair_labels(res)
    from reward_lens_spec.store.groups import label_dataset, with_checksum
    first = {"obs": label_dataset(pair, shared, direct=True)}
    then = {f"obs/{n}": with_checksum(da.drop_vars([k for k in shared if k in da.coords]).to_dataset(name=n))
            for n, da in res.items()}
    write_new_groups(zs, first, then, attrs_of=("obs", {"x": 1, "nan": float("nan")}), staged=staged)
    want_root, want = read_groups(zs, "obs", list(res), shared=("pair",))
    got_root, got = read_staged(staged, "obs", list(res), shared=("pair",))
    for g, w, where in [(got_root, want_root, "obs"), *((got[n], want[n], n) for n in res)]:
        assert set(g.variables) == set(w.variables) and set(g.attrs) == set(w.attrs), where
        assert json.dumps(g.attrs, sort_keys=True) == json.dumps(w.attrs, sort_keys=True), where
        for k in w.variables:
            assert g.variables[k].identical(w.variables[k]), (where, k)
            assert g.variables[k].dtype == w.variables[k].dtype, (where, k)
            assert type(g.variables[k].data) is type(w.variables[k].data), (where, k)
            assert g.variables[k].values.flags.c_contiguous, (where, k)
            assert not any(np.shares_memory(g.variables[k].values, a) for a in staged.arrays.values()), (where, k)
            _same_encoding(g[k].encoding, w[k].encoding, (where, k))
    assert read_staged(staged, "obs", ["nope"]) is None and read_staged(staged, "other", []) is None
    assert staged and all(k.endswith("zarr.json") for k in staged)    # documents only: no encoded chunk is held
    # a float array's values alone (a run's head logits), as plain xarray reads them; None for what it decodes
    from reward_lens_spec.store.staged import staged_values
    logits = res["lens"].values.reshape(N, 2, 2)
    plain = xr.Dataset({"head_logits": (("pair", "side", "output"), logits)})
    write_new_groups(zs, {}, {"scratch/head_logits": with_checksum(plain)}, staged=staged)
    got = staged_values(staged, "scratch/head_logits/head_logits")
    want = xr.open_zarr(zs, group="scratch/head_logits", chunks=None, **ZARR_KW)["head_logits"].values
    assert got.dtype == want.dtype == np.float32 and np.isnan(got).sum() == 1
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(got, logits, equal_nan=True)
    for other in ("count", "when", "lens", "nope"):         # ints, times, units (maybe a time): xarray decodes
        assert staged_values(staged, f"obs/{other}/{other}") is None, other
    del staged.arrays["obs/lens/lens"]
    assert read_staged(staged, "obs", ["lens"], shared=("pair",)) is None
    staged.clear()
    assert not staged and not staged.arrays


def test_label_chunks_reused_only_for_equal_values(tmp_path):
    """Label arrays (strings, flags) encoded once per distinct values (``zarr_sync``): a second write of
    other labels, same shape and dtype, stores its own bytes, as ``to_zarr`` does."""
    res = mixed()
    other = Result({k: v.assign_coords(dimension=("pair", np.roll(v["dimension"].values, 1)),
                                       flag=("pair", ~v["flag"].values)) if "pair" in v.dims else v
                    for k, v in res.items()}, res.attrs)
    for i, r in enumerate((res, other, res)):
        a, b = new_store(tmp_path / f"a{i}"), new_store(tmp_path / f"b{i}")
        xarray_layout(a, r, "obs", {"i": i})
        write_variables(b, r, "obs", {"i": i})
        fa, fb = files(str(tmp_path / f"a{i}")), files(str(tmp_path / f"b{i}"))
        assert sorted(fa) == sorted(fb) and all(fa[k] == fb[k] for k in fa), i
    assert files(str(tmp_path / "b0"))["obs/flag/c/0"] != files(str(tmp_path / "b1"))["obs/flag/c/0"]


def test_opened_variables_carry_the_coords_encoding_a_plain_read_gives(tmp_path):
    """``open_variables`` (each variable with the group's labels) gives every coord the values, dtype, attrs
    and encoding ``xr.open_zarr`` gives it, and coords that are the variable's own copies."""
    from reward_lens_spec.store.groups import group_labels, open_variables

    res = mixed()
    zs = new_store(tmp_path / "s")
    write_variables(zs, res, "obs", {"x": 1})
    got = open_variables(zs, "obs", lazy=False)
    labels = xr.open_zarr(zs, group="obs", chunks=None, **ZARR_KW)
    for name in res:
        ref = xr.open_zarr(zs, group=f"obs/{name}", chunks=None, **ZARR_KW)[name].load()
        g = got[name]
        for c in g.coords:
            want = ref[c] if c in ref.coords else labels[c]
            assert g[c].variable.identical(want.variable.load()) and g[c].dtype == want.dtype, (name, c)
            _same_encoding(g[c].encoding, want.encoding, (name, c))
    a, b = got["margin"], got["count"]
    assert a.coords.variables["dimension"] is not b.coords.variables["dimension"]
    assert not np.shares_memory(a["flag"].values, group_labels(zs, "obs")["flag"].values)


def test_upload_to_a_synchronous_filesystem_runs_in_the_calling_thread_with_each_batch_fenced(tmp_path, monkeypatch):
    """On ``memory://`` (a synchronous filesystem zarr wraps call by call) a fenced ``write_new_groups`` runs
    its existence checks and its three batches in the calling thread (no worker-thread call; before: one), in
    the same order: the writer's role checked before the parents' documents, before the new keys, and before
    the group document stored last;
    the keys are those the generic route stores (a local store); an existing group refuses before anything
    is written, and a failed role check stops the upload there."""
    import asyncio
    import uuid

    from reward_lens_spec.store.groups import label_dataset, with_checksum
    from reward_lens_spec.store.leases import fenced_store
    from reward_lens_spec.store.zarr_io import write_new_groups

    res = mixed()
    pair, shared = res["margin"]["pair"].variable, shared_pair_labels(res)
    first = {"a/obs": label_dataset(pair, shared, direct=True)}
    then = {f"a/obs/{n}": with_checksum(da.drop_vars([k for k in shared if k in da.coords]).to_dataset(name=n))
            for n, da in res.items()}
    url = f"memory://direct-{uuid.uuid4().hex}"
    inner = zarr.storage.FsspecStore.from_url(url)
    fs = inner.fs.sync_fs
    root = inner.path.rstrip("/")
    seen = []

    def guard():
        seen.append(sorted(k[len(root) + 1:] for k in fs.find(root)))
        if len(seen) == fail_at:
            raise StoreError("role lost")

    hops = []
    real = asyncio.to_thread
    monkeypatch.setattr(asyncio, "to_thread", lambda f, *a, **k: (hops.append(f), real(f, *a, **k))[1])
    fail_at = None
    write_new_groups(fenced_store(inner, guard), first, then, attrs_of=("a/obs", {"x": 1}))
    assert hops == [] and len(seen) == 3
    assert seen[0] == [] and seen[1] == ["a/zarr.json", "zarr.json"] and "a/obs/zarr.json" not in seen[2]
    local = new_store(tmp_path / "l")
    write_new_groups(local, first, then, attrs_of=("a/obs", {"x": 1}))
    got = {k[len(root) + 1:]: fs.cat_file(k) for k in fs.find(root)}
    got = {k: json.loads(v) if k.endswith("zarr.json") else v for k, v in got.items()}
    assert got == files(str(tmp_path / "l"))
    with pytest.raises(zarr.errors.ContainsGroupError):
        write_new_groups(fenced_store(inner, guard), {}, {"a/obs/margin": then["a/obs/margin"]})
    assert len(seen) == 3
    other = zarr.storage.FsspecStore.from_url(f"memory://direct-{uuid.uuid4().hex}")
    seen.clear()
    fail_at = 2
    with pytest.raises(StoreError, match="role lost"):
        write_new_groups(fenced_store(other, guard), first, then)
    assert sorted(k.rsplit("/", 1)[-1] for k in other.fs.sync_fs.find(other.path)) == ["zarr.json"] * 2


def test_decoded_hands_over_the_values_it_is_given():
    """``zarr_read.decoded`` (the last step of ``read_groups`` and ``read_staged``, whose variables are made for
    that read alone) decodes them as ``xr.open_zarr`` does without copying their data; their attrs and encoding
    are the Dataset's own dicts."""
    from reward_lens_spec.store.zarr_read import decoded

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    given = {"x": xr.Variable(("pair", "side"), x, {"_FillValue": np.float32(np.nan), "gauge": "g"},
                              {"chunks": (3, 2), "preferred_chunks": {"pair": 3, "side": 2}})}
    ds = decoded(given, {"x_attr": 1})
    assert np.shares_memory(ds["x"].values, x) and np.array_equal(ds["x"].values, x)
    assert ds["x"].attrs == {"gauge": "g"} and ds.attrs == {"x_attr": 1}
    ds["x"].attrs["gauge"] = "h"
    ds["x"].encoding["chunks"] = (1, 1)
    assert given["x"].attrs["gauge"] == "g" and given["x"].encoding["chunks"] == (3, 2)


def test_object_strings_same_bytes_as_to_zarr(tmp_path, monkeypatch):
    """Object arrays of ``str`` (a pair index as pandas holds it, a string variable) go to zarr as variable-length
    strings without xarray inferring each element's type; other object arrays (with ``None``) through xarray's
    inference as before: every key the bytes ``to_zarr`` writes."""
    import pandas as pd
    from xarray.backends import zarr as xzarr

    from reward_lens_spec.store.zarr_io import write_new_groups

    ids = pd.Index(np.array([f"p{i:03d}" for i in range(N)], dtype=object), dtype=object, name="pair")
    ds = xr.Dataset({"best": ("pair", np.array([f"tok{i}" for i in range(N)], dtype=object)),
                     "maybe": ("pair", np.array([None if i % 4 else f"m{i}" for i in range(N)], dtype=object)),
                     "x": ("pair", np.arange(N) * 0.5)}, coords={"pair": ids})
    a, b = new_store(tmp_path / "a"), new_store(tmp_path / "b")
    ds.to_zarr(a, group="obs/x", mode="w-", **WRITE_KW)
    inferred = []
    real = xzarr.ensure_dtype_not_object

    def spy(var, name=None):
        if var.dtype.kind == "O":
            inferred.append(name)
        return real(var, name)

    monkeypatch.setattr(xzarr, "ensure_dtype_not_object", spy)
    zarr.open_group(b, path="obs", mode="w-", zarr_format=3)
    write_new_groups(b, {}, {"obs/x": ds})
    fa, fb = files(str(tmp_path / "a")), files(str(tmp_path / "b"))
    assert sorted(fa) == sorted(fb) and all(fa[k] == fb[k] for k in fa)
    assert inferred == ["maybe"]
