"""Head-level patching at the readout token, checked against a naive full-sequence forward per site."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.engine.attn_heads import n_heads
from reward_lens_spec.engine.interventions import head_dim, o_proj
from tests.test_battery import run_obs


def _z_last(lm, ids, layer):
    """o_proj input at the last token of one unpadded sequence (plain forward, batch of one)."""
    got = {}
    h = o_proj(lm, layer).register_forward_pre_hook(lambda m, a: got.__setitem__("z", a[0][0, -1].clone()))
    try:
        with torch.no_grad():
            lm.model(input_ids=torch.tensor([ids]))
    finally:
        h.remove()
    return got["z"]


def naive_head_patch(lm, base_ids, src_ids, layer, head):
    """Reward of ``base_ids`` with head ``head``'s o_proj input at the last token taken from ``src_ids``."""
    hd = head_dim(lm)
    src = _z_last(lm, src_ids, layer)[head * hd:(head + 1) * hd]

    def pre(m, a):
        z = a[0].clone()
        z[0, -1, head * hd:(head + 1) * hd] = src
        return (z,)
    h = o_proj(lm, layer).register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            return lm.model(input_ids=torch.tensor([base_ids])).logits[0].double().numpy()
    finally:
        h.remove()


def test_head_patch_matches_a_naive_forward_with_a_hook(family_lm):
    lm = family_lm
    ds, ctx = run_obs(lm, "examples/head_patch")
    enc = ctx.encoded
    H = n_heads(lm.model.config)
    assert ds["patch_effect"].dims == ("pair", "layer", "head") and ds["patch_effect"].sizes["head"] == H
    for p in (0, 3):
        base = lm.model(input_ids=torch.tensor([enc.rejected[p]])).logits[0, 0].item()
        for layer, head in ((0, 1), (lm.n_layers - 1, H - 1), (1, 0)):
            want = naive_head_patch(lm, enc.rejected[p], enc.chosen[p], layer, head)[0] - base
            got = float(ds["patch_effect"].isel(pair=p).sel(layer=layer, head=head))
            assert abs(got - want) <= 3e-6 * (1 + abs(base)), (p, layer, head, got, want)


def test_head_attribution_sums_to_the_attn_attribution_effect(family_lm):
    lm = family_lm
    if lm.family.attn_post_norm:
        pytest.skip("Gemma-2's attn_out is after a post-norm, so o_proj's input is not affine in it")
    heads, _ = run_obs(lm, "examples/head_patch")
    comps, _ = run_obs(lm, "attribution_patch")
    per_head = heads["attribution_patch_effect"].sum("head").values
    attn = comps["attribution_patch_effect"].sel(component="attn").values
    np.testing.assert_allclose(per_head, attn, rtol=1e-5, atol=1e-7)
    assert np.abs(heads["attribution_patch_effect"]).max() > 1e-4       # not trivially zero


def test_restricted_head_grid_keeps_one_pair_axis(family_lm):
    ds, _ = run_obs(family_lm, "examples/head_patch", layers=[1], pairs=2)
    assert ds["patch_effect"].shape[:2] == (5, 1)
    assert np.isfinite(ds["patch_effect"][:2]).all() and np.isnan(ds["patch_effect"][2:]).all()


@pytest.fixture(scope="module")
def head_organisms():
    from reward_lens_spec.organisms.kind_organisms import organism_family
    return organism_family("planted_head")


def test_planted_head_is_recovered_and_an_off_by_one_head_grid_fails(head_organisms, monkeypatch):
    from reward_lens_spec.engine import interventions
    from reward_lens_spec.trust.scorecard import grade
    card = grade("examples/head_patch", organisms=head_organisms)
    assert card.criteria_passed == {"patch_share": True, "attribution_share": True}, card.describe()
    assert card.readings["patch_share"][0] < 0.2 < 0.5 < card.readings["patch_share"][-1]

    real = interventions.set_readout
    H = n_heads(head_organisms[0].lm.model.config)

    def shifted(lm, enc, cap, targets, values, *a, **kw):       # patches head h+1 but labels it h
        return real(lm, enc, cap, [(s, l, (h + 1) % H) for s, l, h in targets], values, *a, **kw)
    monkeypatch.setattr(interventions, "set_readout", shifted)
    wrong = grade("examples/head_patch", organisms=head_organisms)
    assert not wrong.criteria_passed["patch_share"] and wrong.criteria_passed["attribution_share"]


def test_a_head_grid_on_an_organism_without_a_planted_head_fails():
    from reward_lens_spec.organisms.kind_organisms import organism_family
    from reward_lens_spec.trust.scorecard import grade
    card = grade("examples/head_patch", organisms=organism_family("planted", (0.0, 1.0), n_pairs=4))
    assert not card.passed and card.readings["patch_share"] == [None, None]
