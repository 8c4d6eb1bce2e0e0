"""DPO-implicit rewards (issue 28 items 3 and 6): against a plain forward written here, on planted organisms."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.kinds.implicit.organism import mlp_organism, unembed_organism
from reward_lens_spec.engine.per_token import response_starts
from reward_lens_spec.planning import plan_for
from reward_lens_spec.run import compose_run, compute, execute

from conftest import make_pairs

S = [4 + b for b in b"aeiou "]          # byte ids of the planted set (tiny tokenizer: id = 4 + byte)


def _plan(observable, *extra):
    run, _ = compose_run([f"observable={observable}", "model=tiny_implicit", *extra])
    return plan_for(run)


def _compute(lm, observable, pairs, **kw):
    plan, info = _plan(observable)
    res, ctx, enc = compute(lm, pairs, plan, info, **kw)
    return res, ctx, enc


def _plain_logp(model, ids):
    """log p(ids[t] | ids[:t]) for t >= 1 of one unpadded sequence, float64 (a plain forward)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


def _plain_rewards(lm, enc, starts, beta, norm=False, reference=True):
    out = np.zeros((len(enc.pair_ids), 2))
    for i in range(len(enc.pair_ids)):
        for s, ids in enumerate((enc.chosen[i], enc.rejected[i])):
            st = max(1, int(starts[i, s]))
            d = _plain_logp(lm.policy.model, ids)[st - 1:]
            if reference:
                d = d - _plain_logp(lm.reference.model, ids)[st - 1:]
            out[i, s] = beta * (d.mean() if norm else d.sum())
    return out


@pytest.fixture(scope="module")
def organism():
    return unembed_organism(0.7, S, beta=0.5)


