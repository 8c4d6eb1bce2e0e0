"""Zero / mean / resample ablation at the readout token vs a naive full-sequence forward with a hook."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.engine.attn_heads import n_heads
from reward_lens_spec.models.head import get_module
from reward_lens_spec.engine.interventions import head_dim, o_proj
from reward_lens_spec.ops.ablate import resample_donors

SITE = {"resid": lambda lm, l: get_module(lm.model, lm.family.layers)[l],
        "attn": lambda lm, l: get_module(get_module(lm.model, lm.family.layers)[l], lm.family.attn),
        "mlp": lambda lm, l: get_module(get_module(lm.model, lm.family.layers)[l], lm.family.mlp)}


def _out(o):
    return o[0] if isinstance(o, tuple) else o


def naive_act(lm, ids, comp, layer):
    """The site's output at the last token of one unpadded sequence (plain forward, batch of one)."""
    got = {}
    h = SITE[comp](lm, layer).register_forward_hook(lambda m, a, o: got.__setitem__("x", _out(o)[0, -1].clone()))
    try:
        with torch.no_grad():
            lm.model(input_ids=torch.tensor([ids]))
    finally:
        h.remove()
    return got["x"]


def naive_reward(lm, ids, comp, layer, value):
    def hook(m, a, o):
        x = _out(o).clone()
        x[0, -1] = value
        return (x,) + tuple(o[1:]) if isinstance(o, tuple) else x
    h = SITE[comp](lm, layer).register_forward_hook(hook)
    try:
        with torch.no_grad():
            return float(lm.model(input_ids=torch.tensor([ids])).logits[0, 0])
    finally:
        h.remove()


@pytest.mark.parametrize("mode", ["zero", "mean", "resample"])
def test_ablation_matches_a_naive_forward_with_a_hook(family_lm, mode):
    from reward_lens_spec.spec import ObservableSpec
    lm = family_lm
    obs = ObservableSpec(name="abl", steps=[{"name": "ablation_effect", "op": "ablate", "mode": mode, "seed": 3}],
                         outputs=["ablation_effect"])
    ds, ctx = _run(lm, obs)
    enc = ctx.encoded
    sides = [[enc.chosen[p], enc.rejected[p]] for p in range(len(enc.pair_ids))]
    donors = resample_donors(len(sides), 3)
    for comp, layer in (("mlp", 0), ("attn", lm.n_layers - 1), ("resid", 1)):
        acts = [[naive_act(lm, s, comp, layer) for s in pair] for pair in sides]
        mean = torch.stack([a for pair in acts for a in pair]).double().mean(0).float()
        for p in (0, 2):
            r = []
            for side in (0, 1):
                v = {"zero": torch.zeros_like(mean), "mean": mean}.get(mode)
                if v is None:
                    v = acts[donors[p, side, 0]][donors[p, side, 1]]
                r.append(naive_reward(lm, sides[p][side], comp, layer, v))
            with torch.no_grad():
                base = [float(lm.model(input_ids=torch.tensor([s])).logits[0, 0]) for s in sides[p]]
            want = (r[0] - r[1]) - (base[0] - base[1])
            got = float(ds["ablation_effect"].isel(pair=p).sel(layer=layer, component=comp))
            assert abs(got - want) <= 5e-6 * (1 + max(map(abs, base))), (mode, comp, layer, p, got, want)


def _run(lm, obs):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    from tests.conftest import make_pairs
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name)
    ds, ctx, _ = compute(lm, make_pairs(), build_plan(obs, info), info, batch_size=4)
    return ds, ctx


def test_zero_ablating_a_head_matches_a_naive_forward():
    from reward_lens_spec.spec import ObservableSpec
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_qwen2")
    obs = ObservableSpec(name="abl", steps=[{"name": "e", "op": "ablate", "mode": "zero", "over": "head"}],
                         outputs=["e"])
    ds, ctx = _run(lm, obs)
    assert ds["e"].dims == ("pair", "layer", "head") and ds["e"].sizes["head"] == n_heads(lm.model.config)
    hd, enc = head_dim(lm), ctx.encoded

    def r(ids, layer=None, head=None):
        def pre(m, a):
            z = a[0].clone()
            z[0, -1, head * hd:(head + 1) * hd] = 0
            return (z,)
        hs = [o_proj(lm, layer).register_forward_pre_hook(pre)] if layer is not None else []
        try:
            with torch.no_grad():
                return float(lm.model(input_ids=torch.tensor([ids])).logits[0, 0])
        finally:
            for h in hs:
                h.remove()
    for p, layer, head in ((1, 2, 3), (4, 0, 0)):
        c, rj = enc.chosen[p], enc.rejected[p]
        want = (r(c, layer, head) - r(rj, layer, head)) - (r(c) - r(rj))
        assert abs(float(ds["e"].isel(pair=p).sel(layer=layer, head=head)) - want) < 5e-6


def test_resample_donors_come_from_other_pairs_and_are_seeded():
    d = resample_donors(7, 0)
    assert (d[:, :, 0] != np.arange(7)[:, None]).all()
    assert (resample_donors(7, 0) == d).all() and not (resample_donors(7, 1) == d).all()
    from reward_lens_spec.errors import SpecError
    with pytest.raises(SpecError, match="at least 2 pairs"):
        resample_donors(1, 0)


def test_ablation_mode_is_checked_at_plan_time():
    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.spec import ObservableSpec
    from tests.conftest import tiny_lm
    lm = tiny_lm()
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    obs = ObservableSpec(name="abl", steps=[{"name": "e", "op": "ablate", "mode": "median"}], outputs=["e"])
    with pytest.raises(SpecError, match="mode"):
        build_plan(obs, info)


def test_planted_unit_is_recovered_by_mean_ablation_and_a_no_op_ablation_fails(monkeypatch):
    from reward_lens_spec.ops import ablate
    from reward_lens_spec.trust.scorecard import grade
    card = grade("examples/ablation", n_pairs=6)
    assert card.criteria_passed == {"ablation_share": True}, card.describe()

    def no_op(self, ctx, targets):            # "ablates" each side with its own activation
        def values(t, pairs, side):
            site, l, _ = targets[t]
            return ctx.capture.sites[site][pairs, side, l]
        return values
    monkeypatch.setattr(ablate.Ablate, "values", no_op)
    assert not grade("examples/ablation", n_pairs=6).passed
