"""Result store on real local Zarr stores: round trip, reuse, catalog, concurrency, crashes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store import (LAYOUT_VERSION, decode_json_attrs, is_complete, migrate,
                                    open_store, write_run)
from reward_lens_spec.store.catalog_cli import main as store_cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")


def make_results(seed: int = 0, n_pair: int = 5, n_layer: int = 4) -> dict[str, xr.Dataset]:
    """Two observables with string coords, a non-index coord and units/gauge attrs."""
    rng = np.random.default_rng(seed)
    coords = {"pair": [f"p{seed}_{i}" for i in range(n_pair)],
              "dimension": ("pair", ["helpful", "harmless", "honest", "x", "y"][:n_pair]),
              "layer": np.arange(-1, n_layer - 1)}
    lens = xr.Dataset(
        {"raw": (("pair", "layer"), rng.normal(size=(n_pair, n_layer)),
                 {"units": "reward", "gauge": "invariant"}),
         "normed": (("pair", "layer"), rng.normal(size=(n_pair, n_layer)),
                    {"units": "reward", "gauge": "invariant", "note": None, "meta": {"k": [1, 2]}})},
        coords=coords, attrs={"observable": "lens", "seed": seed})
    score = xr.Dataset(
        {"margin": (("pair",), rng.normal(size=n_pair), {"units": "reward", "gauge": "invariant"}),
         "direction": (("pair", "d_model"), rng.normal(size=(n_pair, 3)),
                       {"units": "activation", "gauge": "frame:native"})},
        coords={k: v for k, v in coords.items() if k != "layer"})
    return {"lens": lens, "score": score}


def make_attrs(i: int = 0, **over) -> dict:
    """JSON-safe run attrs like the run engine passes."""
    attrs = {"config_yaml": f"model:\n  name: tiny{i}\nseed: {i}\n", "spec_hash": f"spec{i}",
             "model_fingerprint": f"fp{i % 2}", "model": f"tiny{i}", "dataset": "diag",
             "dataset_checksum": "sha-d", "n_effective": 5.0, "versions": {"torch": "2.x"},
             "git_sha": None, "seed": i, "device": "cpu", "dtype": "float32", "wall_s": 1.5,
             "trust": "exploratory", "gauge": {"lens": "invariant"}}
    attrs.update(over)
    return attrs


def assert_same(got, want: xr.Dataset) -> None:
    """``got`` (a ``Result``, or the observable group read by plain xarray as a DataTree) holds ``want``'s
    variables, each with exactly the coords on its own dims, and its attrs (plus the reader keys)."""
    from reward_lens_spec.result import Result
    from reward_lens_spec.store.writer import READER_KEYS

    if isinstance(got, xr.Dataset):             # plain xarray: the published group, one Dataset
        from reward_lens_spec.store.published import HIDDEN

        assert list(got.attrs["output_variables"]) == list(want.data_vars)
        got = Result({k: got[k] for k in got.attrs["output_variables"]},
                     {k: v for k, v in got.attrs.items() if k not in HIDDEN})
    assert isinstance(got, Result) and sorted(got) == sorted(want.data_vars)
    got = got.load()
    for name in want.data_vars:
        xr.testing.assert_equal(got[name], want[name])
        assert set(got[name].coords) == set(want[name].coords), name
        assert got[name].attrs == want[name].attrs, name
    assert {k: got.attrs[k] for k in want.attrs} == want.attrs
    assert set(got.attrs) - set(want.attrs) <= set(READER_KEYS) | {"gauge", "units", "provenance"}   # for readers


# Child process: wait at a shared barrier, then write one run (optionally slowly).
WRITER = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
sys.path[:0] = [cfg["repo"], cfg["tests"]]
import xarray as xr
from test_store import make_results, make_attrs
from reward_lens_spec.store import write_run
if cfg.get("slow_marker"):  # sleep after the first observable's data is stored
    from reward_lens_spec.store._backend import Backend
    owner = Backend if cfg.get("slow_hook") == "put_many" else xr.Dataset
    name = cfg.get("slow_hook", "to_zarr")
    orig = getattr(owner, name)
    def pause():
        open(cfg["slow_marker"], "w").close()
        t0 = time.time()   # sleep 60 s, or until the file cfg["resume_on"] appears
        while time.time() - t0 < 60 and not os.path.exists(cfg.get("resume_on") or "/nonexistent"):
            time.sleep(0.01)
    def slow(self, *a, **k):
        out = orig(self, *a, **k)
        pause()
        return out
    setattr(owner, name, slow)
    if name == "to_zarr":   # in-memory outputs are written by store.zarr_io, not Dataset.to_zarr
        from reward_lens_spec.store import zarr_io
        direct = zarr_io.write_new_groups
        def slow_direct(*a, **k):
            out = direct(*a, **k)
            pause()
            return out
        zarr_io.write_new_groups = slow_direct
if cfg.get("barrier"):
    open(os.path.join(cfg["barrier"], "ready_" + cfg["run_id"]), "w").close()
    t0 = time.time()
    while not os.path.exists(os.path.join(cfg["barrier"], "go")):
        assert time.time() - t0 < 120, "barrier timeout"
        time.sleep(0.005)
won = write_run(cfg["url"], cfg["run_id"], make_results(cfg["seed"]), make_attrs(cfg["seed"]),
                storage_options=cfg.get("storage_options"), force=cfg.get("force", False))
print("WON" if won else "LOST")
"""


