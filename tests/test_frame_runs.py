"""Frames through config: a model and its exact re-parameterization, run as two checkpoints on disk.

Model a is tiny_llama with its norm gains folded; model b is a rotated by a random orthogonal Q in
every layer (``engine.reparam.rotate_residual``). Invariant outputs agree; raw-frame directions
differ and the compare gate refuses them; in one shared frame (fitted, stored and reused through
``frame=shared``) the directions coincide; a stored shared-frame direction projects onto the other
model exactly.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from scipy.stats import ortho_group

from reward_lens_spec.compare import CompareParams, compare_runs
from reward_lens_spec.errors import GaugeError, SpecError
from reward_lens_spec.frames import load_frame
from reward_lens_spec.engine.reparam import rotate_residual
from reward_lens_spec.models.tiny import build_tiny
from reward_lens_spec.paths import conf_dir
from reward_lens_spec.run import execute
from reward_lens_spec.spec import register_configs, validate
from reward_lens_spec.store import open_store

D = 64
FAST = CompareParams(n_boot=200, n_perm=200, n_null=500)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("reparam")
    Q = ortho_group.rvs(D, random_state=7)
    for name, rot, k in (("a", np.eye(D), 1), ("b", Q, 1), ("a2", np.eye(D), 2), ("b2", Q, 2)):
        model, tok = build_tiny("tiny_llama", seed=3, num_labels=k)
        rotate_residual(model, rot)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        (root / f"{name}.yaml").write_text(f"name: {name}\nsource: {root / name}\nnum_labels: {k}\n")
    return root


def run(root, *overrides, store="store.zarr"):
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["observable=reward_direction", "dataset.limit=60",
                                                       *overrides])
    spec = validate(cfg)
    out = execute(spec, resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=str(root),
                  store_url=str(root / store), progress=False)
    return out.run_id, open_store(str(root / store)).load(out.run_id, spec.observable.name, lazy=False)


def model_args(name, root):
    return [f"model.name={name}", f"model.source={root / name}", f"model.num_labels={2 if name.endswith('2') else 1}"]


def test_native_runs_agree_on_margins_and_the_gate_refuses_raw_directions(root):
    ra, a = run(root, *model_args("a", root), store="native.zarr")
    rb, b = run(root, *model_args("b", root), store="native.zarr")
    np.testing.assert_allclose(a["margin"], b["margin"], atol=1e-5)                  # invariant
    assert a["w_r"].attrs["gauge"] == "frame:native:a" and b["w_r"].attrs["gauge"] == "frame:native:b"
    raw = float(a["w_r"] @ b["w_r"]) / float(np.linalg.norm(a["w_r"]) * np.linalg.norm(b["w_r"]))
    assert abs(raw) < 0.5                                                              # bases differ
    url = str(root / "native.zarr")
    before = set(open_store(url).runs()["run_id"])
    with pytest.raises(GaugeError, match=r"'w_r \(run a\)'.*frame=shared"):
        compare_runs(url, ra, rb, params=FAST)
    assert set(open_store(url).runs()["run_id"]) == before                             # nothing stored
    _, res, written = compare_runs(url, ra, rb, ["margin"], FAST)
    assert written and float(res["margin"]["estimate"].sel(statistic="pearson")) > 0.99999
    assert res["margin"]["estimate"].attrs["gauge"] == "invariant"


def test_shared_frame_fitted_once_and_directions_coincide(root):
    ra, a = run(root, *model_args("a", root), "frame=shared", f"frame.partner={root / 'b.yaml'}")
    rb, b = run(root, *model_args("b", root), "frame=shared", f"frame.partner={root / 'a.yaml'}")
    st = open_store(str(root / "store.zarr"))
    frames = list(st.runs(observable="frame")["run_id"])
    assert len(frames) == 1                                         # b's run reused a's fit by its key
    gauge = a["w_r"].attrs["gauge"]
    assert gauge == b["w_r"].attrs["gauge"] == f"frame:shared:{frames[0][len('frame-'):]}"
    frame = load_frame(str(root / "store.zarr"), gauge.rsplit(":", 1)[1])
    assert frame.models == ("a", "b") and frame.provenance["reference_limit"] == 256
    assert frame.provenance["alignment_residual"] < 1e-4
    np.testing.assert_allclose(a["w_r"], b["w_r"], atol=1e-4 * float(np.abs(b["w_r"]).max()))
    np.testing.assert_allclose(a["margin"], b["margin"], atol=1e-5)
    rid, res, _ = compare_runs(str(root / "store.zarr"), ra, rb, params=FAST)
    w = res["w_r"].sel(objective="reward")
    assert float(w["cosine"]) == pytest.approx(1.0, abs=1e-6) and float(w["p_value"]) < 0.01
    assert float(w["null_abs_cosine"].sel(quantile=0.99)) < 0.5 and w["cosine"].attrs["gauge"] == gauge
    prov = st.provenance(rid)
    assert prov["runs"] == [ra, rb] and prov["trust"] == "exploratory" and prov["gauge"]["w_r"] == gauge


def test_two_objectives_are_compared_cell_by_cell(root):
    ra, a = run(root, *model_args("a2", root), "frame=shared", f"frame.partner={root / 'b2.yaml'}", store="k2.zarr")
    rb, b = run(root, *model_args("b2", root), "frame=shared", f"frame.partner={root / 'a2.yaml'}", store="k2.zarr")
    assert a["margin"].dims == ("pair", "objective") and a["w_r"].dims == ("objective", "d_model")
    _, res, _ = compare_runs(str(root / "k2.zarr"), ra, rb, params=FAST)
    assert res["margin"]["estimate"].dims == ("objective", "statistic")
    np.testing.assert_allclose(res["margin"]["estimate"], 1.0, atol=1e-5)
    assert res["w_r"]["cosine"].dims == ("objective",) and res["w_r"]["p_value"].dims == ("objective",)
    np.testing.assert_allclose(res["w_r"]["cosine"], 1.0, atol=1e-6)
    assert res["w_r"]["null_abs_cosine"].dims == ("objective", "quantile")


def test_shared_frame_direction_projects_onto_the_other_model(root):
    ra, _ = run(root, *model_args("a", root), "frame=shared", f"frame.partner={root / 'b.yaml'}")
    _, b = run(root, *model_args("b", root))                        # b's own margins, native frame
    url = root / "store.zarr"
    obs = root / "project_a.yaml"                                   # a YAML composition, no code
    obs.write_text("name: project_a\nsteps:\n  - {name: h, op: capture, site: readout}\n"
                   f"  - {{name: r, op: project, input: h, direction: 'store:{url}#{ra}/reward_direction/w_r'}}\n"
                   "  - {name: margin, op: diff, input: r}\noutputs: [margin]\n")
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.run import compute
    from reward_lens_spec.data import load_pairs
    from reward_lens_spec.models.loading import load_model
    from reward_lens_spec.spec import ModelSpec, ObservableSpec
    spec = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ObservableSpec), OmegaConf.load(obs)))
    lm_b = load_model(ModelSpec(name="b", source=str(root / "b")))
    info = PlanInfo(family=lm_b.family, n_layers=lm_b.n_layers, n_objectives=1, objectives=("reward",),
                    model_name="b")
    pairs = load_pairs("diagnostic", limit=60)
    got = compute(lm_b, pairs, build_plan(spec, info, load_observable), info)[0]
    np.testing.assert_allclose(got["margin"], b["margin"], atol=2e-4)   # a's w_r, carried over, reads b
    info_x = PlanInfo(family=lm_b.family, n_layers=lm_b.n_layers, n_objectives=1, objectives=("reward",),
                      model_name="x")                                   # a model the frame was not fitted for
    with pytest.raises(GaugeError, match="w_r"):
        compute(lm_b, pairs, build_plan(spec, info_x, load_observable), info_x)


def test_whitened_frame_is_reused_and_invariant_runs_fit_none(root):
    _, a = run(root, *model_args("a", root), "frame=whitened", "frame.reference_limit=40", store="w.zarr")
    st = open_store(str(root / "w.zarr"))
    (fid,) = [r[len("frame-"):] for r in st.runs(observable="frame")["run_id"]]
    frame = load_frame(str(root / "w.zarr"), fid)
    assert frame.provenance["n_pairs"] == 40 and a["w_r"].attrs["gauge"] == f"frame:whitened:{fid}"
    from reward_lens_spec.models.loading import load_model
    from reward_lens_spec.spec import ModelSpec
    W = load_model(ModelSpec(name="a", source=str(root / "a"))).head.W[0].astype(np.float64)
    np.testing.assert_allclose(a["w_r"].sel(objective="reward"), W @ _sqrtm(frame.covariance("a")), rtol=1e-4, atol=1e-6)   # w Σ̂^½
    run(root, *model_args("a", root), "frame=whitened", "frame.reference_limit=40", "dataset.limit=30",
        store="w.zarr")
    assert len(st.runs(observable="frame")) == 1                               # same fit key: reused
    rid, _ = run(root, *model_args("a", root), "observable=score", "frame=whitened", store="w2.zarr")
    assert open_store(str(root / "w2.zarr")).provenance(rid)["frame"]["id"] is None   # all outputs invariant
    assert len(open_store(str(root / "w2.zarr")).runs(observable="frame")) == 0
    with pytest.raises(SpecError, match="frame.id"):
        run(root, *model_args("b", root), "frame=whitened", f"frame.id={fid[:12]}", store="w.zarr")


def _sqrtm(S):
    vals, vecs = np.linalg.eigh(S)
    return (vecs * np.sqrt(vals)) @ vecs.T


def test_compare_cli_prints_and_refuses(root):
    ra, _ = run(root, *model_args("a", root), store="native.zarr")
    rb, _ = run(root, *model_args("b", root), store="native.zarr")
    url = str(root / "native.zarr")
    cmd = [sys.executable, "-m", "reward_lens_spec", "compare", f"url={url}", f"a={ra}", f"b={rb}"]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "w_r" in bad.stderr and "frame=shared" in bad.stderr
    ok = subprocess.run(cmd + ["vars=margin", "n_boot=100", "n_perm=100"], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "margin" in ok.stdout and "pearson" in ok.stdout and "stored:" in ok.stdout
    typo = subprocess.run(cmd + ["vars=margn"], capture_output=True, text=True, timeout=300)
    assert typo.returncode == 2 and "Did you mean 'margin'" in typo.stderr


def test_frames_key_on_the_body_not_the_head(root):
    from reward_lens_spec.frames.resolve import body_fingerprint
    from reward_lens_spec.models.fingerprint import model_fingerprint
    from reward_lens_spec.models.loading import wrap_model
    import torch
    model, tok = build_tiny("tiny_llama", seed=3)
    lm = wrap_model("m", model, tok)
    body, full = body_fingerprint(lm), model_fingerprint(model, tok)
    with torch.no_grad():
        model.score.weight.mul_(2.0)                                  # a new head: same activations
    assert body_fingerprint(lm) == body and model_fingerprint(model, tok) != full
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)                             # a new body: new activations
    assert body_fingerprint(lm) != body


def test_compare_refuses_what_it_cannot_mean(root):
    url = str(root / "refuse.zarr")
    ra, _ = run(root, *model_args("a", root), "frame=shared", f"frame.partner={root / 'b.yaml'}",
                "frame.reference_limit=8", store="refuse.zarr")          # 16 activations for d_model 64
    rb, _ = run(root, *model_args("b", root), "frame=shared", f"frame.partner={root / 'a.yaml'}",
                "frame.reference_limit=8", store="refuse.zarr")
    with pytest.raises(SpecError, match="frame.reference_limit above 32"):
        compare_runs(url, ra, rb, params=FAST)
    with pytest.raises(SpecError, match="same run"):
        compare_runs(url, ra, ra, ["margin"], FAST)
    frame_run = next(iter(open_store(url).runs(observable="frame")["run_id"]))
    with pytest.raises(SpecError, match="not a model's run"):
        compare_runs(url, ra, frame_run, params=FAST)
    rc, _ = run(root, *model_args("b", root), "dataset.limit=30", store="refuse.zarr")
    with pytest.raises(SpecError, match="different datasets"):
        compare_runs(url, ra, rc, ["margin"], FAST)


def test_frame_settings_are_checked_before_any_model_loads(root, tmp_path):
    from transformers import LlamaConfig

    from reward_lens_spec.planning import plan_for
    LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(tmp_path / "narrow")        # a config, no weights
    (tmp_path / "narrow.yaml").write_text(f"name: narrow\nsource: {tmp_path / 'narrow'}\n")
    register_configs()

    def plan(*over):
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["observable=reward_direction", *over])
        return plan_for(validate(cfg), str(tmp_path))

    with pytest.raises(SpecError, match=r"frame.partner.*d_model 64.*32"):
        plan("frame=shared", f"frame.partner={tmp_path / 'narrow.yaml'}")
    with pytest.raises(SpecError, match="frame.reference"):
        plan("frame=whitened", "frame.reference=no_such_set")
    with pytest.raises(SpecError, match="frame.partner"):
        plan("frame=shared", "frame.id=0123456789ab", "frame.partner=tiny_llama")
    with pytest.raises(SpecError, match="frame.partner"):
        plan("frame=shared", "frame.partner=tiny")                            # the model itself
