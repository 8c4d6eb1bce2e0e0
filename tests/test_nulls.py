"""null draws and p-values, against direct enumeration, an independent Ledoit–Wolf sampler and scipy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import false_discovery_control, ks_2samp

from reward_lens_spec.errors import SpecError
from reward_lens_spec.ops.p_value import benjamini_hochberg
from reward_lens_spec.spec import ObservableSpec
from tests.conftest import tiny_lm
from tests.test_ablation import _run


def _null(lm, **kw):
    steps = [{"name": "h", "op": "capture", "site": "readout"},
             {"name": "d", "op": "null", "input": "h", **kw}]
    return _run(lm, ObservableSpec(name="n", steps=steps, outputs=["d"]))


@pytest.fixture(scope="module")
def lm():
    return tiny_lm("tiny_llama")


def test_shuffled_sides_draws_are_sign_flips_of_the_margins(lm):
    ds, ctx = _null(lm, kind="shuffled_sides", draws=2000, seed=1)
    h = ctx.capture.h.astype(np.float64)
    d = (h[:, 0] - h[:, 1]) @ lm.model.score.weight.detach().double().numpy()[0]
    support = np.array([np.mean(np.array(s) * d) for s in itertools.product((1, -1), repeat=len(d))])
    got = ds["d"].values
    dist = np.abs(got[:, None] - support[None]).min(1)
    assert dist.max() < 1e-9                                   # every draw is one sign pattern's mean
    hits = np.bincount(np.abs(got[:, None] - support[None]).argmin(1), minlength=support.size)
    assert (hits > 0).sum() == support.size and hits.max() < 4 * hits.min()   # all 32, about evenly


def test_shuffled_pairs_accuracy_draws_are_permutation_accuracies(lm):
    ds, ctx = _null(lm, kind="shuffled_pairs", statistic="accuracy", draws=500)
    r = ctx.capture.h.astype(np.float64) @ lm.model.score.weight.detach().double().numpy()[0]   # pair × side
    n = len(r)
    support = {round(float(np.mean([(r[i, 0] > r[p[i], 1]) + 0.5 * (r[i, 0] == r[p[i], 1]) for i in range(n)])), 9)
               for p in itertools.permutations(range(n))}
    assert {round(float(v), 9) for v in ds["d"].values} <= support


def _ledoit_wolf(X):
    """Ledoit & Wolf (2004) shrinkage to μI, written out in dense form."""
    n, d = X.shape
    Xc = X - X.mean(0)
    S = Xc.T @ Xc / n
    mu = np.trace(S) / d
    delta2 = ((S - mu * np.eye(d)) ** 2).sum() / d
    b2 = sum(((np.outer(x, x) - S) ** 2).sum() / d for x in Xc) / n ** 2
    rho = min(b2, delta2) / delta2
    return (1 - rho) * S + rho * mu * np.eye(d)


def test_random_direction_draws_match_a_dense_ledoit_wolf_sampler(lm):
    ds, ctx = _null(lm, kind="random_direction", draws=4000, seed=2)
    h = ctx.capture.h.astype(np.float64)
    w = lm.model.score.weight.detach().double().numpy()[0]
    within = (h - h.mean(0, keepdims=True)).reshape(-1, h.shape[-1])
    L = np.linalg.cholesky(_ledoit_wolf(within))
    u = np.random.default_rng(7).standard_normal((4000, h.shape[-1])) @ L.T
    u *= np.linalg.norm(w) / np.linalg.norm(u, axis=1, keepdims=True)
    direct = u @ (h[:, 0] - h[:, 1]).mean(0)
    assert ks_2samp(ds["d"].values, direct).pvalue > 1e-3
    assert ds["d"].attrs["units"] == "reward" and ds["d"].dims == ("draw",)


def test_p_values_and_benjamini_hochberg():
    from reward_lens_spec.ops.p_value import PValue, PValueParams
    import xarray as xr
    obs = xr.DataArray(np.array([3.0, 0.0, -3.0, np.nan]), dims=("layer",))
    null = xr.DataArray(np.tile(np.arange(-4.0, 5.0), (4, 1)).T, dims=("draw", "layer"))   # 9 draws −4..4
    op = PValue(PValueParams(against="null"))
    p = op.run(None, obs, null).values
    pg, pl = np.array([2, 5, 8]) / 10 + 0.1, np.array([8, 5, 2]) / 10 + 0.1      # (1 + #≥)/(1 + 9) etc.
    np.testing.assert_allclose(p[:3], np.minimum(1, 2 * np.minimum(pg, pl)))
    assert np.isnan(p[3])
    rng = np.random.default_rng(0)
    raw = rng.random(50) ** 3
    np.testing.assert_allclose(benjamini_hochberg(raw), false_discovery_control(raw, method="bh"), rtol=1e-12)
    grid = raw.reshape(5, 10).copy()
    grid[0, 0] = np.nan
    ok = np.isfinite(grid)
    np.testing.assert_allclose(benjamini_hochberg(grid)[ok], false_discovery_control(grid[ok], method="bh"))


def test_plan_time_errors(lm):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    cap = {"name": "h", "op": "capture", "site": "readout"}
    bad = [([{"name": "d", "op": "null", "input": "h", "kind": "shuffled_pairs"}], "statistic"),
           ([{"name": "d", "op": "null", "input": "h", "kind": "bootstrap"}], "kind"),
           ([{"name": "d", "op": None, "input": "h"}], 'quote it'),
           ([{"name": "d", "op": "null", "input": "h"}, {"name": "p", "op": "p_value", "input": "h",
                                                         "against": "d"}], "do not match")]
    for steps, match in bad:
        with pytest.raises(SpecError, match=match):
            build_plan(ObservableSpec(name="n", steps=[cap] + steps, outputs=[steps[-1]["name"]]), info)


def test_planted_effect_beats_its_null_and_a_null_along_w_itself_fails(monkeypatch):
    from reward_lens_spec.ops import null
    from reward_lens_spec.trust.scorecard import grade
    card = grade("examples/null_mlp_effect", n_pairs=8)
    assert card.criteria_passed == {"null_excess": True}, card.describe()
    real = null.Null.run

    def along_w(self, ctx, x):             # "random" directions that are all w itself
        out = real(self, ctx, x)
        w = ctx.lm.head.W[0].astype(np.float64)
        diff = (x.sel(side="chosen") - x.sel(side="rejected")).mean("pair")
        out.values[...] = (np.asarray(diff.values, np.float64) @ w)[None]
        return out
    monkeypatch.setattr(null.Null, "run", along_w)
    assert not grade("examples/null_mlp_effect", n_pairs=8).passed
