"""Curvature (issue 29 item 4): Lanczos on Hessian-vector products vs a dense Hessian written here."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.engine.lanczos import density, lanczos, participation_ratio, ritz, slq, top_eigen
from reward_lens_spec.spec import ObservableSpec

pytestmark = pytest.mark.usefixtures("one_thread")


def dense_hessian(lm, seqs, signs, layer):
    """Naive: f(δ) = Σ sign · logits of a plain forward with δ added to layers[layer]'s output at the
    last token; its full Hessian by torch.autograd.functional.hessian."""
    block = lm.model.model.layers[layer]

    def f(d):
        total = 0.0
        for ids, s in zip(seqs, signs):
            def hook(m, a, o):
                x = (o[0] if isinstance(o, tuple) else o).clone()
                x[0, -1] = x[0, -1] + d
                return (x,) + tuple(o[1:]) if isinstance(o, tuple) else x
            h = block.register_forward_hook(hook)
            try:
                total = total + s * lm.model(input_ids=torch.tensor([list(ids)])).logits[0, 0]
            finally:
                h.remove()
        return total
    H = torch.autograd.functional.hessian(f, torch.zeros(lm.d_model)).double().numpy()
    return (H + H.T) / 2


def _by_magnitude(ev, k):
    return ev[np.argsort(-np.abs(ev), kind="stable")][:k]


def _compute(lm, steps, pairs=1):
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    from tests.conftest import make_pairs
    obs = ObservableSpec(name="curv", steps=steps, outputs=[s["name"] for s in steps])
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name, pairs=pairs)
    ds, ctx, _ = compute(lm, make_pairs(3), build_plan(obs, info), info, batch_size=4)
    return ds, ctx


@pytest.fixture(scope="module")
def lm():
    from tests.conftest import tiny_lm
    return tiny_lm("tiny_llama")


def test_lanczos_with_full_reorthogonalization_is_exact_at_full_dimension():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(30, 30))
    A = A + A.T
    ev = np.linalg.eigvalsh(A)
    a, b, Q = lanczos(lambda v: A @ v, rng.normal(size=30), 30)
    np.testing.assert_allclose(np.sort(ritz(a, b)[0]), ev, atol=1e-9)
    np.testing.assert_allclose(Q.T @ Q, np.eye(30), atol=1e-10)
    vals, vecs = top_eigen(lambda v: A @ v, 30, 3, 30)
    np.testing.assert_allclose(vals, _by_magnitude(ev, 3), atol=1e-9)
    np.testing.assert_allclose(np.abs(vecs.T @ A @ vecs), np.abs(np.diag(vals)), atol=1e-8)
    # rank 2: the Krylov space is invariant after 2 steps; NaN past it, never a made-up eigenvalue
    B = np.outer(A[0], A[0]) - 0.5 * np.outer(A[1], A[1])
    vals, _ = top_eigen(lambda v: B @ v, 30, 4, 30)
    assert np.isnan(vals[3]) and np.isfinite(vals[:2]).all()
    np.testing.assert_allclose(vals[:2], _by_magnitude(np.linalg.eigvalsh(B), 2), rtol=1e-9)


def test_slq_is_the_quadrature_of_its_probes():
    """At m = n each probe's quadrature is exact: Σ τ f(θ) = zᵀ f(A) z / ‖z‖²; PR and density follow."""
    rng = np.random.default_rng(1)
    A = rng.normal(size=(20, 20))
    A = A + A.T
    ev, V = np.linalg.eigh(A)
    quad = slq(lambda v: A @ v, 20, 20, 5, seed=4)
    zs = np.random.Generator(np.random.PCG64(4)).integers(0, 2, size=(5, 20)) * 2.0 - 1.0   # the same probes
    w = (zs @ V) ** 2 / 20                                                                   # (probe, eig)
    a, b = (w @ np.abs(ev)).mean(), (w @ ev ** 2).mean()
    assert participation_ratio(quad, 20) == pytest.approx(20 * a * a / b, rel=1e-9)
    edges = np.linspace(-1, 1, 8) * np.abs(ev).max()
    want = np.zeros(7)
    np.add.at(want, np.clip(np.searchsorted(edges, ev, side="right") - 1, 0, 6), w.mean(0))
    np.testing.assert_allclose(density(quad, edges), want, atol=1e-9)