def test_reward_and_per_token_match_a_plain_forward_and_the_planted_log_ratio(organism):
    lm, planted = organism
    pairs = make_pairs(5)
    res, ctx, enc = _compute(lm, "implicit", pairs, batch_size=3)
    starts = response_starts(lm.tokenizer, pairs, enc)
    plain = _plain_rewards(lm, enc, starts, 0.5)
    reward = res["reward"].transpose("pair", "side").values
    np.testing.assert_allclose(reward, plain, rtol=0, atol=1e-5)
    per_token = res["per_token_reward"].transpose("pair", "side", "position").values
    assert np.array_equal(np.nansum(per_token, -1), reward)                      # Σ per-token = reward, exactly
    np.testing.assert_allclose(res["margin"].values, plain[:, 0] - plain[:, 1], atol=1e-5)
    # the planted log-ratio, token by token: c·1[y ∈ S] − log(1 + p_ref(S)(e^c − 1))
    c = planted["strength"]
    for i in range(len(enc.pair_ids)):
        ids = enc.chosen[i]
        st = max(1, int(starts[i, 0]))
        with torch.no_grad():
            p_ref = torch.softmax(lm.reference.model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
        pS = p_ref[st - 1:len(ids) - 1][:, S].sum(-1).numpy()
        want = 0.5 * (c * np.isin(ids[st:], S) - np.log1p(pS * np.expm1(c)))
        got = per_token[i, 0][:len(want)]
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert np.isnan(per_token[i, 0][len(want):]).all()


def test_zero_strength_gives_a_zero_reward():
    lm, _ = unembed_organism(0.0, S)
    res, _, _ = _compute(lm, "implicit", make_pairs(3))
    assert np.all(res["reward"].values == 0.0)


@pytest.mark.parametrize("norm,reference", [(True, True), (False, False), (True, False)])
def test_length_normalized_and_reference_free_match_a_plain_forward(organism, norm, reference):
    from reward_lens_spec.kinds.implicit.model import make_implicit
    base, _ = organism
    lm = make_implicit("v", base.policy, base.reference if reference else None, beta=0.3, length_normalize=norm)
    pairs = make_pairs(4)
    res, _, enc = _compute(lm, "implicit", pairs)
    plain = _plain_rewards(lm, enc, response_starts(lm.tokenizer, pairs, enc), 0.3, norm=norm, reference=reference)
    np.testing.assert_allclose(res["reward"].transpose("pair", "side").values, plain, atol=1e-5)
    assert np.array_equal(np.nansum(res["per_token_reward"].values, -1), res["reward"].values)


def test_lens_last_layer_is_the_reward_and_labelled_approximate(organism):
    lm, _ = organism
    res, _, _ = _compute(lm, "implicit_lens", make_pairs(4))
    sides = res["implicit_lens_sides"]
    assert "approximate" in sides.attrs["method"]
    assert list(sides.layer.values) == list(range(-1, lm.n_layers))
    rew, _, _ = _compute(lm, "implicit", make_pairs(4))
    np.testing.assert_allclose(sides.sel(layer=lm.n_layers - 1).transpose("pair", "side").values,
                               rew["reward"].transpose("pair", "side").values, atol=1e-5)


def test_patching_the_planted_mlp_removes_the_margin_and_upstream_sites_change_nothing():
    lm, planted = mlp_organism(0.3, 2, beta=1.0)
    res, ctx, _ = _compute(lm, "implicit_patch", make_pairs(4), batch_size=8)
    eff = res["implicit_patch_effect"]
    frac = res["implicit_patch_fraction"]
    margin = ctx.capture.logits[:, 0, 0] - ctx.capture.logits[:, 1, 0]
    assert np.all(np.abs(margin) > 1e-4)
    # upstream of the planted MLP: identical activations patched in, effect exactly 0
    assert np.all(eff.sel(layer=[0, 1]).values == 0.0)
    assert np.all(eff.sel(layer=2, component="attn").values == 0.0)
    # the planted MLP, and the outputs of its layer and later ones: the policy becomes the reference
    for layer, comp in ((2, "mlp"), (2, "resid"), (3, "resid")):
        np.testing.assert_allclose(frac.sel(layer=layer, component=comp).values, 1.0, atol=1e-4)
        np.testing.assert_allclose(eff.sel(layer=layer, component=comp).values, -margin, atol=1e-5)
    # first order: exact zero upstream, close to the exact effect at the planted site (a small perturbation)
    att = res["implicit_attribution_patch_effect"]
    assert "approximate" in att.attrs["method"] and att.attrs["units"] == "reward"
    assert np.all(att.sel(layer=[0, 1]).values == 0.0)
    exact = eff.sel(layer=2, component="mlp").values
    np.testing.assert_allclose(att.sel(layer=2, component="mlp").values, exact, rtol=0, atol=0.2 * np.abs(exact).max())


def _plain_implicit_margin(lm, enc, starts, i, hook=None):
    """β·Σ_t [log π − log π_ref] over the response of each side, chosen minus rejected, from plain forwards;
    ``hook = (module of the policy, the reference's module)`` swaps that module's output for the reference's."""
    r = []
    for s, ids in enumerate((enc.chosen[i], enc.rejected[i])):
        st = max(1, int(starts[i][s]))
        ref = _plain_logp(lm.reference.model, ids)
        if hook is None:
            pol = _plain_logp(lm.policy.model, ids)
        else:
            got = {}
            h1 = hook[1].register_forward_hook(lambda m, a, o: got.__setitem__("x", o))
            _plain_logp(lm.reference.model, ids)
            h1.remove()
            h2 = hook[0].register_forward_hook(lambda m, a, o: got["x"])
            try:
                pol = _plain_logp(lm.policy.model, ids)
            finally:
                h2.remove()
        r.append(lm.beta * (pol - ref)[st - 1:].sum())
    return r[0] - r[1]


def test_fraction_is_a_share_only_where_policy_and_reference_share_their_readout():
    """Issue 37 item 4. Same readout (the MLP organism): the fraction is (m − m_patched)/m against plain forwards
    and the last layer's output carries all of it. Different readout (the unembedding organism: only the policy's
    unembedding differs, so no residual patch moves the margin): the fraction is refused, NaN with a reason."""
    from reward_lens_spec.kinds.implicit.patch import readout_difference
    lm, _ = mlp_organism(0.3, 2, beta=1.0)
    pairs = make_pairs(2)
    res, _, enc = _compute(lm, "implicit_patch", pairs, batch_size=8)
    frac = res["implicit_patch_fraction"]
    assert readout_difference(lm) is None and "fraction_refused" not in frac.attrs
    assert frac.attrs["denominator"].startswith("m,")
    starts = response_starts(lm.tokenizer, pairs, enc)
    for i in range(2):
        m = _plain_implicit_margin(lm, enc, starts, i)
        for layer in (2, 3):
            mod = (lm.policy.layers[layer], lm.reference.layers[layer])
            mp = _plain_implicit_margin(lm, enc, starts, i, hook=mod)
            assert abs(float(frac.isel(pair=i).sel(layer=layer, component="resid")) - (m - mp) / m) < 1e-4
    np.testing.assert_allclose(frac.sel(layer=3, component="resid").values, 1.0, atol=1e-4)

    other, _ = unembed_organism(0.7, S, beta=0.5)
    assert "unembedding" in readout_difference(other)
    res, _, _ = _compute(other, "implicit_patch", pairs, batch_size=8)
    frac = res["implicit_patch_fraction"]
    assert np.isnan(frac.values).all() and "not a share" in frac.attrs["fraction_refused"]
    assert "denominator" not in frac.attrs
    assert np.isfinite(res["implicit_patch_effect"].values).all()            # the effect is still reported


def test_patching_refused_when_reference_free(organism):
    from reward_lens_spec.kinds.implicit.model import make_implicit
    base, _ = organism
    lm = make_implicit("free", base.policy, None)
    with pytest.raises(SpecError, match="reference-free") as e:
        _compute(lm, "implicit_patch", make_pairs(2))
    assert "Fix:" in str(e.value)


@pytest.mark.parametrize("observable", ["dla", "lens", "patch", "score"])
def test_linear_instruments_refused_with_one_line_reason(observable):
    with pytest.raises(SpecError, match="model.kind=implicit") as e:
        _plan(observable)
    assert "not a linear head" in str(e.value)


def test_beta_reference_and_normalization_change_the_run_id(tmp_path):
    ids = {}
    for key, extra in {"base": [], "beta": ["model.implicit.beta=0.2"], "norm": ["model.implicit.length_normalize=true"],
                       "free": ["model.implicit.reference=null"],
                       "ref_seed": ["model.implicit.reference.seed=3"]}.items():
        run, y = compose_run(["observable=implicit", "model=tiny_implicit", "dataset.limit=1", *extra])
        out = execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"), progress=False)
        assert out.status == "complete"
        ids[key] = out.run_id
        assert np.array_equal(np.nansum(out.result["per_token_reward"].values, -1), out.result["reward"].values)
    assert len(set(ids.values())) == len(ids), ids


@pytest.mark.parametrize("observable", ["implicit", "implicit_lens", "implicit_patch", "implicit_rewardbench"])
def test_shipped_yaml_runs_through_the_executor(observable, tmp_path):
    extra = ["observable.pairs=1", "observable.layers=[3]"] if observable == "implicit_patch" else []
    run, y = compose_run([f"observable={observable}", "model=tiny_implicit", "dataset.limit=3", *extra])
    out = execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"), progress=False)
    assert out.status == "complete"
    assert all(np.isfinite(out.result[v].values).any() for v in out.result.data_vars
               if v not in ("subset_accuracy", "section_accuracy", "rewardbench_score")   # diagnostic data: no subsets
               and "fraction_refused" not in out.result[v].attrs)
    if observable == "implicit_patch":       # tiny_implicit: policy and reference differ in their readout
        assert "unembedding" in out.result["implicit_patch_fraction"].attrs["fraction_refused"] or \
            "final norm" in out.result["implicit_patch_fraction"].attrs["fraction_refused"]


def test_bad_beta_is_a_spec_error():
    with pytest.raises(SpecError, match="model.implicit.beta"):
        compose_run(["observable=implicit", "model=tiny_implicit", "model.implicit.beta=-1"])
