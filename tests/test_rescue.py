"""Ablation with rescue of a declared part (issue 37 item 1) vs plain forwards with hooks written here: a subspace
of the ablated output, a downstream site's clean value, the bounds (all / nothing), and a planted organism whose
ablation effect lives in a known direction."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.spec import ObservableSpec
from tests.test_ablation import SITE, _out, _run

pytestmark = pytest.mark.usefixtures("one_thread")
QS = ("effect", "rescued_effect", "rescue_fraction")


def _obs(mode="mean", restore=None, **kw):
    extra = {} if restore is None else {"restore": restore}
    return ObservableSpec(name="rescue", steps=[{"name": q, "op": "ablate_rescue", "mode": mode, "quantity": q,
                                                 **extra, **kw} for q in QS], outputs=list(QS))


def naive_margin(lm, sides, sets):
    """r_c − r_r from plain forwards (batch of one, unpadded) with ``sets`` = [(comp, layer, value_fn(side))]:
    each hook writes its value at the last token of that module's output."""
    r = []
    for s, ids in enumerate(sides):
        handles = []
        for comp, layer, fn in sets:
            def hook(m, a, o, v=fn(s)):
                x = _out(o).clone()
                x[0, -1] = v
                return (x,) + tuple(o[1:]) if isinstance(o, tuple) else x
            handles.append(SITE[comp](lm, layer).register_forward_hook(hook))
        try:
            with torch.no_grad():
                r.append(lm.model(input_ids=torch.tensor([list(ids)])).logits[0].double().numpy())
        finally:
            for h in handles:
                h.remove()
    return r[0] - r[1]


def naive_act(lm, ids, comp, layer):
    got = {}
    h = SITE[comp](lm, layer).register_forward_hook(lambda m, a, o: got.__setitem__("x", _out(o)[0, -1].clone()))
    try:
        with torch.no_grad():
            lm.model(input_ids=torch.tensor([list(ids)]))
    finally:
        h.remove()
    return got["x"].double()


def _check(ds, p, comp, layer, clean, ablated, rescued, tol):
    sel = dict(layer=layer, component=comp)
    got = [float(ds[q].isel(pair=p).sel(**sel)) for q in QS]
    assert abs(got[0] - (ablated - clean)) <= tol, (comp, layer, p, got[0], ablated - clean)
    assert abs(got[1] - (rescued - clean)) <= tol, (comp, layer, p, got[1], rescued - clean)
    if abs(clean - ablated) > 1e-2:
        want = (rescued - ablated) / (clean - ablated)
        assert abs(got[2] - want) <= 4 * tol / abs(clean - ablated), (comp, layer, p, got[2], want)
    return got


def test_restoring_the_reward_direction_matches_a_naive_forward_and_is_not_the_identity():
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_llama")
    ds, ctx = _run(lm, _obs("zero", {"direction": "w_r"}))
    enc, w = ctx.encoded, lm.model.score.weight[0].detach().double()
    fractions = []
    for comp, layer in (("mlp", 0), ("attn", lm.n_layers - 1), ("resid", 1)):
        for p in (0, 3):
            sides = [enc.chosen[p], enc.rejected[p]]
            clean = float(naive_margin(lm, sides, [])[0])
            ablated = float(naive_margin(lm, sides, [(comp, layer, lambda s: torch.zeros(lm.d_model))])[0])
            acts = [naive_act(lm, ids, comp, layer) for ids in sides]
            part = [((a @ w) / (w @ w) * w).float() for a in acts]            # a' + P(a − a'), a' = 0
            rescued = float(naive_margin(lm, sides, [(comp, layer, lambda s: part[s])])[0])
            got = _check(ds, p, comp, layer, clean, ablated, rescued, 5e-6 * (1 + abs(clean)))
            fractions.append(got[2])
    assert max(abs(f - 1.0) for f in fractions if np.isfinite(f)) > 0.05       # a finding, not an identity
    assert ds["rescue_fraction"].attrs["restore"] == "direction: w_r"
    assert ds["rescue_fraction"].attrs["units"] == "fraction" and ds["effect"].attrs["units"] == "reward"


def test_restoring_a_downstream_site_matches_a_naive_forward_with_two_hooks():
    """Ablate a site (zero) and set mlp_L2 to its clean value in the same forward; upstream of mlp_L2 the
    fraction is the share mediated by it, the site itself restores all, sites after it none."""
    from tests.conftest import tiny_lm
    lm = tiny_lm("tiny_llama")
    ds, ctx = _run(lm, _obs("zero", {"site": "mlp_L2"}))
    enc = ctx.encoded
    for comp, layer in (("attn", 0), ("mlp", 1), ("resid", 1), ("mlp", 2), ("resid", 3)):
        for p in (1, 4):
            sides = [enc.chosen[p], enc.rejected[p]]
            clean = float(naive_margin(lm, sides, [])[0])
            zero = (comp, layer, lambda s: torch.zeros(lm.d_model))
            ablated = float(naive_margin(lm, sides, [zero])[0])
            b = [naive_act(lm, ids, "mlp", 2).float() for ids in sides]
            restore = ("mlp", 2, lambda s: b[s])
            rescued = float(naive_margin(lm, sides, [zero] if (comp, layer) == ("mlp", 2) else [zero, restore])[0])
            if (comp, layer) == ("mlp", 2):
                rescued = clean
            got = _check(ds, p, comp, layer, clean, ablated, rescued, 5e-6 * (1 + abs(clean)))
            if abs(clean - ablated) > 1e-2 and (comp, layer) in (("mlp", 2), ("resid", 3)):
                assert abs(got[2] - (1.0 if layer == 2 else 0.0)) < 1e-3, (comp, layer, got)