def test_top_eigenvalues_match_a_dense_hessian(lm):
    steps = [{"name": "margin_ev", "op": "curvature", "layer": 1, "k": 4, "iterations": 64},
             {"name": "reward_ev", "op": "curvature", "layer": 3, "of": "reward", "k": 3, "iterations": 64}]
    ds, ctx = _compute(lm, steps)
    enc = ctx.encoded
    Hm = dense_hessian(lm, (enc.chosen[0], enc.rejected[0]), (1.0, -1.0), 1)
    want = _by_magnitude(np.linalg.eigvalsh(Hm), 4)
    got = ds["margin_ev"].isel(pair=0).values
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())
    assert np.isnan(ds["margin_ev"].isel(pair=1).values).all()               # outside observable.pairs
    want = _by_magnitude(np.linalg.eigvalsh(dense_hessian(lm, (enc.rejected[0],), (1.0,), 3)), 3)
    got = ds["reward_ev"].isel(pair=0).sel(side="rejected").values
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())
    assert ds["reward_ev"].attrs["units"] == "reward/act²"


def test_density_and_effective_dimension_match_the_dense_spectrum(lm):
    steps = [{"name": "pr", "op": "curvature", "layer": 3, "quantity": "effective_dimension", "iterations": 64,
              "vectors": 2, "seed": 5, "deflate": 0},
             {"name": "pr_se", "op": "curvature", "layer": 3, "quantity": "effective_dimension_se", "iterations": 64,
              "vectors": 2, "seed": 5, "deflate": 0},
             {"name": "den", "op": "curvature", "layer": 3, "quantity": "density", "iterations": 64,
              "vectors": 2, "bins": 9, "seed": 5, "deflate": 0}]
    ds, ctx = _compute(lm, steps)
    enc = ctx.encoded
    H = dense_hessian(lm, (enc.chosen[0], enc.rejected[0]), (1.0, -1.0), 3)
    ev, V = np.linalg.eigh(H)
    zs = np.random.Generator(np.random.PCG64(5)).integers(0, 2, size=(2, 64)) * 2.0 - 1.0
    w = (zs @ V) ** 2 / 64
    a, b = (w @ np.abs(ev)).mean(), (w @ ev ** 2).mean()
    assert float(ds["pr"].isel(pair=0)) == pytest.approx(64 * a * a / b, rel=2e-3)
    # the jackknife over 2 probes: each leave-one-out estimate is one probe's own ratio
    loo = 64 * (w @ np.abs(ev)) ** 2 / (w @ ev ** 2)
    assert float(ds["pr_se"].isel(pair=0)) == pytest.approx(np.sqrt(0.5 * ((loo - loo.mean()) ** 2).sum()), rel=5e-3)
    assert ds["pr_se"].attrs["probes"] == 2 and ds["pr_se"].attrs["units"] == "dimensions"
    true_pr = np.abs(ev).sum() ** 2 / (ev ** 2).sum()
    assert 1 <= float(ds["pr"].isel(pair=0)) <= 64 and float(ds["pr"].isel(pair=0)) == pytest.approx(true_pr, rel=0.5)
    den = ds["den"].isel(pair=0).values
    assert den.sum() == pytest.approx(1.0, abs=1e-9)
    edges = np.linspace(-1, 1, 10) * np.abs(ev).max()
    want = np.zeros(9)
    np.add.at(want, np.clip(np.searchsorted(edges, ev, side="right") - 1, 0, 8), w.mean(0))
    np.testing.assert_allclose(den, want, atol=2e-2)


