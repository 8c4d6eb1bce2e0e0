"""Streaming runs: two-stage plans, chunked writes, resume after SIGKILL, a 4-shard joblib multirun."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest

from reward_lens_spec import open_store
from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.base import Operator, PlanInfo
from reward_lens_spec.planning import stages
from reward_lens_spec.registry import build_plan
from reward_lens_spec.run import compute
from reward_lens_spec.spec import StoreSpec
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.layout import check_layout
from reward_lens_spec.run.stream import stream
from tests.conftest import JOBLIB, SUBMITIT, assert_identical_results, make_pairs, tiny_lm

TEMPLATE = "User: {prompt}\nAssistant: {response}"


def cli(cwd, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "reward_lens_spec", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def only_run(url):
    st = open_store(str(url))
    (run_id,) = list(st.runs().run_id)
    return st, run_id, st.load(run_id, lazy=False)


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for obs in a:
        assert_identical_results(a[obs], b[obs])
        for v in a[obs]:
            x, y = a[obs][v].values, b[obs][v].values
            assert x.dtype == y.dtype and x.shape == y.shape, v
            if x.dtype.kind == "f":
                assert np.array_equal(np.atleast_1d(x).view(np.uint8), np.atleast_1d(y).view(np.uint8)), v   # bit for bit
            else:
                assert (x == y).all(), v


def plan_of(lm, name, **restrict):
    obs = load_observable(name)
    for k, v in restrict.items():
        setattr(obs, k, v)
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name, pairs=obs.pairs)
    return build_plan(obs, info, load_observable), info


def streamed(lm, pairs, plan, info, url, chunk):
    """The streaming engine in this process, into a fresh store; returns the stored Dataset."""
    enc = encode_pairs(lm.tokenizer, pairs, fmt="plain", template=TEMPLATE, max_length=512)
    b = Backend(url)
    check_layout(b, create=True)
    out = stream(b, "r", lm, pairs, enc, plan, info, capture_kw=dict(batch_size=4), frame=None,
                 store_spec=StoreSpec(chunk_pairs=chunk),
                 run_attrs=lambda counts, chunks, _, __: {"observables": [plan.observable], "chunks": chunks})
    assert out.status == "complete"
    st = open_store(url)
    return st.load("r", plan.observable, lazy=False), st.provenance("r")


def test_battery_stages_are_checked_at_plan_time():
    lm = tiny_lm("tiny_llama")
    plan, _ = plan_of(lm, "battery")
    st = stages(plan)
    for name in ("components", "components_normed", "dla", "lens", "margin", "patch_effect", "crystallization_layer"):
        assert st[name] == "pair", name
    assert st["faithfulness"] == "reduce" and st["faithfulness_pooled"] == "reduce"

    @dataclass(frozen=True)
    class P:
        pass

    class Pooled(Operator):          # says per-pair, but drops the pair dim
        name, Params, per_pair = "pooled", P, True

    step0 = plan.steps[0]
    bad = type(plan)(observable="x", steps=[step0, type(step0)(name="mean", op=Pooled(P()), inputs=[step0.name],
                                                                dims=("side",), gauge="invariant")], outputs=["mean"])
    with pytest.raises(SpecError, match="observable.x.steps.mean.*drops the 'pair' dim"):
        stages(bad)


def test_chunked_run_matches_one_chunk_and_the_in_memory_path(tmp_path):
    """chunk_pairs=3 (7 chunks) vs one chunk vs ``run.compute`` (everything in memory, no store)."""
    lm, pairs = tiny_lm("tiny_llama"), make_pairs(20)
    plan, info = plan_of(lm, "battery", pairs=5)
    small, prov = streamed(lm, pairs, plan, info, str(tmp_path / "c3.zarr"), 3)
    big, _ = streamed(lm, pairs, plan, info, str(tmp_path / "c64.zarr"), 64)
    ref, _, _ = compute(lm, pairs, plan, info, batch_size=4)
    assert prov["chunks"]["n"] == 7 and sum(prov["chunks"]["by_writer"].values()) == 7
    assert set(small.data_vars) == set(big.data_vars) == set(ref.data_vars)
    for v in ref.data_vars:
        np.testing.assert_array_equal(big[v].values, ref[v].values, err_msg=v)    # one chunk: the same batches
        # other chunks pad other batches, so float rounding may differ a little
        np.testing.assert_allclose(small[v].values, ref[v].values, rtol=1e-4, atol=1e-5, err_msg=v)
    patched = np.isfinite(small["patch_effect"].values).any(axis=(1, 2))      # observable.pairs=5 spans chunks 0, 1
    assert patched[:5].all() and not patched[5:].any()
    total = small["dla"].sum(["layer", "component"])                    # exactness holds chunk by chunk
    np.testing.assert_allclose(total, small["margin"], rtol=1e-4, atol=1e-6)
    assert list(small.pair.values) == [p.id for p in pairs]


def _markers(url):
    return glob.glob(os.path.join(url, "_internal", "attempts", "*", "attempt-*", "_ctl", "chunk.*.json"))


def test_sigkilled_run_resumes_to_the_identical_result(tmp_path):
    args = ["observable=dla", "dataset.limit=24", "store.chunk_pairs=1", "model.batch_size=1"]
    url = str(tmp_path / "killed.zarr")
    proc = subprocess.Popen([sys.executable, "-m", "reward_lens_spec", *args, f"store.url={url}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while len(_markers(url)) < 4:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1].decode()[-3000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    n_before = len(_markers(url))
    assert 4 <= n_before < 24
    st = open_store(url)
    assert st.runs().empty and len(st.incomplete()) == 1            # never listed before it is complete
    res = cli(tmp_path, *args, f"store.url={url}")                    # the same command again
    assert res.returncode == 0, res.stderr[-3000:]
    st, rid, resumed = only_run(url)
    by_writer = st.provenance(rid)["chunks"]["by_writer"]
    assert sorted(by_writer.values()) == sorted([n_before, 24 - n_before])   # only the missing chunks ran
    assert cli(tmp_path, *args, f"store.url={tmp_path / 'whole.zarr'}").returncode == 0
    _, rid2, whole = only_run(tmp_path / "whole.zarr")
    assert rid2 == rid
    assert_bit_identical(resumed, whole)


@JOBLIB
def test_four_shard_joblib_multirun_equals_one_job(tmp_path):
    # model.threads pins torch's thread count in every job: attribution patching's gradients differ in
    # their last float32 bits across thread counts, and joblib's workers default to cpu_count // n_jobs
    args = ["observable=battery", "dataset.limit=14", "observable.pairs=6", "store.chunk_pairs=2", "model.threads=1"]
    res = cli(tmp_path, "--multirun", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4", *args,
              f"store.url={tmp_path / 'sharded.zarr'}", "store.shards=4", "store.shard=0,1,2,3")
    assert res.returncode == 0, res.stderr[-3000:]
    st, rid, sharded = only_run(tmp_path / "sharded.zarr")
    prov = st.provenance(rid)
    assert prov["torch_threads"] == 1
    assert prov["chunks"]["n"] == 7 and prov["chunks"]["shards"] == 4
    assert len(prov["chunks"]["by_writer"]) == 4 and sum(prov["chunks"]["by_writer"].values()) == 7
    assert st.incomplete() == [] and len(os.listdir(os.path.join(tmp_path, "sharded.zarr", "_internal", "attempts", rid))) == 2
    assert cli(tmp_path, *args, f"store.url={tmp_path / 'single.zarr'}").returncode == 0
    _, rid1, single = only_run(tmp_path / "single.zarr")
    assert rid1 == rid
    assert_bit_identical(sharded, single)


def test_model_threads_is_checked_and_shapes_only_the_last_bits_of_gradients(tmp_path):
    bad = cli(tmp_path, "observable=score", "dataset.limit=2", "model.threads=0")
    assert bad.returncode != 0 and "model.threads" in bad.stderr and not (tmp_path / "outputs").exists()
    args = ["observable=attribution_patch", "dataset.limit=3", "observable.pairs=2"]
    got = {}
    for n in (1, 2):
        assert cli(tmp_path, *args, f"model.threads={n}", f"store.url=t{n}.zarr").returncode == 0
        st, rid, res = only_run(tmp_path / f"t{n}.zarr")
        assert st.provenance(rid)["torch_threads"] == n
        got[n] = (rid, res["attribution_patch"]["attribution_patch_effect"].values)
    assert got[1][0] == got[2][0]                        # the thread count is not part of the run id
    np.testing.assert_allclose(got[1][1], got[2][1], rtol=1e-6, atol=1e-8)


@SUBMITIT
def test_two_shard_submitit_multirun_equals_one_job(tmp_path):
    """The same sharding through Hydra's submitit launcher (its local executor: real job processes,
    as `hydra/launcher=slurm` submits them on a cluster)."""
    args = ["observable=dla", "dataset.limit=6", "store.chunk_pairs=2", "model.threads=1"]
    res = cli(tmp_path, "--multirun", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
              "hydra.sweep.dir=sw", *args, f"store.url={tmp_path / 'sharded.zarr'}", "store.shards=2",
              "store.shard=0,1")
    assert res.returncode == 0, res.stderr[-3000:]
    st, rid, sharded = only_run(tmp_path / "sharded.zarr")
    chunks = st.provenance(rid)["chunks"]
    assert chunks["n"] == 3 and chunks["shards"] == 2 and len(chunks["by_writer"]) == 2
    assert cli(tmp_path, *args, f"store.url={tmp_path / 'single.zarr'}").returncode == 0
    _, rid1, single = only_run(tmp_path / "single.zarr")
    assert rid1 == rid
    assert_bit_identical(sharded, single)


def test_bfloat16_streamed_run_self_checks_with_its_own_tolerance(tmp_path):
    """bf16 on CPU: the chunked run passes the capture self-check at bf16's tolerance, DLA still sums to
    the margin (to bf16 rounding), and a wrong readout still stops the run."""
    import torch
    from reward_lens_spec.errors import CaptureError
    from reward_lens_spec.engine.capture import TOL, capture
    lm, pairs = tiny_lm("tiny_llama", dtype="bfloat16"), make_pairs(6)
    assert lm.head.W.dtype == np.float32 and TOL["bfloat16"] > TOL["float32"]
    plan, info = plan_of(lm, "dla")
    ds, prov = streamed(lm, pairs, plan, info, str(tmp_path / "bf16.zarr"), 2)
    assert prov["chunks"]["n"] == 3
    margin = lm.head.rewards(capture(lm, encode_pairs(lm.tokenizer, pairs, fmt="plain", template=TEMPLATE),
                                     batch_size=4).h)[..., 0]
    np.testing.assert_allclose(ds["dla"].sum(["layer", "component"]), margin[:, 0] - margin[:, 1], atol=3e-2)
    enc = encode_pairs(lm.tokenizer, pairs, fmt="plain", template=TEMPLATE)
    with pytest.raises(CaptureError, match="self-check failed"):
        capture(lm, enc, ("resid_post",), batch_size=4, readout_fn=lambda m: torch.zeros(m.shape[0], dtype=torch.long))