def spawn_writer(**cfg) -> subprocess.Popen:
    """Start a writer subprocess (see WRITER) with ``cfg`` passed as JSON."""
    cfg.update(repo=REPO, tests=TESTS)
    return subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def assert_each_written_whole(store, run_ids) -> None:
    """What racing writers must leave, whatever their timing: each run complete in an attempt of its own, and
    one evidence-log entry per run, numbered without a gap or a duplicate (nothing forked or lost)."""
    docs = [store.provenance(r) for r in run_ids]
    assert all(d["complete"] is True for d in docs)
    assert len({d["attempt"] for d in docs}) == len(run_ids), [d["attempt"] for d in docs]
    assert sorted(d["seq"] for d in docs) == list(range(len(run_ids))), [d["seq"] for d in docs]


def run_concurrently(url: str, n: int, barrier, storage_options=None) -> None:
    """n writer processes released together by a barrier file; all must succeed."""
    procs = [spawn_writer(url=url, run_id=f"run{i}", seed=i, barrier=str(barrier),
                          storage_options=storage_options) for i in range(n)]
    deadline = time.time() + 120
    while len(list(barrier.glob("ready_*"))) < n:
        assert time.time() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate()[1].decode()[-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.01)
    (barrier / "go").touch()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-3000:]


@pytest.fixture
def url(tmp_path):
    return str(tmp_path / "results.zarr")


def test_round_trip_readable_with_plain_xarray(url):
    results, attrs = make_results(1), make_attrs(1)
    assert write_run(url, "r1", results, attrs) is True
    doc = json.load(open(os.path.join(url, "runs", "r1", "zarr.json")))["attributes"]
    for obs, want in results.items():   # published in the run group: one Dataset per observable
        with warnings.catch_warnings():
            warnings.simplefilter("error")                   # as docs/results.md writes it: no warning
            tree = xr.open_datatree(url, engine="zarr")
            got = xr.open_zarr(url, group=f"runs/r1/{obs}")
        assert_same(got, want)
        xr.testing.assert_identical(tree[f"runs/r1/{obs}"].to_dataset(), got)
        assert got.attrs["attempt"] == doc["attempt"]
    assert sorted(tree["runs/r1"].children) == ["lens", "score"] and sorted(tree.children) == ["runs"]
    root = json.load(open(os.path.join(url, "zarr.json")))
    assert root["attributes"] == {"reward_lens_spec_layout": LAYOUT_VERSION}
    assert doc["complete"] is True and doc["observables"] == ["lens", "score"]
    assert {k: doc[k] for k in attrs} == attrs
    prov = open_store(url).provenance("r1")
    assert json.loads(json.dumps(prov)) == prov and prov["git_sha"] is None
    runs_doc = os.path.join(url, "runs", "zarr.json")
    before = os.stat(runs_doc).st_mtime_ns
    time.sleep(0.01)
    write_run(url, "r2", make_results(2), make_attrs(2))
    assert os.stat(runs_doc).st_mtime_ns == before           # shared metadata never rewritten
    root = json.load(open(os.path.join(url, "zarr.json")))   # the root: its attrs kept, its consolidated
    assert root["attributes"] == {"reward_lens_spec_layout": LAYOUT_VERSION}   # metadata lists both runs
    listed = root["consolidated_metadata"]["metadata"]
    assert {"runs/r1/lens/raw", "runs/r2/score/margin"} <= set(listed)
    assert not [k for k in listed if "attempt-" in k or "_internal" in k or "_stage" in k]


