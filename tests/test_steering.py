"""Steering at the readout token: against the closed form through the final norm, and a naive forward."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.models.head import get_module
from reward_lens_spec.spec import ObservableSpec
from tests.test_ablation import _run, naive_act

pytestmark = pytest.mark.usefixtures("one_thread")     # tiny forwards: one torch thread is faster here


def _final_norm(lm, x):
    """The model's final norm applied to x (d_model,), written out from its weights (float64)."""
    mod = get_module(lm.model, lm.family.final_norm)
    g = mod.weight.detach().double().numpy()
    eps = float(getattr(mod, "eps", getattr(mod, "variance_epsilon", 1e-6)))
    if lm.family.norm == "layer":
        xc = x - x.mean()
        return xc / np.sqrt((xc ** 2).mean() + eps) * g + mod.bias.detach().double().numpy()
    return x / np.sqrt((x ** 2).mean() + eps) * (lm.family.norm_offset + g)


def test_steering_the_last_residual_moves_each_reward_as_the_final_norm_predicts(family_lm):
    lm = family_lm
    L = lm.n_layers - 1
    alphas = [-1.0, 0.0, 0.5, 2.0]
    steps = [{"name": "r", "op": "steer", "layer": L, "alphas": alphas, "quantity": "reward"},
             {"name": "steer_margin", "op": "steer", "layer": L, "alphas": alphas},
             {"name": "slope", "op": "steer", "layer": L, "alphas": alphas, "quantity": "slope"}]
    ds, ctx = _run(lm, ObservableSpec(name="st", steps=steps, outputs=["r", "steer_margin", "slope"]))
    enc = ctx.encoded
    W = get_module(lm.model, lm.family.head).weight.detach().double().numpy()[0]
    u = W / np.linalg.norm(W)
    sides = [[enc.chosen[p], enc.rejected[p]] for p in range(len(enc.pair_ids))]
    x = np.array([[naive_act(lm, s, "resid", L).double().numpy() for s in pair] for pair in sides])
    rho = np.sqrt((x ** 2).sum(-1).mean())
    assert ds["r"].attrs["residual_rms"] == pytest.approx(rho, rel=1e-5)
    want = np.array([[[W @ _final_norm(lm, x[p, s] + a * rho * u) for a in alphas] for s in (0, 1)]
                     for p in range(len(sides))])
    np.testing.assert_allclose(ds["r"].values, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(ds["steer_margin"].values, want[:, 0] - want[:, 1], rtol=2e-5, atol=4e-6)
    slope = np.polyfit(alphas, (want[:, 0] - want[:, 1]).T, 1)[0]
    np.testing.assert_allclose(ds["slope"].values, slope, rtol=1e-4, atol=1e-6)
    assert np.ptp(ds["r"].values, axis=-1).min() > 1e-3          # steering moved every reward


def test_steering_one_side_at_an_early_layer_matches_a_naive_forward():
    from tests.conftest import tiny_lm
    from reward_lens_spec.models.head import get_module as gm
    lm = tiny_lm("tiny_qwen2")
    alphas = [-1.0, 1.5]
    steps = [{"name": "x", "op": "capture", "site": "resid_post"},
             {"name": "md", "op": "mean_direction", "input": "x"},
             {"name": "md1", "op": "select", "input": "md", "dim": "layer", "index": 1},
             {"name": "m", "op": "steer", "input": "md1", "layer": 1, "alphas": alphas, "side": "rejected"}]
    ds, ctx = _run(lm, ObservableSpec(name="st", steps=steps, outputs=["m", "md1"]))
    enc = ctx.encoded
    sides = [[enc.chosen[p], enc.rejected[p]] for p in range(len(enc.pair_ids))]
    x = np.array([[naive_act(lm, s, "resid", 1).double().numpy() for s in pair] for pair in sides])
    md = (x[:, 0] - x[:, 1]).mean(0)
    np.testing.assert_allclose(ds["md1"].values, md, rtol=1e-5, atol=1e-7)
    u, rho = md / np.linalg.norm(md), np.sqrt((x ** 2).sum(-1).mean())
    block = gm(lm.model, lm.family.layers)[1]
    for p in (0, 3):
        for i, a in enumerate(alphas):
            def hook(m, args, o, a=a):
                y = o[0].clone() if isinstance(o, tuple) else o.clone()
                y[0, -1] += torch.as_tensor(a * rho * u, dtype=y.dtype)
                return (y,) + tuple(o[1:]) if isinstance(o, tuple) else y
            h = block.register_forward_hook(hook)
            with torch.no_grad():
                r_rej = float(lm.model(input_ids=torch.tensor([sides[p][1]])).logits[0, 0])
            h.remove()
            with torch.no_grad():
                r_cho = float(lm.model(input_ids=torch.tensor([sides[p][0]])).logits[0, 0])
            assert abs(float(ds["m"].isel(pair=p, alpha=i)) - (r_cho - r_rej)) < 5e-6


def test_mean_direction_by_dimension_and_plan_errors():
    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from tests.conftest import tiny_lm
    lm = tiny_lm()
    steps = [{"name": "h", "op": "capture", "site": "readout"},
             {"name": "md", "op": "mean_direction", "input": "h", "by": "dimension"}]
    ds, ctx = _run(lm, ObservableSpec(name="md", steps=steps, outputs=["md"]))
    h = ctx.capture.h.astype(np.float64)
    dims = np.array([p.dimension for p in ctx.pairs])
    for g in ("math", "helpfulness"):
        np.testing.assert_allclose(ds["md"].sel(dimension=g).values, (h[dims == g, 0] - h[dims == g, 1]).mean(0),
                                   rtol=1e-5, atol=1e-7)
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    for bad, match in (({"layer": 9}, "layer"), ({"layer": 0, "direction": "sideways"}, "direction"),
                       ({"layer": 0, "quantity": "slope", "alphas": [1.0]}, "alphas")):
        with pytest.raises(SpecError, match=match):
            build_plan(ObservableSpec(name="s", steps=[{"name": "s", "op": "steer", **bad}], outputs=["s"]), info)


def test_planted_unit_direction_steers_like_w_r_and_a_wrong_direction_fails(monkeypatch):
    from reward_lens_spec.ops import mean_direction
    from reward_lens_spec.trust.scorecard import grade
    card = grade("examples/steer_dose_response", n_pairs=6)
    assert card.criteria_passed == {"steer_alignment": True}, card.describe()
    real = mean_direction.MeanDirection.run

    def flipped(self, ctx, x):             # x_rejected − x_chosen: a sign slip
        out = real(self, ctx, x)
        return -out
    monkeypatch.setattr(mean_direction.MeanDirection, "run", flipped)
    assert not grade("examples/steer_dose_response", n_pairs=6).passed


def test_a_gated_head_steers_along_its_mean_effective_direction():
    from reward_lens_spec.models.gated_head import attach_gated_head
    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.models.tiny import build_tiny
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    from tests.conftest import make_pairs
    model, tok = build_tiny("tiny")
    lm = wrap_model("gated", attach_gated_head(model, 4), tok)
    L = lm.n_layers - 1
    obs = ObservableSpec(name="g", steps=[{"name": "r", "op": "steer", "layer": L, "alphas": [0.0, 1e-3],
                                           "quantity": "reward", "side": "chosen"}], outputs=["r"])
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=4, objectives=lm.head.objectives,
                    model_name=lm.name, gated=True)
    ds, ctx, _ = compute(lm, make_pairs(), build_plan(obs, info), info, batch_size=4)
    w = lm.head.directions(ctx.capture.h)[..., 0, :].reshape(-1, lm.d_model).astype(np.float64).mean(0)
    x = ctx.capture.sites["resid_post"][:, 0, L].astype(np.float64)
    rho = ds["r"].attrs["residual_rms"]
    want = lm.head.rewards(lm.norm.apply(x + 1e-3 * rho * w / np.linalg.norm(w)))[:, 0]
    np.testing.assert_allclose(ds["r"].sel(side="chosen", alpha=1e-3).values, want, rtol=1e-5, atol=1e-6)


