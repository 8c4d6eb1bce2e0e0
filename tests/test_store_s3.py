"""Result store on S3: a real moto server on loopback, s3fs, concurrent writer processes."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

pytest.importorskip("s3fs", reason="S3 tests need s3fs (pip install 'reward_lens_spec[test]')")
pytest.importorskip("moto.server", reason="S3 tests need moto[server] (pip install 'reward_lens_spec[test]')")
pytest.importorskip("flask")
boto3 = pytest.importorskip("boto3")

import xarray as xr  # noqa: E402

from reward_lens_spec.errors import StoreError  # noqa: E402
from reward_lens_spec.store import LAYOUT_VERSION, is_complete, open_store, write_run  # noqa: E402
from test_store import (assert_each_written_whole, assert_same, make_attrs, make_results,  # noqa: E402
                        run_concurrently, spawn_writer)

KEY, SECRET = "testing", "testing"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """A moto S3 server on 127.0.0.1:<free port> for the whole session.

    Its request log goes to a file: a never-read pipe would fill and hang the server.
    """
    port = _free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w+b")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                log.seek(0)
                pytest.fail(f"moto server did not start: {log.read().decode()[-2000:]}")
            time.sleep(0.1)
    yield endpoint
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def s3(moto_endpoint):
    """(url, storage_options) of a store in a fresh bucket."""
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id=KEY,
                 aws_secret_access_key=SECRET, region_name="us-east-1").create_bucket(Bucket=bucket)
    so = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": moto_endpoint}}
    return f"s3://{bucket}/store.zarr", so


def test_s3_round_trip_catalog_and_reuse(s3):
    url, so = s3
    assert write_run(url, "r0", make_results(0), make_attrs(0), storage_options=so) is True
    assert write_run(url, "r1", make_results(1), make_attrs(1), storage_options=so) is True
    assert write_run(url, "r1", make_results(5), make_attrs(5), storage_options=so) is False
    import s3fs
    fs = s3fs.S3FileSystem(**so)
    attempt = json.loads(fs.cat_file(f"{url[5:]}/runs/r1/zarr.json"))["attributes"]["attempt"]
    for obs, want in make_results(1).items():  # a colleague without this package
        got = xr.open_zarr(url, group=f"runs/r1/{obs}", storage_options=so)
        assert_same(got, want)
        assert got.attrs["attempt"] == attempt
    store = open_store(url, storage_options=so)
    assert sorted(store.runs().run_id) == ["r0", "r1"]
    assert list(store.runs(model_fingerprint="fp1").run_id) == ["r1"]
    assert_same(store.load("r0", "lens", lazy=False), make_results(0)["lens"])
    assert store.provenance("r1")["config_yaml"] == make_attrs(1)["config_yaml"]
    assert is_complete(url, "r1", storage_options=so) and not is_complete(url, "r9",
                                                                          storage_options=so)
    assert write_run(url, "r1", make_results(5), make_attrs(5), storage_options=so, force=True)
    assert_same(store.load("r1", "score"), make_results(5)["score"])
    copied = store.load("r0")  # dask-backed: streamed by to_zarr, not staged in memory
    assert write_run(url, "copy", copied, make_attrs(0), storage_options=so)
    assert_same(store.load("copy", "lens"), make_results(0)["lens"])


def test_s3_concurrent_writers(s3, tmp_path):
    url, so = s3
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    run_concurrently(url, 2, barrier, storage_options=so)  # both also race to create the store
    store = open_store(url, storage_options=so)
    assert sorted(store.runs().run_id) == ["run0", "run1"] and store.incomplete() == []
    assert_each_written_whole(store, ["run0", "run1"])
    for i in range(2):
        for obs, want in make_results(i).items():
            assert_same(store.load(f"run{i}", obs), want)


def test_s3_sigkill_and_corrupt_run_are_isolated(s3, tmp_path):
    url, so = s3
    write_run(url, "good", make_results(0), make_attrs(0), storage_options=so)
    write_run(url, "bad", make_results(0), make_attrs(0), storage_options=so)
    store = open_store(url, storage_options=so)
    store._b.fs.pipe_file(store._b.path("runs/bad/zarr.json"), b"garbage{")
    marker = tmp_path / "sleeping"
    proc = spawn_writer(url=url, run_id="victim", seed=2, slow_marker=str(marker),
                        slow_hook="put_many", storage_options=so)
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1].decode()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert store._b.fs.glob(store._b.path("_internal/attempts/victim/attempt-*/lens/raw/zarr.json"))  # partial data
    assert list(store.runs().run_id) == ["good"]
    assert store.incomplete() == ["bad", "victim"] and store.corrupt() == ["bad"]
    assert write_run(url, "victim", make_results(2), make_attrs(2), storage_options=so) is True
    assert store.remove_incomplete() == []        # the default age keeps a just-crashed writer's work
    gone = store.remove_incomplete(older_than_s=0)
    assert gone[0] == "bad" and [g.split("/")[0] for g in gone[1:]] == ["victim"]   # the killed attempt
    assert sorted(store.runs().run_id) == ["good", "victim"] and store.incomplete() == []
    assert_same(store.load("victim", "lens"), make_results(2)["lens"])
    root = json.loads(store._b.read("zarr.json"))
    assert root["attributes"] == {"reward_lens_spec_layout": LAYOUT_VERSION}


def test_s3_unreachable_and_missing(s3):
    url, so = s3
    dead = {**so, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_free_port()}"},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}
    for call in (lambda: open_store(url, storage_options=dead),
                 lambda: write_run(url, "r", make_results(), {}, storage_options=dead)):
        with pytest.raises(StoreError, match=f"store {url}"):
            call()
    with pytest.raises(StoreError, match="no result store"):
        open_store(url, storage_options=so)