def test_bad_attrs_and_names_refused(url):
    res = make_results()
    for bad, key in [({"versions": {"torch": np.float32(1)}}, "versions"),
                     ({"n": float("nan")}, "attrs['n']"), ({"obj": object()}, "obj"),
                     ({"complete": True}, "reserved")]:
        with pytest.raises(StoreError, match=key.replace("[", r"\[")):
            write_run(url, "r", res, bad)
    with pytest.raises(StoreError, match="run_id"):
        write_run(url, "../evil", res, {})
    with pytest.raises(StoreError, match="not an xarray.Dataset"):
        write_run(url, "r", {"lens": np.zeros(3)}, {})
    assert not os.path.exists(url)  # validated before the store is touched


def test_reuse_and_force(url):
    assert write_run(url, "r", make_results(1), make_attrs(1))
    assert write_run(url, "r", make_results(2), make_attrs(2)) is False
    store = open_store(url)
    assert_same(store.load("r", "lens"), make_results(1)["lens"])
    assert write_run(url, "r", make_results(2), make_attrs(2), force=True) is True
    assert_same(store.load("r", "lens"), make_results(2)["lens"])
    assert store.provenance("r")["seed"] == 2 and is_complete(url, "r")
    assert not is_complete(url, "nope") and not is_complete(str(url) + "-missing", "r")


def test_runs_filters_and_load(url):
    for i in range(3):
        write_run(url, f"r{i}", make_results(i), make_attrs(i, trust="calibrated" if i == 2 else
                                                            "exploratory"))
    write_run(url, "only_score", {"score": make_results(9)["score"]}, make_attrs(9, dataset="hh"))
    store = open_store(url)
    df = store.runs()
    assert set(df.run_id) == {"r0", "r1", "r2", "only_score"} and df.created.is_monotonic_increasing
    assert {"run_id", "observables", "model_fingerprint", "model", "dataset", "dataset_checksum",
            "spec_hash", "trust", "created", "wall_s"} <= set(df.columns)
    assert set(store.runs(model_fingerprint="fp0").run_id) == {"r0", "r2"}
    assert set(store.runs(observable="lens").run_id) == {"r0", "r1", "r2"}
    assert store.runs(trust="calibrated").empty          # a hand-written label is not evidence (trust.evidence)
    assert list(store.runs(trust_verified=False).run_id) == ["r2"]
    assert list(store.runs(dataset="hh").run_id) == ["only_score"]
    assert store.runs(dataset="nope").empty
    with pytest.raises(StoreError, match="Did you mean 'dataset'"):
        store.runs(datset="hh")
    lazy = store.load("r1", "lens")
    assert lazy["raw"].chunks is not None  # dask-backed
    assert_same(store.load("r1", "lens", lazy=False), make_results(1)["lens"])
    assert set(store.load("r1")) == {"lens", "score"}
    with pytest.raises(StoreError, match="Did you mean .only_score."):
        store.load("only_scor")
    with pytest.raises(StoreError, match="Did you mean 'lens'"):
        store.load("r1", "lense")
    assert store.diff("r0", "r0") == []
    assert "-  name: tiny0" in store.diff("r0", "r1") and "+seed: 1" in store.diff("r0", "r1")


