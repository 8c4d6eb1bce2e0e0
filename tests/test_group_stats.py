"""accuracy and effect_size per group: estimates vs direct numpy, cluster-bootstrap invariants, grading."""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.data import Pair
from reward_lens_spec.ops.accuracy import Accuracy, GroupStatParams
from reward_lens_spec.ops.effect_size import EffectSize
from reward_lens_spec.spec import ObservableSpec
from tests.conftest import tiny_lm


def _pairs(copies=1, n=12):
    out = []
    for i in range(n):
        for c in range(copies):
            out.append(Pair(id=f"q{i}-{c}", prompt=f"Question {i} about item {i * 7}?",
                            chosen=f"Answer {i} is {i % 4}." + " Yes." * (i % 3), rejected=f"No idea {i + 3}",
                            dimension=("math", "code", "chat")[i % 3]))
    return out


def _stats(lm, pairs, **kw):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    from reward_lens_spec.observables import load_observable
    obs = ObservableSpec(name="g", include=["score"], steps=[
        {"name": "acc", "op": "accuracy", "input": "margin", "by": "dimension", **kw},
        {"name": "dz", "op": "effect_size", "input": "margin", "by": "dimension", **kw}],
        outputs=["margin", "acc", "dz"])
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    ds, _, _ = compute(lm, pairs, build_plan(obs, info, load_observable), info, batch_size=8)
    return ds


@pytest.fixture(scope="module")
def lm():
    return tiny_lm("tiny_qwen3")


def test_estimates_match_direct_numpy_per_dimension(lm):
    pairs = _pairs()
    ds = _stats(lm, pairs)
    by_id = {p.id: p.dimension for p in pairs}
    m, dims = ds["margin"].values.astype(np.float64), np.array([by_id[i] for i in ds["margin"].pair.values])
    assert ds["acc"].dims == ("dimension", "bound") and set(ds["acc"].dimension.values) == {"math", "code", "chat"}
    for g in ("math", "code", "chat"):
        d = m[dims == g]
        acc = ((d > 0) + 0.5 * (d == 0)).mean()
        assert float(ds["acc"].sel(dimension=g, bound="estimate")) == pytest.approx(acc, abs=1e-12)
        assert float(ds["dz"].sel(dimension=g, bound="estimate")) == pytest.approx(d.mean() / d.std(ddof=1), rel=1e-9)
        lo, hi = (float(ds["dz"].sel(dimension=g, bound=b)) for b in ("ci_low", "ci_high"))
        assert lo <= float(ds["dz"].sel(dimension=g, bound="estimate")) <= hi
        assert int(ds["acc"].n.sel(dimension=g)) == (dims == g).sum() == int(ds["acc"].n_eff.sel(dimension=g))


def test_clusters_of_identical_pairs_give_the_same_interval_and_n_eff(lm):
    one, three = _stats(lm, _pairs(1, n=30)), _stats(lm, _pairs(3, n=30))
    np.testing.assert_allclose(three["acc"].values, one["acc"].values, atol=1e-12)
    n1 = one["dz"].n.values.astype(float)                  # d_z's sd uses ddof = 1: a fixed factor per group
    factor = np.sqrt(n1 / (n1 - 1)) * np.sqrt((3 * n1 - 1) / (3 * n1))
    np.testing.assert_allclose(three["dz"].values, one["dz"].values * factor[:, None], rtol=1e-9)
    np.testing.assert_array_equal(three["acc"].n_eff.values, one["acc"].n_eff.values)
    np.testing.assert_array_equal(three["acc"].n.values, 3 * one["acc"].n.values)
    plain = _stats(lm, _pairs(3, n=30), cluster="pair")               # ignoring the clusters: too narrow
    width = lambda d: (d.sel(bound="ci_high") - d.sel(bound="ci_low")).values   # noqa: E731
    assert (width(plain["dz"]) < width(three["dz"])).all()


def test_bootstrap_interval_of_an_iid_accuracy_is_near_the_normal_interval():
    rng = np.random.default_rng(3)
    m = rng.normal(0.3, 1.0, 400)
    da = xr.DataArray(m, dims=("pair",), coords={"pair": [f"p{i}" for i in range(400)]})
    out = Accuracy(GroupStatParams(cluster="pair", resamples=4000)).run(None, da)
    p = ((m > 0)).mean()
    half = 1.959964 * np.sqrt(p * (1 - p) / m.size)
    assert float(out.sel(bound="ci_low")) == pytest.approx(p - half, abs=0.012)
    assert float(out.sel(bound="ci_high")) == pytest.approx(p + half, abs=0.012)
    assert out.attrs["units"] == "fraction" and out.dims == ("bound",)
    es = EffectSize(GroupStatParams(cluster="pair")).run(None, da)
    assert float(es.sel(bound="estimate")) == pytest.approx(m.mean() / m.std(ddof=1), rel=1e-12)


def test_by_must_be_a_pair_coord_and_ci_in_range():
    from reward_lens_spec.errors import SpecError
    da = xr.DataArray(np.ones(4), dims=("pair",), coords={"pair": list("abcd")})
    with pytest.raises(SpecError, match="not a pair coordinate"):
        Accuracy(GroupStatParams(by="dimension", cluster="pair")).run(None, da)
    with pytest.raises(SpecError, match="ci must be"):
        Accuracy(GroupStatParams(cluster="pair", ci=95)).run(None, da)


def test_group_stats_graded_on_a_trained_organism_and_a_sign_slip_fails(monkeypatch):
    from reward_lens_spec.ops import accuracy
    from reward_lens_spec.trust.scorecard import grade
    card = grade("examples/accuracy_by_dimension", organism="trained_length")
    assert card.criteria_passed["group_stats"], card.describe()
    monkeypatch.setattr(accuracy.Accuracy, "statistic", staticmethod(lambda d: float(((d < 0) + 0.5 * (d == 0)).mean())))
    assert not grade("examples/accuracy_by_dimension", organism="trained_length").criteria_passed["group_stats"]
