"""LEACE concept erasure with a certificate (issue 29 item 2) vs a naive closed form and a hooked forward."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import pinv

from reward_lens_spec.ops._leace import auc, erase, fit_leace, in_split, one_hot
from reward_lens_spec.spec import ObservableSpec

pytestmark = pytest.mark.usefixtures("one_thread")


def naive_leace(X, y):
    """Belrose et al. 2023, Thm. 4.3, written out with scipy: r(x) = x − Σ^{1/2} P Σ^{-1/2}(x − μ)."""
    mu = X.mean(0)
    Z = one_hot(y)[:, :-1]                            # k − 1 indicators: centred, full column rank
    Xc, Zc = X - mu, Z - Z.mean(0)
    S = Xc.T @ Xc / len(X)
    lam, V = np.linalg.eigh(S)                        # (scipy's sqrtm loses digits on the ill-conditioned Σ
    root = (V * np.sqrt(np.clip(lam, 0, None))) @ V.T  # of real activations; cond ~1e7 here)
    W = pinv(root, rtol=1e-5)                         # variance below 1e-10 of the top: numerical null space
    M = W @ (Xc.T @ Zc / len(X))
    P = M @ pinv(M)                                   # orthogonal projector onto colspace(M)
    return lambda x: x - (x - mu) @ (root @ P @ W).T


def test_closed_form_matches_a_naive_one_and_leaves_no_linear_signal():
    rng = np.random.default_rng(0)
    n, d = 400, 8
    y = rng.integers(0, 3, n).astype(str)
    X = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + 2.0 * (y == "1")[:, None] * rng.normal(size=d) \
        - 1.5 * (y == "2")[:, None] * rng.normal(size=d)
    mu, E = fit_leace(X, one_hot(y))
    np.testing.assert_allclose(erase(X, mu, E), naive_leace(X, y)(X), atol=1e-8)
    R = erase(X, mu, E)
    Z = one_hot(y)
    np.testing.assert_allclose((R - R.mean(0)).T @ (Z - Z.mean(0)) / n, 0, atol=1e-10)   # Cov(r(X), Z) = 0
    # brute force: least squares of each class indicator on [r(X), 1] does no better than the constant
    A = np.hstack([R, np.ones((n, 1))])
    for k in range(3):
        coef = np.linalg.lstsq(A, Z[:, k], rcond=None)[0]
        assert np.sum((A @ coef - Z[:, k]) ** 2) == pytest.approx(np.sum((Z[:, k] - Z[:, k].mean()) ** 2), rel=1e-9)
    # while before, they could
    A0 = np.hstack([X, np.ones((n, 1))])
    coef = np.linalg.lstsq(A0, Z[:, 1], rcond=None)[0]
    assert np.sum((A0 @ coef - Z[:, 1]) ** 2) < 0.8 * np.sum((Z[:, 1] - Z[:, 1].mean()) ** 2)


def test_auc_and_split_helpers():
    assert auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert auc(np.array([1.0, 1.0]), np.array([0, 1])) == pytest.approx(0.5)
    ids = [f"p{i}" for i in range(400)]
    s = in_split(ids, "0", 0.5)
    assert 150 < s.sum() < 250 and (in_split(ids[::-1], "0", 0.5) == s[::-1]).all()     # per pair, not order


@pytest.fixture(scope="module")
def erased():
    from reward_lens_spec.organisms.repr_organisms import concept_organism
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    org = concept_organism(n_pairs=200)
    lm = org.lm
    steps = [{"name": "resid", "op": "capture", "site": "resid_post"}]
    for c in ("concept", "label"):
        steps += [{"name": f"move_{c}", "op": "leace", "layer": 2, "concept": f"field:{c}", "quantity": "displacement"},
                  {"name": f"cert_{c}", "op": "leace_certificate", "input": "resid", "layer": 2,
                   "concept": f"field:{c}", "resamples": 300}]
    steps += [{"name": "change", "op": "leace", "layer": 2, "concept": "field:concept"},
              {"name": "change_ci", "op": "mean_ci", "input": "change", "cluster": "pair", "resamples": 300}]
    obs = ObservableSpec(name="erase", steps=steps, outputs=[s["name"] for s in steps[1:]])
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives,
                    model_name=lm.name, pairs=40)                  # re-runs on the first 40 pairs' held-out half
    ds, ctx, _ = compute(lm, list(org.pairs), build_plan(obs, info), info, batch_size=16)
    return ds, ctx


def test_margin_change_matches_a_naive_forward_with_the_naively_erased_activation(erased):
    ds, ctx = erased
    lm, enc = ctx.lm, ctx.encoded
    X = ctx.capture.sites["resid_post"][:, :, 2].astype(np.float64)
    fit = in_split(enc.pair_ids, "0", 0.5)
    by_id = {p.id: dict(p.meta)["concept"] for p in ctx.pairs}
    y = np.array([[by_id[i]] * 2 for i in enc.pair_ids])
    r = naive_leace(X[fit].reshape(-1, X.shape[-1]), y[fit].ravel())
    block = lm.model.model.layers[2]

    def reward(ids, value):
        def hook(m, a, o):
            x = (o[0] if isinstance(o, tuple) else o).clone()
            x[0, -1] = torch.as_tensor(value, dtype=x.dtype)
            return (x,) + tuple(o[1:]) if isinstance(o, tuple) else x
        h = block.register_forward_hook(hook) if value is not None else None
        try:
            with torch.no_grad():
                return float(lm.model(input_ids=torch.tensor([list(ids)])).logits[0, 0])
        finally:
            if h is not None:
                h.remove()
    held = np.flatnonzero(~fit[:40])
    assert np.isnan(ds["change"].values[fit]).all() and np.isfinite(ds["change"].values[held]).all()
    assert np.isnan(ds["change"].values[40:]).all()                                   # outside observable.pairs
    for p in held[:3]:
        sides = (enc.chosen[p], enc.rejected[p])
        want = (reward(sides[0], r(X[p, 0])) - reward(sides[1], r(X[p, 1]))) - \
            (reward(sides[0], None) - reward(sides[1], None))
        assert abs(float(ds["change"].values[p]) - want) < 2e-6, (p, want)
    est, lo, hi = ds["change_ci"].values
    assert lo <= est <= hi and est == pytest.approx(np.nanmean(ds["change"].values))


def test_the_planted_concept_is_erased_and_certified_and_the_unplanted_one_is_left_alone(erased):
    ds, _ = erased
    before, after = ds["cert_concept"].sel(stage="before").values, ds["cert_concept"].sel(stage="after").values
    assert before[1] > 0.9                            # a fresh probe reads the planted concept (ci_low)
    assert after[1] <= 0.5 <= after[2]                # and after erasure its interval contains chance
    assert after[0] < before[0] - 0.3
    lab = ds["cert_label"].sel(stage="before").values
    assert lab[1] < 0.55 < before[1]                   # the unplanted label: no reading above chance (ci_low)
    move_c, move_l = np.nanmean(ds["move_concept"].values), np.nanmean(ds["move_label"].values)
    assert move_l < 0.25 * move_c, (move_c, move_l)   # erasing it barely moves the activation


def test_identity_and_plan_errors():
    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.identity import canonical_observable, spec_hash
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.ops.leace import Leace
    from reward_lens_spec.registry import build_plan
    from tests.conftest import tiny_lm
    assert "concept" in Leace.pair_fields                   # the label's values are in the run identity
    mk = lambda **kw: ObservableSpec(name="e", steps=[{"name": "e", "op": "leace", "layer": 1, **kw}],  # noqa: E731
                                     outputs=["e"])
    assert spec_hash(canonical_observable(mk())) != spec_hash(canonical_observable(mk(seed=1)))
    lm = tiny_lm()
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    for kw, match in (({"concept": "field:colour"}, "concept"), ({"fit_fraction": 1.0}, "fit_fraction"),
                      ({"concept": "tokens"}, "tokens"), ({"site": "attn_z"}, "site")):
        with pytest.raises(SpecError, match=match):
            build_plan(mk(**kw), info)