def test_concurrent_writers_into_one_new_store(url, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    run_concurrently(url, 4, barrier)  # the store does not exist yet: 4 racing creators
    store = open_store(url)
    assert sorted(store.runs().run_id) == [f"run{i}" for i in range(4)]
    assert store.incomplete() == []
    assert_each_written_whole(store, [f"run{i}" for i in range(4)])
    for i in range(4):
        for obs, want in make_results(i).items():
            assert_same(store.load(f"run{i}", obs), want)
    assert json.load(open(os.path.join(url, "zarr.json")))["attributes"] == {
        "reward_lens_spec_layout": LAYOUT_VERSION}


def test_sigkill_mid_write_leaves_no_result(url, tmp_path):
    write_run(url, "good", make_results(0), make_attrs(0))
    marker = tmp_path / "sleeping"
    proc = spawn_writer(url=url, run_id="victim", seed=3, slow_marker=str(marker))
    deadline = time.time() + 120
    while not marker.exists():  # skeleton and first observable are on disk
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1].decode()
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    attempts = os.path.join(url, "_internal", "attempts", "victim")
    assert any(os.path.isdir(os.path.join(attempts, a, "lens"))   # partial data, in its attempt
               for a in os.listdir(attempts))
    store = open_store(url)
    assert list(store.runs().run_id) == ["good"]
    assert store.incomplete() == ["victim"] and not is_complete(url, "victim")
    with pytest.raises(StoreError, match="incomplete"):
        store.load("victim")
    assert write_run(url, "victim", make_results(3), make_attrs(3)) is True
    assert sorted(store.runs().run_id) == ["good", "victim"] and store.incomplete() == []
    assert_same(store.load("victim", "score"), make_results(3)["score"])


def test_failed_or_interrupted_write_is_not_a_result(url, monkeypatch):
    bad = make_results(0)
    bad["score"].attrs["unserialisable"] = {1, 2}
    with pytest.raises(StoreError, match="run r observable score"):
        write_run(url, "r", bad, make_attrs(0))
    store = open_store(url)
    assert store.incomplete() == [] and store.runs().empty  # own partial group cleaned up
    import reward_lens_spec.store.groups as groups
    portable = groups.portable

    def gc_meanwhile(ds):  # a gc of any age while this one writes: a live writer's attempt stays
        assert store.remove_incomplete(older_than_s=0) == []
        return portable(ds)
    monkeypatch.setattr(groups, "portable", gc_meanwhile)
    assert write_run(url, "r", make_results(0), make_attrs(0))
    assert_same(store.load("r", "score"), make_results(0)["score"])


def test_remove_incomplete_never_touches_complete(url):
    write_run(url, "done", make_results(0), make_attrs(0))
    os.makedirs(os.path.join(url, "runs", "crashed", "lens"))  # data, no run document
    partial = os.path.join(url, "runs", "fresh")
    os.makedirs(partial)
    doc = {"zarr_format": 3, "node_type": "group",
           "attributes": {"complete": False, "created": pd.Timestamp.now("UTC").isoformat()}}
    json.dump(doc, open(os.path.join(partial, "zarr.json"), "w"))
    store = open_store(url)
    assert store.incomplete() == ["crashed", "fresh"]
    assert store.remove_incomplete(older_than_s=3600) == ["crashed"]
    assert store.remove_incomplete() == []                 # the default age keeps a young run
    assert store.remove_incomplete(older_than_s=0) == ["fresh"]
    assert store.incomplete() == [] and list(store.runs().run_id) == ["done"]


