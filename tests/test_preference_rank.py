"""Preference rank test (ops/preference_rank): the skew model's algebra, a worked cycle, the organisms."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import check_grad

from reward_lens_spec.errors import SpecError
from reward_lens_spec.organisms.preference_organisms import cycle_organisms
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.preference_rank import (_objective, fit_pair_model, pair_scores,
                                                  skew_singular_values)
from reward_lens_spec.spec import ObservableSpec
from reward_lens_spec.trust.scorecard import evaluate, grade


pytestmark = pytest.mark.usefixtures("one_thread")


def test_skew_scores_are_antisymmetric_gradient_exact_and_singular_values_match_dense_A():
    rng = np.random.default_rng(0)
    p, k, n = 9, 2, 30
    theta = rng.normal(size=p + 2 * p * k)
    a, b = rng.normal(size=(n, p)), rng.normal(size=(n, p))
    np.testing.assert_allclose(pair_scores(theta, a, b, k), -pair_scores(theta, b, a, k), rtol=1e-14, atol=1e-13)
    U, V = theta[p:p + p * k].reshape(p, k), theta[p + p * k:].reshape(p, k)
    A = U @ V.T - V @ U.T                                          # the dense skew matrix, written out
    np.testing.assert_allclose(pair_scores(theta, a, b, k), (a - b) @ theta[:p] + np.einsum("ni,ij,nj->n", a, A, b),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(skew_singular_values(theta, p, k), np.linalg.svd(A, compute_uv=False)[:2 * k],
                               rtol=1e-10)
    err = check_grad(lambda t: _objective(t, a, b, k, 0.1)[0], lambda t: _objective(t, a, b, k, 0.1)[1], theta)
    assert err < 1e-5 * np.linalg.norm(_objective(theta, a, b, k, 0.1)[1])


def test_a_planted_three_cycle_no_scalar_reward_can_fit():
    """Items of three types (one-hot + small noise); labels rock>paper>scissors>rock. A scalar reward's
    three margins on one triple sum to 0, so at most 2 of 3 are right; the rank-2 skew model gets all."""
    rng = np.random.default_rng(1)
    p, T = 6, 60
    proto = np.eye(p)[:3] * 3.0
    a, b = [], []
    for _ in range(T):
        x = proto + 0.05 * rng.normal(size=(3, p))
        for w, l in ((0, 1), (1, 2), (2, 0)):
            a.append(x[w]), b.append(x[l])
    a, b = np.array(a), np.array(b)
    tr, te = slice(0, 120), slice(120, None)
    w_t, _ = fit_pair_model(a[tr], b[tr], a[tr], b[tr], 0, (0.01,))
    th, _ = fit_pair_model(a[tr], b[tr], a[tr], b[tr], 1, (0.01,), init_w=w_t)
    s_t, s_s = pair_scores(w_t, a[te], b[te], 0), pair_scores(th, a[te], b[te], 1)
    assert np.mean(s_t.reshape(-1, 3) > 0, 1).max() <= 2 / 3 + 1e-12
    assert (s_s > 0).all()
    sv = skew_singular_values(th, p, 1)
    assert sv[0] == pytest.approx(sv[1], rel=1e-9) and sv[0] > 0.1


def _rank(org):
    ds = evaluate(load_observable("preference_rank"), org)
    return ds["preference_rank"], ds["skew_singular_values"]


def test_cycle_organism_gain_excludes_zero_and_the_transitive_one_includes_it():
    transitive, cyclic, clean = cycle_organisms((0.0, 1.0)) + cycle_organisms((1.0,), noise=0.0)
    st0, _ = _rank(transitive)
    st1, sv1 = _rank(cyclic)
    g0, g1 = st0.sel(rank_statistic="cyclic_gain"), st1.sel(rank_statistic="cyclic_gain")
    assert float(g0.sel(bound="ci_low")) <= 0.0 <= float(g0.sel(bound="ci_high"))
    assert float(g1.sel(bound="ci_low")) > 0.0
    assert float(st1.sel(rank_statistic="n_test", bound="estimate")) == 3 * float(
        st1.sel(rank_statistic="n_effective", bound="estimate"))        # whole prompt groups in test
    assert sv1.sizes["singular"] == 2 and float(sv1[0]) == pytest.approx(float(sv1[1]), rel=1e-9)
    st, _ = _rank(clean)                                                  # noise-free cycle: the 2/3 bound
    assert float(st.sel(rank_statistic="transitive_accuracy", bound="estimate")) <= 2 / 3 + 1e-12
    assert float(st.sel(rank_statistic="skew_accuracy", bound="estimate")) >= 0.9


def test_plan_time_errors_name_the_step():
    from reward_lens_spec.models.families import family_for
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    info = PlanInfo(family=family_for("llama"), n_layers=4, n_objectives=1, objectives=("reward",))
    h = {"name": "h", "op": "capture", "site": "readout"}
    for extra, key in (({"rank": 0}, "rank"), ({"quantity": "sv"}, "quantity"), ({"l2_grid": []}, "l2_grid")):
        obs = ObservableSpec(name="t", steps=[h, {"name": "r", "op": "preference_rank", "input": "h", **extra}],
                             outputs=["r"])
        with pytest.raises(SpecError, match=rf"steps\.r\.{key}"):
            build_plan(obs, info)
    obs = ObservableSpec(name="t", steps=[h, {"name": "x", "op": "project", "input": "h", "direction": "head"},
                                          {"name": "r", "op": "preference_rank", "input": "x"}], outputs=["r"])
    with pytest.raises(SpecError, match=r"steps\.r"):
        build_plan(obs, info)


def test_cyclic_gain_criterion_passes_on_the_cycle_organism():
    card = grade("preference_rank", organisms=cycle_organisms((0.0, 0.5, 1.0)))
    assert list(card.readings) == ["cyclic_gain"] and card.passed