@pytest.mark.slow
def test_default_probes_put_the_planted_organisms_effective_dimension_within_5_percent_with_its_error():
    """Issue 37 item 6: the planted-curvature organism (one dominant eigenvalue) read with the default SLQ
    params is within 5 % of the participation ratio of a dense Hessian's eigenvalues, and the stored standard
    error covers the difference; undeflated, few probes miss it by far more than 5 % (the old default)."""
    from reward_lens_spec.organisms.repr_organisms import curvature_organism
    org = curvature_organism(1.0, n_pairs=2)
    lm, layer = org.lm, org.truth["layer"]
    steps = [{"name": "ed", "op": "curvature", "layer": layer, "quantity": "effective_dimension"},
             {"name": "ed_se", "op": "curvature", "layer": layer, "quantity": "effective_dimension_se"},
             {"name": "old", "op": "curvature", "layer": layer, "quantity": "effective_dimension", "vectors": 4,
              "deflate": 0},
             {"name": "den_se", "op": "curvature", "layer": layer, "quantity": "density_se", "bins": 5}]
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute
    obs = ObservableSpec(name="curv", steps=steps, outputs=[s["name"] for s in steps])
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives,
                    model_name=lm.name, pairs=2)
    ds, ctx, _ = compute(lm, list(org.pairs), build_plan(obs, info), info, batch_size=4)
    enc = ctx.encoded
    for p in range(2):
        ev = np.linalg.eigvalsh(dense_hessian(lm, (enc.chosen[p], enc.rejected[p]), (1.0, -1.0), layer))
        truth = np.abs(ev).sum() ** 2 / (ev ** 2).sum()
        got, se = float(ds["ed"].isel(pair=p)), float(ds["ed_se"].isel(pair=p))
        assert abs(got / truth - 1) < 0.05, (p, got, truth)
        assert 0 < se < 0.05 * truth and abs(got - truth) < 4 * se + 1e-3 * truth, (p, got, truth, se)
        assert abs(float(ds["old"].isel(pair=p)) / truth - 1) > 0.05, p
    assert ds["ed"].attrs["probes"] == 8 and ds["ed"].attrs["deflate"] == 4
    assert ds["den_se"].dims == ("pair", "eigenvalue") and np.isfinite(ds["den_se"].values).all()


def test_planted_curvature_direction_is_found_and_grows_with_strength():
    from reward_lens_spec.engine.curvature import site_hvp
    from reward_lens_spec.models.formatting import encode_pairs
    from reward_lens_spec.organisms.repr_organisms import curvature_organism
    top, cos = [], []
    for s in (0.0, 0.5, 1.0):
        org = curvature_organism(s, n_pairs=2)
        enc = encode_pairs(org.lm.tokenizer, list(org.pairs))
        _, _, hvp = site_hvp(org.lm, (enc.chosen[0],), (1.0,), org.truth["layer"])
        vals, vecs = top_eigen(hvp, 64, 1, 24)
        top.append(abs(vals[0]))
        cos.append(abs(vecs[:, 0] @ np.asarray(org.truth["direction"])))
    assert top[0] < top[1] < top[2] and top[2] > 20 * top[0], top
    assert cos[0] < 0.3 and cos[2] > 0.9, cos


def test_bad_params_are_refused_at_plan_time(lm):
    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    for bad, match in (({"layer": 9}, "layer"), ({"layer": 1, "of": "loss"}, "of"),
                       ({"layer": 1, "iterations": 0}, "iterations"), ({"layer": 1, "deflate": -1}, "deflate")):
        obs = ObservableSpec(name="c", steps=[{"name": "e", "op": "curvature", **bad}], outputs=["e"])
        with pytest.raises(SpecError, match=match):
            build_plan(obs, info)
    gated = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=2, objectives=("a", "b"), gated=True)
    with pytest.raises(SpecError, match="gated"):
        build_plan(ObservableSpec(name="c", steps=[{"name": "e", "op": "curvature", "layer": 1}], outputs=["e"]),
                   gated)