def test_layout_versions_and_bad_urls(url, tmp_path):
    write_run(url, "r", make_results(0), make_attrs(0))
    root = os.path.join(url, "zarr.json")
    doc = json.load(open(root))
    doc["attributes"]["reward_lens_spec_layout"] = LAYOUT_VERSION + 1
    json.dump(doc, open(root, "w"))
    for call in (lambda: open_store(url), lambda: write_run(url, "s", make_results(), {})):
        with pytest.raises(StoreError, match="newer version"):
            call()
    del doc["attributes"]["reward_lens_spec_layout"]
    json.dump(doc, open(root, "w"))
    with pytest.raises(StoreError, match=f"store migrate url={url}"):
        open_store(url)
    assert migrate(url) == LAYOUT_VERSION and migrate(url) == LAYOUT_VERSION
    assert list(open_store(url).runs().run_id) == ["r"]
    plain = tmp_path / "file.zarr"
    plain.write_text("not a store")
    for call in (lambda: open_store(str(plain)), lambda: write_run(str(plain), "r", make_results(), {})):
        with pytest.raises(StoreError, match="plain file"):
            call()
    with pytest.raises(StoreError, match="no result store"):
        open_store(str(tmp_path / "missing.zarr"))
    with pytest.raises(StoreError, match="nosuchproto://x"):
        open_store("nosuchproto://x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("x")
    with pytest.raises(StoreError, match="holds other files"):
        write_run(str(tmp_path / "busy"), "r", make_results(), {})
    open(root, "w").write("{garbage")
    with pytest.raises(StoreError, match="not valid JSON"):
        open_store(url)


def test_corrupt_run_group_is_isolated(url):
    for r in ("a", "b", "c"):
        write_run(url, r, make_results(0), make_attrs(0))
    open(os.path.join(url, "runs", "b", "zarr.json"), "w").write("\x00garbage{")
    open(os.path.join(url, "runs", "c", "lens", "raw", "zarr.json"), "w").write("nope")   # the published array
    store = open_store(url)
    assert list(store.runs().run_id) == ["a", "c"]
    assert store.corrupt() == ["b"] and store.incomplete() == ["b"]
    with pytest.raises(StoreError, match="run 'b' is corrupt"):
        store.load("b")
    with pytest.raises(StoreError, match="run c observable lens"):
        store.load("c", "lens")
    assert_same(store.load("c", "score"), make_results(0)["score"])
    assert write_run(url, "b", make_results(1), make_attrs(1)) is True  # cleared and rewritten
    assert store.corrupt() == []


def test_catalog_cli(url, tmp_path, capsys):
    write_run(url, "r0", make_results(0), make_attrs(0))
    write_run(url, "r1", make_results(1), make_attrs(1))
    os.makedirs(os.path.join(url, "runs", "crashed"))
    assert store_cli(["ls", f"url={url}", "model_fingerprint=fp1"]) == 0
    out = capsys.readouterr().out
    assert "r1" in out and "r0" not in out and "1 incomplete" in out
    assert store_cli(["show", f"url={url}", "run=r0"]) == 0
    out = capsys.readouterr().out
    assert "spec_hash: spec0" in out and "observable lens:\n  raw: pair=5 × layer=4" in out
    assert store_cli(["diff", f"url={url}", "run=r0", "run_b=r1"]) == 0
    assert "+seed: 1" in capsys.readouterr().out
    csv, nc = tmp_path / "lens.csv", tmp_path / "lens.nc"
    assert store_cli(["export", f"url={url}", "run=r0", "observable=lens", f"out={csv}"]) == 0
    assert store_cli(["store", "export", f"url={url}", "run=r0", "observable=lens", f"out={nc}"]) == 0
    df = pd.read_csv(csv)
    assert len(df) == 20 and {"pair", "layer", "raw", "normed"} <= set(df.columns)
    back = decode_json_attrs(xr.open_dataset(nc, engine="scipy").load())
    assert back["normed"].attrs["meta"] == {"k": [1, 2]} and back["normed"].attrs["note"] is None
    np.testing.assert_allclose(back["raw"].values, make_results(0)["lens"]["raw"].values)
    assert store_cli(["gc", f"url={url}"]) == 0
    assert "crashed" in capsys.readouterr().out and open_store(url).incomplete() == []
    assert store_cli(["migrate", f"url={url}"]) == 0
    for bad, msg in [(["ls"], "url= is required"), (["lss", f"url={url}"], "Did you mean 'ls'"),
                     (["show", f"url={url}", "run=r9"], "no run 'r9'"),
                     (["export", f"url={url}", "run=r0", "observable=lens", "out=x.txt"], ".nc or .csv"),
                     (["ls", f"url={tmp_path / 'none.zarr'}"], "no result store")]:
        assert store_cli(bad) == 2
        assert msg in capsys.readouterr().err
    code = ("import sys; from reward_lens_spec.store.catalog_cli import main; "
            f"rc = main(['ls', 'url={url}']); assert 'torch' not in sys.modules; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and "r0" in proc.stdout, proc.stderr


def test_a_filter_that_matches_nothing_keeps_the_columns(tmp_path):
    url = str(tmp_path / "s.zarr")
    write_run(url, "only-run", {"score": xr.Dataset({"m": ("pair", np.zeros(2))})}, {"model": "m"})
    empty = open_store(url).runs(observable="scorecard")
    assert len(empty) == 0 and "run_id" in empty.columns
