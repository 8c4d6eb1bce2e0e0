"""Ablation with rescue (issue 29 item 3) vs a naive full-sequence forward with a hook."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.spec import ObservableSpec
from tests.test_ablation import _run, naive_act, naive_reward

pytestmark = pytest.mark.usefixtures("one_thread")


def _obs(mode="mean", **kw):
    return ObservableSpec(name="rescue", steps=[
        {"name": q, "op": "ablate_rescue", "mode": mode, "quantity": q, **kw}
        for q in ("effect", "rescued_effect", "rescue_fraction")], outputs=["effect", "rescued_effect",
                                                                            "rescue_fraction"], **{})


def test_rescue_of_the_ablated_component_restores_the_clean_margin_and_the_effect_matches_a_naive_forward():
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_llama")
    ds, ctx = _run(lm, _obs("zero"))
    enc = ctx.encoded
    for comp, layer in (("mlp", 0), ("attn", lm.n_layers - 1), ("resid", 1)):
        for p in (0, 3):
            sides = [enc.chosen[p], enc.rejected[p]]
            with torch.no_grad():
                base = [float(lm.model(input_ids=torch.tensor([s])).logits[0, 0]) for s in sides]
            zero = torch.zeros(lm.d_model)
            abl = [naive_reward(lm, s, comp, layer, zero) for s in sides]
            # the naive rescue: the hook writes back the activation the clean forward had there
            res = [naive_reward(lm, s, comp, layer, naive_act(lm, s, comp, layer)) for s in sides]
            tol = 5e-6 * (1 + max(map(abs, base)))
            sel = dict(layer=layer, component=comp)
            got_e = float(ds["effect"].isel(pair=p).sel(**sel))
            got_r = float(ds["rescued_effect"].isel(pair=p).sel(**sel))
            got_f = float(ds["rescue_fraction"].isel(pair=p).sel(**sel))
            want_e = (abl[0] - abl[1]) - (base[0] - base[1])
            assert abs(got_e - want_e) <= tol, (comp, layer, p, got_e, want_e)
            assert abs((res[0] - res[1]) - (base[0] - base[1])) <= tol             # the naive identity
            assert abs(got_r) <= tol, (comp, layer, p, got_r)                       # exact: clean margin back
            if abs(want_e) > 1e-3:
                assert abs(got_f - 1.0) <= tol / abs(want_e) * 4, (comp, layer, p, got_f)
    assert ds["rescue_fraction"].attrs["units"] == "fraction" and ds["effect"].attrs["units"] == "reward"


def test_a_rescue_that_restores_the_wrong_activation_is_caught(monkeypatch):
    """Restoring another pair's activation instead of the ablated one leaves damage behind: the test can fail."""
    from reward_lens_spec.ops import ablate_rescue
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_llama")

    def wrong(self, ctx, targets):
        def values(t, pairs, side):
            site, l, _ = targets[t]
            a = ctx.capture.sites[site][:, side, l]
            return a[(np.asarray(pairs) + 1) % a.shape[0]]
        return values
    monkeypatch.setattr(ablate_rescue.AblateRescue, "_clean", wrong)
    ds, _ = _run(lm, _obs("mean"))
    assert np.nanmax(np.abs(ds["rescued_effect"].values)) > 1e-3


def test_planted_unit_knock_out_is_fully_rescued():
    """Planted organism: mean-ablating the planted unit's MLP moves the margin most; restoring it rescues all."""
    from reward_lens_spec.models.organisms import planted_organism
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    org = planted_organism(1.0, n_pairs=6)
    lm = org.lm
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives,
                    model_name=lm.name, components=("attn", "mlp"))
    ds, _, _ = compute(lm, list(org.pairs), build_plan(_obs("mean"), info), info, batch_size=4)
    eff = ds["effect"].mean("pair")
    assert eff.sel(component="mlp", layer=1) == eff.min()                # knocking out the planted unit hurts most
    assert float(eff.sel(component="mlp", layer=1)) < -0.1
    frac = ds["rescue_fraction"].sel(component="mlp", layer=1).values
    np.testing.assert_allclose(frac, 1.0, atol=1e-4)


def test_params_are_in_the_run_identity():
    from reward_lens_spec.identity import canonical_observable, spec_hash
    a = spec_hash(canonical_observable(_obs("mean")))
    assert a != spec_hash(canonical_observable(_obs("zero")))
    assert a != spec_hash(canonical_observable(_obs("mean", seed=1)))


def test_bad_quantity_is_refused_at_plan_time():
    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from tests.conftest import tiny_lm
    lm = tiny_lm()
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    obs = ObservableSpec(name="r", steps=[{"name": "e", "op": "ablate_rescue", "quantity": "rescue"}], outputs=["e"])
    with pytest.raises(SpecError, match="quantity"):
        build_plan(obs, info)
