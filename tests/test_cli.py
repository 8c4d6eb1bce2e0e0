"""The installed console script, end to end, in subprocesses; bad input leaves nothing visible."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

from reward_lens_spec import open_store
from tests.conftest import JOBLIB, SUBMITIT

ROOT = Path(__file__).resolve().parents[1]


def cli(tmp_path, *args, timeout=600):
    exe = Path(sys.executable).parent / "reward-lens-spec"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reward_lens_spec"]
    return subprocess.run(cmd + list(args), cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_main_job_writes_a_readable_run_and_reuses_it(tmp_path):
    res = cli(tmp_path, "dataset.limit=6")
    assert res.returncode == 0, res.stderr
    assert "run id: score-" in res.stdout and "p_chosen" in res.stdout
    url = tmp_path / "outputs" / "store.zarr"
    runs = open_store(str(url)).runs()
    assert len(runs) == 1
    run_id = runs["run_id"][0]
    score = xr.open_zarr(str(url), group=f"runs/{run_id}/score")          # no package needed
    assert set(score.data_vars) == {"reward", "margin", "p_chosen", "bt_loss", "bt_grad"}
    ds = {k: score[k] for k in score.data_vars}
    assert ds["margin"].attrs["units"] == "reward" and ds["bt_loss"].attrs["units"] == "nats"
    assert ds["reward"].dims == ("pair", "side") and score.attrs["units"]["bt_loss"] == "nats"
    prov = open_store(str(url)).provenance(run_id)
    json.dumps(prov)
    for key in ("config_yaml", "spec_hash", "model_fingerprint", "dataset_checksum", "versions", "trust"):
        assert prov[key], key
    assert prov["trust"] == "exploratory"
    again = cli(tmp_path, "dataset.limit=6", "model.batch_size=2")      # batch size does not change the id
    assert again.returncode == 0 and "reused" in again.stdout


def test_validate_prints_plan_without_a_model(tmp_path):
    res = cli(tmp_path, "validate", "observable=battery", "model=tiny_gemma2")
    assert res.returncode == 0, res.stderr
    assert "plan OK" in res.stdout and "dla" in res.stdout
    assert not (tmp_path / "outputs" / "store.zarr").exists()


@pytest.mark.parametrize("args,needle", [
    (["model.source=./no/such/model"], "model.source"),
    (["observable=scroe"], "Did you mean 'score'"),
    (["model.batch_size=-2"], "model.batch_size"),
    (["dataset=jsonl", "dataset.path=pairs.jsonl", "dataset.fields.prompt=question"], "question"),
    (["dataset=jsonl", "dataset.path=bad.jsonl"], "line 2"),
])
def test_bad_input_is_one_clear_error_and_nothing_visible(tmp_path, args, needle):
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"id": "a", "prompt": "p", "chosen": "c", "rejected": "r"}) + "\n")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "a", "prompt": "p", "chosen": "c", "rejected": "r"})
                                        + "\n{not json\n")
    res = cli(tmp_path, *args)
    assert res.returncode != 0
    assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    url = tmp_path / "outputs" / "store.zarr"
    assert not url.exists() or len(open_store(str(url)).runs()) == 0


def test_examples_match_direct_computation(tmp_path):
    url = tmp_path / "s.zarr"
    for obs in ("dla", "lens", "examples/lens_by_dimension", "examples/mlp_attn_share"):
        res = cli(tmp_path, f"observable={obs}", "dataset.limit=14", f"store.url={url}")
        assert res.returncode == 0, res.stderr
    st = open_store(str(url))
    runs = st.runs().set_index("run_id")
    load = {r.split("-")[0]: st.load(r, lazy=False) for r in runs.index}
    lens = load["lens"]["lens"] if isinstance(load["lens"], xr.Dataset) else load["lens"]["lens"]["lens"]
    by_dim = _only(load["lens_by_dimension"])["lens_by_dimension"]
    for dim in set(lens.dimension.values):
        direct = lens.where(lens.dimension == dim, drop=True).mean("pair")
        xr.testing.assert_allclose(by_dim.sel(dimension=dim, drop=True), direct.drop_vars(
            [c for c in direct.coords if c != "layer"]))
    dla = _only(load["dla"])["dla"]
    share = _only(load["mlp_attn_share"])["margin_share"]
    direct = dla.sum("layer") / dla.sum(["layer", "component"])
    xr.testing.assert_allclose(share.reset_coords(drop=True), direct.reset_coords(drop=True))
    assert float(share.sum("component").min()) == pytest.approx(1.0, abs=1e-6)


def _only(x):
    return x if isinstance(x, xr.Dataset) else next(iter(x.values()))


def test_late_mlp_patch_example_matches_direct_patching(tmp_path):
    res = cli(tmp_path, "observable=examples/late_mlp_patch", "dataset.limit=3", "store.url=s.zarr")
    assert res.returncode == 0, res.stderr
    st = open_store(str(tmp_path / "s.zarr"))
    got = _only(st.load(st.runs()["run_id"][0], lazy=False))
    res = cli(tmp_path, "observable=patch", "dataset.limit=3", "store.url=p.zarr")
    st2 = open_store(str(tmp_path / "p.zarr"))
    full = _only(st2.load(st2.runs()["run_id"][0], lazy=False))["patch_effect"]
    direct = full.sel(component="mlp", layer=[2, 3]).sum("layer")
    xr.testing.assert_allclose(got["late_mlp_effect_total"].reset_coords(drop=True).squeeze(drop=True),
                               direct.reset_coords(drop=True).squeeze(drop=True), atol=1e-6)


@JOBLIB
def test_multirun_sweep_with_joblib_writes_one_store(tmp_path):
    res = cli(tmp_path, "-m", "model=tiny_llama,tiny_qwen2", "observable=score", "dataset.limit=3",
              "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep")
    assert res.returncode == 0, res.stderr
    runs = open_store(str(tmp_path / "sweep" / "store.zarr")).runs()
    assert sorted(runs["model"]) == ["tiny_llama", "tiny_qwen2"]


@SUBMITIT
def test_submitit_local_sweep_and_slurm_config_composes(tmp_path):
    res = cli(tmp_path, "-m", "model=tiny_gpt2", "observable=score,lens", "dataset.limit=2",
              "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "hydra.sweep.dir=sw",
              "store.url=lab.zarr")
    assert res.returncode == 0, res.stderr
    assert sorted(o for obs in open_store(str(tmp_path / "lab.zarr")).runs()["observables"] for o in obs) == ["lens", "score"]
    from hydra import compose, initialize_config_dir
    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.spec import register_configs
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher.mem_gb == 32 and "slurm" in cfg.hydra.launcher._target_.lower()