@pytest.mark.slow
@pytest.mark.parametrize("name,over", [("tiny_llama", "component"), ("tiny_qwen2", "head"),
                                       ("tiny_gemma2", "component")])
def test_the_bounds_restoring_everything_gives_one_and_nothing_gives_zero(name, over):
    """All of the ablated activation (every principal axis of a mean ablation's a − a', or the last residual's
    clean value set downstream) gives 1; no axis gives 0. Heads (z slices) and a sliding-window model too."""
    from reward_lens_spec.engine.interventions import head_dim
    from tests.conftest import tiny_lm
    lm = tiny_lm(name)
    width = head_dim(lm) if over == "head" else lm.d_model
    for restore, want in (({"top_pcs": width}, 1.0), ({"top_pcs": 0}, 0.0),
                          ({"site": f"resid_L{lm.n_layers - 1}"}, 1.0)):
        ds, _ = _run(lm, _obs("mean", restore, over=over))
        eff = ds["effect"].values
        frac = ds["rescue_fraction"].values[np.abs(eff) > 1e-2]
        assert frac.size > 10
        np.testing.assert_allclose(frac, want, atol=2e-3, err_msg=str(restore))
        assert np.isfinite(ds["rescue_fraction"].values).any()
        res = ds["rescued_effect"].values
        np.testing.assert_allclose(res, 0.0 if want else eff, atol=1e-4, err_msg=str(restore))


def planted_direction_organism(phi: float, seed: int = 0):
    """The planted organism (``mlp_L1``'s unit 0 writes s·α·u at the trigger, w_r = u) with every other unit of
    that MLP silenced, so every activation of ``mlp_L1`` — hence the mean-ablation change a − a' — lies along u.
    The head gets two more rows read as directions only: ``part`` = cos φ·u + sin φ·q (q ⟂ u) and ``random``.
    Restoring ``part`` puts back (e·δ)e, whose reward-linear share is cos² φ: the planted fraction."""
    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.organisms.organisms import planted_organism
    org = planted_organism(1.0, n_pairs=8, seed=seed)
    model, d = org.lm.model, org.lm.d_model
    rng = np.random.default_rng(seed + 5)
    u = org.lm.head.W[0].astype(np.float64)
    q = rng.normal(size=d)
    q -= (q @ u) * u
    q /= np.linalg.norm(q)
    rnd = rng.normal(size=d)
    rnd /= np.linalg.norm(rnd)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[:, 1:] = 0.0
        score = torch.nn.Linear(d, 3, bias=False)
        score.weight.copy_(torch.as_tensor(np.stack([u, np.cos(phi) * u + np.sin(phi) * q, rnd]), dtype=torch.float32))
    model.score = score
    model.config.num_labels = 3
    lm = wrap_model(f"rescue_organism_{phi:g}", model, org.lm.tokenizer, objectives=("reward", "part", "random"))
    return lm, org.pairs


@pytest.mark.slow
@pytest.mark.parametrize("phi", [np.pi / 4, np.pi / 3])
def test_a_planted_direction_reads_its_planted_fraction_and_a_random_one_reads_zero(phi):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    lm, pairs = planted_direction_organism(phi)
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=3, objectives=lm.head.objectives,
                    model_name=lm.name, layers=(1,), components=("mlp",))
    got = {}
    for name in ("objective:reward", "objective:part", "objective:random"):
        ds, _, _ = compute(lm, list(pairs), build_plan(_obs("mean", {"direction": name}), info), info, batch_size=4)
        cell = dict(layer=1, component="mlp", objective="reward")
        assert float(np.abs(ds["effect"].sel(**cell)).min()) > 0.05           # the knock-out moves the margin
        got[name] = ds["rescue_fraction"].sel(**cell).values
    np.testing.assert_allclose(got["objective:reward"], 1.0, atol=1e-4)       # δ lies along u: all of it back
    np.testing.assert_allclose(got["objective:part"], np.cos(phi) ** 2, atol=0.03)
    assert np.abs(got["objective:random"]).max() < 0.05


def test_params_are_in_the_run_identity():
    from reward_lens_spec.identity import canonical_observable, spec_hash
    a = spec_hash(canonical_observable(_obs("mean")))
    assert a != spec_hash(canonical_observable(_obs("zero")))
    assert a != spec_hash(canonical_observable(_obs("mean", seed=1)))
    assert spec_hash(canonical_observable(_obs("mean", {"top_pcs": 1}))) != \
        spec_hash(canonical_observable(_obs("mean", {"top_pcs": 2})))


@pytest.mark.parametrize("step,match", [
    ({"quantity": "rescue"}, "quantity"),
    ({"restore": {"direction": "w_r", "top_pcs": 1}}, "restore"),
    ({"restore": "w_r"}, "restore"),
    ({"restore": {"direction": "sideways"}}, "restore.direction"),
    ({"restore": {"direction": "objective:nope"}}, "restore.direction"),
    ({"restore": {"top_pcs": -1}}, "restore.top_pcs"),
    ({"restore": {"site": "mlp_L9"}}, "restore.site"),
    ({"restore": {"site": "block_L1"}}, "restore.site"),
    ({"restore": {"direction": "w_r"}, "over": "head"}, "restore"),
])
def test_a_bad_restore_is_refused_at_plan_time_naming_the_key(step, match):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from tests.conftest import tiny_lm
    lm = tiny_lm()
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    obs = ObservableSpec(name="r", steps=[{"name": "e", "op": "ablate_rescue", **step}], outputs=["e"])
    with pytest.raises(SpecError, match=match.replace(".", r"\.")):
        build_plan(obs, info)
