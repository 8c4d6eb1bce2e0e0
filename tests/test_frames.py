"""Frames, the gauge gate and multi-objective geometry (fast; tiny models only)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from scipy.stats import ortho_group

from reward_lens_spec.data import Pair
from reward_lens_spec.errors import GaugeError, SpecError, StoreError
from reward_lens_spec.frames import (as_direction, compare_directions, fit_shared, fit_whitened, frame_from_dataset,
                                     frame_to_dataset, load_frame, native_frame, require_shared_frame, save_frame,
                                     shrunk_spectrum)
from reward_lens_spec.engine.capture import capture
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.models.loading import wrap_model
from reward_lens_spec.engine.reparam import rotate_residual
from reward_lens_spec.models.tiny import build_tiny
from reward_lens_spec.ops.base import PlanInfo
from reward_lens_spec.ops.margin_agreement import compare_margins
from reward_lens_spec.registry import build_plan
from reward_lens_spec.observables import load_observable
from reward_lens_spec.run import compute
from tests.conftest import make_pairs

D = 64


# ------------------------------------------------------------------ covariance and frames

def _dense_ledoit_wolf(X):
    """Ledoit & Wolf (2004) written out densely, as a reference for the spectral version."""
    n, d = X.shape
    Xc = X - X.mean(0)
    S = Xc.T @ Xc / n
    mu = np.trace(S) / d
    d2 = np.sum((S - mu * np.eye(d)) ** 2) / d
    b2 = sum(np.sum((np.outer(x, x) - S) ** 2) for x in Xc) / n ** 2 / d
    rho = min(b2, d2) / d2
    return rho, (1 - rho) * S + rho * mu * np.eye(d), S


@pytest.mark.parametrize("n,d", [(30, 50), (200, 20)])
def test_ledoit_wolf_spectral_form_matches_dense_formula(n, d):
    X = np.random.default_rng(n).standard_normal((n, d)) * np.linspace(0.1, 3, d) + 2.0
    rho, sigma, S = _dense_ledoit_wolf(X)
    f = fit_whitened(X, "m", shrinkage="ledoit_wolf")
    assert shrunk_spectrum(X, "ledoit_wolf").rho == pytest.approx(rho, abs=1e-12)
    np.testing.assert_allclose(f.covariance("m"), sigma, atol=1e-12)
    w, V = np.linalg.eigh(sigma)
    inv_sqrt = V @ np.diag(w ** -0.5) @ V.T
    Z = f.to_frame(X, "m")
    np.testing.assert_allclose(Z.T @ Z / n, inv_sqrt @ S @ inv_sqrt, atol=1e-10)   # ZCA: z = (x − μ) Σ̂^{-1/2}
    np.testing.assert_allclose(f.direction_to_frame(X[:3], "m") @ Z.T, (X[:3]) @ (X - X.mean(0)).T, atol=1e-9)


def test_no_shrinkage_whitens_exactly_and_singular_covariance_is_refused():
    X = np.random.default_rng(0).standard_normal((300, 8)) @ np.random.default_rng(1).standard_normal((8, 8))
    Z = fit_whitened(X, shrinkage="none").to_frame(X, "model")
    np.testing.assert_allclose(Z.T @ Z / 300, np.eye(8), atol=1e-10)
    with pytest.raises(SpecError, match="singular"):
        fit_whitened(X[:5], shrinkage="none")
    with pytest.raises(SpecError, match="shrinkage"):
        fit_whitened(X, shrinkage="ledoit")


def test_frame_store_round_trip_reuse_and_integrity(tmp_path):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((40, 12))
    frame = fit_shared(A, A @ ortho_group.rvs(12, random_state=1), models=("a", "b"))
    url = str(tmp_path / "frames.zarr")
    assert save_frame(frame, url) is True
    assert save_frame(frame, url) is False                       # same content, same id: reused
    back = load_frame(url, frame.id)
    assert back.id == frame.id and back.kind == "shared" and back.models == ("a", "b")
    assert back.provenance["models_fit"]["a"]["n"] == 40
    np.testing.assert_array_equal(back.to_frame(A, "a"), frame.to_frame(A, "a"))
    assert load_frame(url, frame.id[:10]).id == frame.id
    ds = frame_to_dataset(frame)
    ds["mean"][0, 0] += 1e-9
    with pytest.raises(StoreError, match="corrupted"):
        frame_from_dataset(ds)
    with pytest.raises(StoreError):
        load_frame(url, "0" * 64)


# ------------------------------------------------------------------ the gauge gate

def _da(gauge, name="v"):
    return xr.DataArray(np.zeros(3), dims=("d_model",), name=name, attrs={"gauge": gauge})


def test_gate_rules():
    assert require_shared_frame(_da("invariant"), _da("invariant")) == "invariant"
    assert require_shared_frame(_da("frame:native:a"), _da("invariant")) == "frame:native:a"
    assert require_shared_frame(_da("frame:native:a"), _da("frame:native:a")) == "frame:native:a"
    assert require_shared_frame(_da("frame:shared:x"), _da("frame:shared:x")) == "frame:shared:x"
    with pytest.raises(GaugeError, match=r"'w_b'.*frame=shared"):
        require_shared_frame(_da("frame:native:a", "w_a"), _da("frame:native:b", "w_b"))
    with pytest.raises(GaugeError):
        require_shared_frame(_da("frame:shared:x"), _da("frame:shared:y"))
    with pytest.raises(GaugeError, match="mixes"):
        require_shared_frame(_da("mixed:frame:native:a|frame:native:b"))


# ------------------------------------------------------------------ exact re-parameterization

def _rotated(lm_name: str, Q: np.ndarray):
    """tiny_llama (seed 3), norm gains folded, residual basis rotated by Q: the same function."""
    model, tok = build_tiny("tiny_llama", seed=3)
    rotate_residual(model, Q)
    return wrap_model(lm_name, model, tok)


def short_pairs(n: int) -> list[Pair]:
    """``n`` short pairs of random words: 2n readout activations, cheap to run."""
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta kappa sigma omega red blue green cat dog sun moon yes no".split()
    return [Pair(id=f"r{i}", prompt=" ".join(rng.choice(words, 3)), chosen=" ".join(rng.choice(words, 3)),
                 rejected=" ".join(rng.choice(words, 2))) for i in range(n)]


@pytest.fixture(scope="module")
def reparam():
    Q = ortho_group.rvs(D, random_state=7)
    lm_a, lm_b = _rotated("a", np.eye(D)), _rotated("b", Q)
    enc = encode_pairs(lm_a.tokenizer, short_pairs(40))
    return Q, lm_a, lm_b, capture(lm_a, enc, (), batch_size=16), capture(lm_b, enc, (), batch_size=16)


def test_rotation_leaves_margins_identical(reparam):
    Q, _, _, cap_a, cap_b = reparam
    m_a = cap_a.logits[:, 0, 0] - cap_a.logits[:, 1, 0]
    m_b = cap_b.logits[:, 0, 0] - cap_b.logits[:, 1, 0]
    np.testing.assert_allclose(m_a, m_b, atol=1e-5)
    np.testing.assert_allclose(cap_b.h, cap_a.h @ Q.T, atol=1e-4)
    agree = compare_margins(xr.DataArray(m_a, dims="pair"), xr.DataArray(m_b, dims="pair"), n_boot=200, n_perm=200)
    assert agree["estimate"].sel(statistic="pearson") > 0.9999


def test_shared_frame_recovers_identical_directions_and_gate_refuses_raw(reparam):
    Q, lm_a, lm_b, cap_a, cap_b = reparam
    h_a, h_b = cap_a.h.reshape(-1, D), cap_b.h.reshape(-1, D)
    assert h_a.shape[0] > D                                        # unique Procrustes alignment
    frame = fit_shared(h_a, h_b, models=("a", "b"))
    assert frame.provenance["alignment_residual"] < 1e-4
    w_a, w_b = as_direction(lm_a.head.W[0], "a", "w_a"), as_direction(lm_b.head.W[0], "b", "w_b")
    raw_cos = float(w_a.values @ w_b.values / np.linalg.norm(w_a.values) / np.linalg.norm(w_b.values))
    assert abs(raw_cos) < 0.9                                      # the raw frames disagree
    res = compare_directions(w_a, w_b, frame, n_null=500, seed=0)
    assert float(res["cosine"]) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(res["a_in_frame"], res["b_in_frame"], rtol=0,
                               atol=1e-4 * float(np.abs(res["b_in_frame"]).max()))
    assert res["cosine"].attrs["gauge"] == f"frame:shared:{frame.id}"
    assert float(res["null_abs_cosine"].sel(quantile=0.99)) < 0.5 and float(res["p_value"]) < 0.01
    np.testing.assert_allclose(frame.to_frame(h_a, "a"), frame.to_frame(h_b, "b"), atol=1e-3)
    with pytest.raises(GaugeError, match=r"w_a.*frame=shared"):
        compare_directions(w_a, w_b)                              # raw native frames of two models
    with pytest.raises(GaugeError):
        compare_directions(w_a, w_b, fit_whitened(h_a, "a"))      # a frame that does not cover b


# ------------------------------------------------------------------ planted multi-objective head

def _run_objectives(lm, pairs):
    obs = load_observable("objectives")
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name)
    plan = build_plan(obs, info, load_observable)
    return compute(lm, pairs, plan, info, batch_size=8)[0]


@torch.no_grad()
def test_planted_k4_head_geometry_and_conflicts():
    model, tok = build_tiny("tiny_llama", num_labels=4, seed=1)
    rng = np.random.default_rng(0)
    w = rng.standard_normal(D)
    orth = rng.standard_normal(D)
    orth -= (orth @ w) / (w @ w) * w
    model.score.weight.copy_(torch.as_tensor(np.stack([w, w, -w, orth]) * 0.05, dtype=torch.float32))
    ds = _run_objectives(wrap_model("k4", model, tok, objectives=("base", "same", "opposite", "orthogonal")),
                         make_pairs(12))
    cos = ds["objective_cosine"]
    assert cos.dims == ("objective", "objective_b") and cos.attrs["gauge"] == "frame:native:k4"
    np.testing.assert_allclose(cos.sel(objective="base").values, [1, 1, -1, 0], atol=1e-6)
    wcos = ds["objective_cosine_whitened"]
    assert wcos.attrs["gauge"].startswith("frame:whitened:")
    np.testing.assert_allclose(wcos.sel(objective="base", objective_b=["same", "opposite"]).values, [1, -1], atol=1e-6)
    conflict = ds["objective_conflict"].sel(objective="base")
    assert float(conflict.sel(objective_b="same")) == 0.0 and float(conflict.sel(objective_b="opposite")) == 1.0
    corr = ds["objective_margin_correlation"].sel(objective="base")
    np.testing.assert_allclose(corr.sel(objective_b=["same", "opposite"]).values, [1, -1], atol=1e-6)
    assert ds["objective_margin"].dims == ("pair", "objective")
    assert ds["objective_conflict"].attrs["gauge"] == "invariant"


def test_objectives_observable_refuses_single_objective_head_at_plan_time():
    model, tok = build_tiny("tiny_llama")
    lm = wrap_model("k1", model, tok)
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=("reward",), model_name="k1")
    with pytest.raises(SpecError, match="num_labels"):
        build_plan(load_observable("objectives"), info, load_observable)


# ------------------------------------------------------------------ margin agreement

def test_compare_margins_identical_and_independent():
    rng = np.random.default_rng(0)
    m = rng.standard_normal(60)
    same = compare_margins(m, m.copy(), n_boot=500, n_perm=500, seed=1)
    np.testing.assert_allclose(same["estimate"].values, 1.0, atol=1e-12)
    assert (same["ci_low"] <= 1.0 + 1e-12).all() and (same["ci_high"] >= 1.0 - 1e-12).all()
    assert (same["p_perm"] < 0.01).all()
    indep = compare_margins(rng.standard_normal(200), rng.standard_normal(200), n_boot=500, n_perm=500, seed=1)
    assert (indep["ci_low"] < 0).all() and (indep["ci_high"] > 0).all()
    assert (indep["p_perm"] > 0.05).all()
    with pytest.raises(GaugeError):
        compare_margins(_da("frame:native:a"), _da("frame:native:b"))


def test_native_frame_is_identity():
    f = native_frame("a", 5)
    x = np.arange(10.0).reshape(2, 5)
    np.testing.assert_array_equal(f.to_frame(x, "a"), x)
    assert f.gauge == "frame:native:a"