def test_steering_every_response_token_matches_a_naive_forward():
    """positions=response: the vector is added from the first response byte to the readout token."""
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_qwen2")
    alphas = [-1.0, 0.0, 2.0]
    steps = [{"name": "m", "op": "steer", "layer": 1, "alphas": alphas, "positions": "response",
              "direction": "mean_difference", "batch_size": 3}]
    ds, ctx = _run(lm, ObservableSpec(name="st", steps=steps, outputs=["m"]))
    enc = ctx.encoded
    sides = [[enc.chosen[p], enc.rejected[p]] for p in range(len(enc.pair_ids))]
    x = np.array([[naive_act(lm, s, "resid", 1).double().numpy() for s in pair] for pair in sides])
    md = (x[:, 0] - x[:, 1]).mean(0)
    u, rho = md / np.linalg.norm(md), np.sqrt((x ** 2).sum(-1).mean())
    block = get_module(lm.model, lm.family.layers)[1]
    readout_only = 0
    by_id = {q.id: q for q in ctx.pairs}
    for p in (0, len(sides) - 1):
        pair = by_id[enc.pair_ids[p]]
        # byte-level tokenizer, plain format: the response is the last len(utf-8 bytes) tokens
        starts = [len(sides[p][s]) - len(text.encode("utf-8")) for s, text in enumerate((pair.chosen, pair.rejected))]
        for i, a in enumerate(alphas):
            r = []
            for s in (0, 1):
                def hook(m, args, o, a=a, start=starts[s]):
                    y = o[0].clone() if isinstance(o, tuple) else o.clone()
                    y[0, start:] += torch.as_tensor(a * rho * u, dtype=y.dtype)
                    return (y,) + tuple(o[1:]) if isinstance(o, tuple) else y
                h = block.register_forward_hook(hook)
                with torch.no_grad():
                    r.append(float(lm.model(input_ids=torch.tensor([sides[p][s]])).logits[0, 0]))
                h.remove()
            assert abs(float(ds["m"].isel(pair=p, alpha=i)) - (r[0] - r[1])) < 5e-6, (p, a)
        readout_only += abs(float(ds["m"].isel(pair=p, alpha=2))
                            - float(_run(lm, ObservableSpec(name="ro", steps=[{**steps[0], "positions": "readout"}],
                                                            outputs=["m"]))[0]["m"].isel(pair=p, alpha=2)))
    assert readout_only > 1e-4            # steering the whole response is not the readout-only intervention
    assert ds["m"].attrs["positions"] == "response"


def test_steering_the_response_at_the_last_layer_equals_the_readout_only_steer(family_lm):
    lm = family_lm
    L = lm.n_layers - 1
    step = {"name": "r", "op": "steer", "layer": L, "alphas": [-1.0, 0.5, 2.0], "quantity": "reward"}
    obs = ObservableSpec(name="st", steps=[step, {**step, "name": "rr", "positions": "response"}], outputs=["r", "rr"])
    ds, _ = _run(lm, obs)
    np.testing.assert_allclose(ds["rr"].values, ds["r"].values, rtol=2e-5, atol=2e-6)
    assert np.ptp(ds["rr"].values, axis=-1).min() > 1e-3


def test_steering_positions_is_checked_at_plan_time():
    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from tests.conftest import tiny_lm
    lm = tiny_lm()
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    for bad, match in (({"positions": "prompt"}, "positions"), ({"batch_size": 0}, "batch_size")):
        with pytest.raises(SpecError, match=match):
            build_plan(ObservableSpec(name="s", steps=[{"name": "s", "op": "steer", "layer": 0, **bad}],
                                      outputs=["s"]), info)
