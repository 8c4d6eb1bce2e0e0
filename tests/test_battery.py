"""Exactness of the built-in observables on every family (float32, tiny random models)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.data import Pair
from reward_lens_spec.models.loading import wrap_model
from reward_lens_spec.models.tiny import build_tiny
from reward_lens_spec.ops.base import PlanInfo
from reward_lens_spec.registry import build_plan
from reward_lens_spec.observables import load_observable
from reward_lens_spec.run import compute
from tests.conftest import make_pairs


def run_obs(lm, name, data=None, gated=False, **restrict):
    obs = load_observable(name)
    for k, v in restrict.items():
        setattr(obs, k, v)
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives, gated=gated,
                    objectives=lm.head.objectives, model_name=lm.name,
                    layers=tuple(obs.layers) if obs.layers is not None else None,
                    components=tuple(obs.components) if obs.components else None, pairs=obs.pairs)
    plan = build_plan(obs, info, load_observable)
    ds, ctx, _ = compute(lm, data or make_pairs(), plan, info, batch_size=4)
    return ds, ctx


@pytest.fixture(scope="module")
def battery(family_lm):
    return run_obs(family_lm, "battery")


def test_dla_sums_to_margin(battery):
    ds, _ = battery
    total = ds["dla"].sum(["layer", "component"])
    np.testing.assert_allclose(total, ds["margin"], rtol=1e-4, atol=1e-6)


def test_normed_lens_ends_at_margin_and_raw_lens_is_sum_of_raw_components(battery, family_lm):
    ds, ctx = battery
    np.testing.assert_allclose(ds["lens"].sel(layer=family_lm.n_layers - 1), ds["margin"], rtol=1e-4, atol=1e-6)
    s = ctx.capture.sites
    comps = s["embed"][:, :, 0] + s["attn_out"].sum(2) + s["mlp_out"].sum(2)
    raw = (comps[:, 0] - comps[:, 1]) @ family_lm.head.W[0].astype(np.float64)
    np.testing.assert_allclose(ds["lens_raw"].sel(layer=family_lm.n_layers - 1), raw, rtol=1e-4, atol=1e-6)


def test_denoising_the_final_residual_restores_the_margin(battery, family_lm):
    ds, _ = battery
    last = ds["patch_restored"].sel(layer=family_lm.n_layers - 1, component="resid")
    np.testing.assert_allclose(last, 1.0, atol=1e-4)


def test_battery_shares_one_capture_pass(battery):
    _, ctx = battery
    # 5 chosen sides in batches of 4; the 5 rejected sides (patched: denoise) in their own batches
    # of 4, each as a KV-cached prefix forward then a last-token forward, the prefix caches kept
    # for patching: every token runs once
    assert ctx.counts["capture.forward_passes"] == 2 + 2 * 2
    enc = ctx.encoded
    assert ctx.counts["capture.tokens"] == sum(len(s) for s in enc.chosen + enc.rejected)
    from reward_lens_spec.engine.prefix import sliding
    # one readout-token run per kept batch; sliding-window models: one per pair (rows over its cache)
    assert ctx.counts["patch.forward_passes"] == (5 if sliding(ctx.lm) else 2)
    assert len(ctx.capture.prefixes) == 5 and len(ctx.capture.prefix_batches) == 2


def test_crystallization_fraction_is_a_depth_fraction(battery, family_lm):
    """Worked values of the operator: tests/test_numbers.py. Here: its range and its layer on real models."""
    ds, _ = battery
    frac, layer = ds["crystallization_fraction"].values, ds["crystallization_layer"].values
    assert np.all((frac >= 0) & (frac <= 1))
    np.testing.assert_allclose(frac, (layer + 1) / family_lm.n_layers)     # embedding (−1) → 0, last layer → 1


def test_faithfulness_is_a_spearman_per_pair(battery):
    from scipy.stats import spearmanr
    ds, _ = battery
    layers = list(ds["patch_effect"].layer.values)              # the patch grid has no embedding row
    assert -1 not in layers and -1 in ds["dla"].layer.values
    a = ds["dla"].sel(component=["attn", "mlp"], layer=layers).isel(pair=0).values.ravel()
    b = ds["patch_effect"].sel(component=["attn", "mlp"], layer=layers).isel(pair=0).values.ravel()
    assert ds["faithfulness"].isel(pair=0) == pytest.approx(spearmanr(a, b).statistic)


def test_head_bias_changes_rewards_but_no_output_derived_from_margins():
    model, tok = build_tiny("tiny")
    ref, _ = run_obs(wrap_model("tiny", model, tok), "battery")
    model2, _ = build_tiny("tiny")
    head = torch.nn.Linear(model2.score.in_features, 1, bias=True)
    with torch.no_grad():
        head.weight.copy_(model2.score.weight)
        head.bias.fill_(5.0)
    model2.score = head
    got, _ = run_obs(wrap_model("tiny", model2, tok), "battery")
    np.testing.assert_allclose(got["reward"], ref["reward"] + 5.0, atol=1e-5)
    for var in got.data_vars:
        if var != "reward":
            np.testing.assert_allclose(got[var], ref[var], atol=1e-5, err_msg=var)


def test_patching_a_side_into_itself_changes_nothing():
    model, tok = build_tiny("tiny_gpt2")
    same = [Pair(id=f"s{i}", prompt=f"prompt {i}", chosen=f"same answer {i}", rejected=f"same answer {i}")
            for i in range(3)]
    ds, _ = run_obs(wrap_model("tiny_gpt2", model, tok), "patch", data=same)
    np.testing.assert_allclose(ds["patch_effect"], 0.0, atol=1e-6)
    assert np.isnan(ds["patch_restored"]).all()               # 0/0: a zero margin restores nothing


def test_attribution_patching_is_exact_where_the_path_is_linear():
    from reward_lens_spec.engine.capture import capture
    from reward_lens_spec.models.formatting import encode_pairs
    from reward_lens_spec.engine.patching import attribution_patch, patch_readout
    model, tok = build_tiny("tiny_qwen2")
    lm = wrap_model("q", model, tok)
    enc = encode_pairs(tok, make_pairs(4))
    cap = capture(lm, enc, ("resid_post",), batch_size=4)
    targets = [("readout", 0), ("resid_post", lm.n_layers - 1)]
    exact, _ = patch_readout(lm, enc, cap, targets, [0, 1, 2, 3])
    approx, _ = attribution_patch(lm, enc, cap, targets, [0, 1, 2, 3])
    base = cap.logits[:, 1]
    np.testing.assert_allclose(approx[:, 0], exact[:, 0] - base, atol=1e-5)   # r = W·h + b is linear in h
    assert not np.allclose(approx[:, 1], exact[:, 1] - base, atol=1e-5)       # the final norm is not


def test_layer_and_component_subsets():
    model, tok = build_tiny("tiny")
    ds, _ = run_obs(wrap_model("tiny", model, tok), "patch", layers=[1, 3], components=["mlp"], pairs=2)
    assert ds["patch_effect"].shape == (5, 2, 1)                 # one pair axis; unpatched pairs are NaN
    assert int(np.isfinite(ds["patch_effect"]).all(["layer", "component"]).sum()) == 2
    assert list(ds.layer.values) == [1, 3]


def test_dla_heads_sum_to_attention_dla(battery, family_lm):
    ds, ctx = battery
    layers = list(range(family_lm.n_layers))
    per_layer = ds["dla_heads"].sum("head").sel(layer=layers).values
    attn = ds["dla"].sel(component="attn", layer=layers).values
    lm = family_lm
    blocks = lm.model.get_submodule(lm.family.layers)
    bias = [getattr(b.get_submodule(lm.family.o_proj), "bias", None) for b in blocks]
    gap = np.zeros_like(attn)
    if bias[0] is not None:                   # b_O belongs to no head: its frozen-norm projection is the gap
        scale, _ = lm.norm.frozen(ctx.capture.sites["resid_post"][:, :, -1])
        for l, b in enumerate(bias):
            v = b.detach().double().numpy()
            if lm.norm.kind == "layer":
                v = v - v.mean()
            w = (v * lm.norm.gain) @ lm.head.W[0].astype(np.float64)
            gap[:, l] = w * (scale[:, 0] - scale[:, 1])
    np.testing.assert_allclose(per_layer + gap, attn, rtol=1e-4, atol=1e-6)


def test_gated_head_reads_its_own_gated_score_and_dla_still_sums():
    from reward_lens_spec.models.gated_head import attach_gated_head
    model, tok = build_tiny("tiny")
    lm = wrap_model("gated", attach_gated_head(model, 4), tok)
    assert lm.head.gate is not None and lm.head.n_objectives == 4 and lm.head.n_outputs == 1
    ds, ctx = run_obs(lm, "battery", gated=True)
    assert ds["reward"].dims == ("pair", "side")                       # the gated score, no objective dim
    np.testing.assert_allclose(ds["reward"].values, ctx.capture.logits[..., 0], atol=1e-5)
    rows = ctx.capture.h.astype(np.float64) @ lm.head.W.T.astype(np.float64)
    assert not np.allclose(ds["reward"].values, rows.mean(-1), atol=1e-4)   # not a mean of rows
    np.testing.assert_allclose(ds["dla"].sum(["layer", "component"]), ds["margin"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ds["lens"].sel(layer=lm.n_layers - 1), ds["margin"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ds["patch_restored"].sel(layer=lm.n_layers - 1, component="resid"), 1.0, atol=1e-4)


def test_all_position_patching_needs_aligned_pairs_and_restores_fully():
    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.spec import ObservableSpec
    model, tok = build_tiny("tiny")
    lm = wrap_model("tiny", model, tok)
    steps = [{"name": "pe", "op": "patch", "quantity": "restored", "positions": "all"}]
    aligned = [Pair(id=f"a{i}", prompt=f"prompt {i}", chosen=f"answer {i}A", rejected=f"answer {i}B")
               for i in range(3)]
    obs = ObservableSpec(name="all_pos", steps=steps, outputs=["pe"])
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=("reward",))
    ds, _, _ = compute(lm, aligned, build_plan(obs, info), info, batch_size=4)
    # every position of any layer's residual carries all the chosen side's information downstream
    np.testing.assert_allclose(ds["pe"].sel(component="resid"), 1.0, atol=1e-4)
    with pytest.raises(SpecError, match="observable.positions.*equal"):
        compute(lm, make_pairs(3), build_plan(obs, info), info, batch_size=4)


def test_battery_with_a_patched_subset_keeps_one_pair_axis():
    model, tok = build_tiny("tiny")
    ds, _ = run_obs(wrap_model("tiny", model, tok), "battery", pairs=2)
    assert ds.sizes["pair"] == 5
    grid = ds["patch_effect"].sel(layer=[0, 1, 2, 3], component=["resid", "attn", "mlp"])
    assert np.isfinite(grid.isel(pair=[0, 1])).all()
    assert np.isnan(grid.isel(pair=[2, 3, 4])).all()
    assert np.isfinite(ds["margin"]).all()


def test_packed_patching_with_layer_skip_equals_batched_rows(family_lm, monkeypatch):
    """The packed forward (one sequence, layers below each patch run copy 0 only) against the
    independent path: one batch row per copy over a repeated cache, every layer computed."""
    from reward_lens_spec.engine import patching
    from reward_lens_spec.engine.capture import capture
    from reward_lens_spec.models.formatting import encode_pairs
    if patching.sliding(family_lm):
        pytest.skip("sliding-window models always use the batched rows")
    lm = family_lm
    enc = encode_pairs(lm.tokenizer, make_pairs(3))
    cap = capture(lm, enc, ("resid_post", "attn_out", "mlp_out"), batch_size=4)
    L = lm.n_layers
    targets = [(s, l) for l in range(L) for s in ("attn_out", "mlp_out", "resid_post")] + [("readout", 0)]
    targets = targets[::-1]                       # late patches first: active copies are not a prefix
    packed, counts = patching.patch_readout(lm, enc, cap, targets, [0, 1, 2])
    assert counts["copy_layers"] < counts["copy_layers_unskipped"]          # layers really were skipped
    monkeypatch.setattr(patching, "sliding", lambda lm: True)
    rows, _ = patching.patch_readout(lm, enc, cap, targets, [0, 1, 2])
    np.testing.assert_allclose(packed, rows, atol=1e-5 * (1 + np.abs(rows).max()))
    assert np.abs(packed - cap.logits[:3, 1][:, None]).max() > 1e-3          # the patches change rewards


def test_patching_pairs_sharing_a_base_side_matches_patching_each_alone():
    """Two pairs with the same rejected text share one kept prefix row (selected twice from the batch
    cache); each must still get its own chosen side patched in, as when patched on its own."""
    model, tok = build_tiny("tiny_qwen2")
    lm = wrap_model("q", model, tok)
    pairs = [Pair(id="a", prompt="Same prompt", chosen="first good answer", rejected="shared bad answer"),
             Pair(id="b", prompt="Same prompt", chosen="second, longer good answer", rejected="shared bad answer"),
             Pair(id="c", prompt="Other prompt here", chosen="fine", rejected="not fine at all")]
    together, _ = run_obs(lm, "patch", data=pairs)
    for i, p in enumerate(pairs):
        alone, _ = run_obs(lm, "patch", data=[p])
        np.testing.assert_allclose(together["patch_effect"].isel(pair=i), alone["patch_effect"].isel(pair=0),
                                   atol=1e-5)
    a, b = together["patch_effect"].isel(pair=0), together["patch_effect"].isel(pair=1)
    assert np.abs(a - b).max() > 1e-4                     # different sources really were patched in


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_patching_reads_base_and_patched_rewards_the_same_way(dtype):
    """Base, source and patched rewards all come from W·h + b of h, so a no-op patch is 0 and
    denoising the last residual restores 1, in bf16/fp16 too (the model's own low-precision head
    output would be off by its rounding)."""
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_gpt2", dtype=dtype)
    data = make_pairs(6) + [Pair(id="same", prompt="Q", chosen="identical", rejected="identical")]
    ds, _ = run_obs(lm, "patch", data=data)
    np.testing.assert_allclose(ds["patch_effect"].sel(pair="same"), 0.0, atol=1e-6)
    last = ds["patch_restored"].sel(layer=lm.n_layers - 1, component="resid").drop_sel(pair="same")
    np.testing.assert_allclose(last, 1.0, atol=1e-3)
