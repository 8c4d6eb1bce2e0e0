"""Path patching at the readout token vs a naive full-sequence forward with plain hooks."""
from __future__ import annotations

import numpy as np
import torch

from reward_lens_spec.models.head import get_module
from tests.test_ablation import SITE, _out, naive_act
from tests.test_battery import run_obs


def _norm_in_and_reward(lm, ids, comp=None, layer=None, value=None):
    """(final-norm input at the last token, reward) of one sequence, optionally with a site's output set."""
    got, hs = {}, []
    norm = get_module(lm.model, lm.family.final_norm)
    hs.append(norm.register_forward_pre_hook(lambda m, a: got.__setitem__("x", a[0][0, -1].clone())))
    if comp is not None:
        def hook(m, a, o):
            x = _out(o).clone()
            x[0, -1] = value
            return (x,) + tuple(o[1:]) if isinstance(o, tuple) else x
        hs.append(SITE[comp](lm, layer).register_forward_hook(hook))
    try:
        with torch.no_grad():
            r = float(lm.model(input_ids=torch.tensor([ids])).logits[0, 0])
    finally:
        for h in hs:
            h.remove()
    return got["x"], r


def test_paths_match_a_naive_forward_and_the_model_s_own_final_norm(family_lm):
    lm = family_lm
    ds, ctx = run_obs(lm, "examples/path_patch", pairs=3)
    enc = ctx.encoded
    norm = get_module(lm.model, lm.family.final_norm)
    W = get_module(lm.model, lm.family.head)

    def read(x):
        with torch.no_grad():
            return float(W(norm(x[None, None]))[0, 0, 0])
    for p in (0, 2):
        base_ids, src_ids = enc.rejected[p], enc.chosen[p]
        x, r0 = _norm_in_and_reward(lm, base_ids)
        for comp, layer in (("attn", 0), ("mlp", 1), ("mlp", lm.n_layers - 1)):
            a_src, a_base = naive_act(lm, src_ids, comp, layer), naive_act(lm, base_ids, comp, layer)
            xp, r_total = _norm_in_and_reward(lm, base_ids, comp, layer, a_src)
            want = {"total": r_total - r0, "direct": read(x + (a_src - a_base)) - r0,
                    "indirect": read(xp - (a_src - a_base)) - r0}
            for path, w in want.items():
                got = float(ds["path_patch_effect"].isel(pair=p).sel(layer=layer, component=comp, path=path))
                assert abs(got - w) <= 5e-6 * (1 + abs(r0)), (lm.name, p, comp, layer, path, got, w)
    last = ds["path_patch_effect"].sel(layer=lm.n_layers - 1, component="mlp", path="indirect")[:3]
    np.testing.assert_allclose(last, 0.0, atol=1e-6)            # nothing lies downstream of the last MLP
    assert np.isnan(ds["path_patch_effect"][3:]).all()


def test_planted_direct_and_indirect_paths_are_told_apart_and_swapped_labels_fail(monkeypatch):
    from reward_lens_spec.organisms.kind_organisms import organism_family
    from reward_lens_spec.ops import path_patch
    from reward_lens_spec.trust.scorecard import grade
    orgs = organism_family("planted_paths", n_pairs=6)
    card = grade("examples/path_patch", organisms=orgs)
    assert card.criteria_passed == {"path_separation": True}, card.describe()
    monkeypatch.setattr(path_patch, "PATHS", ("total", "indirect", "direct"))   # direct/indirect mislabelled
    assert not grade("examples/path_patch", organisms=orgs).passed
