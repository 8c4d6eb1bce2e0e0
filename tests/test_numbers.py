"""Numbers that keep their definitions: worked values, computed by hand, for the operators' outputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.ops.bradley_terry import bt
from reward_lens_spec.ops.first_crossing import FirstCrossing, FirstCrossingParams

LAYERS = [-1, 0, 1, 2, 3]          # embedding, then 4 layers
CURVES = {                          # curve → (crystallization layer, depth fraction), by hand
    "rises at layer 1": ([0.0, 0.1, 0.6, 0.4, 1.0], 1, 0.5),
    "negative margin": ([0.0, -0.6, 0.2, -0.3, -1.0], 0, 0.25),
    "at the embedding": ([0.7, 0.2, 0.9, 0.8, 1.0], -1, 0.0),
    "only at the last layer": ([0.0, 0.0, 0.49, 0.1, 1.0], 3, 1.0),
    "zero final margin": ([0.3, 0.1, 0.2, 0.0, 0.0], None, None),
}


def _cross(quantity):
    curves = np.array([c for c, _, _ in CURVES.values()])
    x = xr.DataArray(curves, dims=("pair", "layer"), coords={"pair": list(CURVES), "layer": LAYERS})
    return FirstCrossing(FirstCrossingParams(dim="layer", fraction=0.5, quantity=quantity)).run(None, x)


def test_crystallization_worked_values():
    layer, frac = _cross("coordinate"), _cross("depth_fraction")
    for name, (_, want_layer, want_frac) in CURVES.items():
        got_l, got_f = float(layer.sel(pair=name)), float(frac.sel(pair=name))
        if want_layer is None:
            assert math.isnan(got_l) and math.isnan(got_f), name
        else:
            assert (got_l, got_f) == (want_layer, want_frac), name
    assert frac.attrs["units"] == "fraction" and layer.attrs["units"] == "layer"


def test_crystallization_fraction_spans_zero_to_one():
    f = _cross("depth_fraction").values
    f = f[np.isfinite(f)]
    assert f.min() == 0.0 and f.max() == 1.0


@pytest.mark.parametrize("delta", [-50.0, -3.0, 0.0, math.log(3), 5.0, 40.0, 700.0])
def test_bt_grad_is_minus_sigmoid_of_minus_delta(delta):
    want = -1.0 / (1.0 + math.exp(delta)) if delta < 700 else -math.exp(-delta)   # −σ(−Δ), exact form
    got = float(bt(delta, "grad"))
    assert got == pytest.approx(want, rel=1e-12, abs=0.0) if want != 0 else got == 0.0
    assert got < 0                                    # never rounds to 0 below float64's range


def test_bt_worked_values():
    d = math.log(3)
    assert float(bt(d, "p")) == pytest.approx(0.75, rel=1e-15)
    assert float(bt(d, "loss")) == pytest.approx(math.log(4 / 3), rel=1e-14)
    assert float(bt(d, "grad")) == pytest.approx(-0.25, rel=1e-14)
    assert float(bt(40.0, "grad")) == pytest.approx(-math.exp(-40.0), rel=1e-12)   # σ(Δ) − 1 would give 0


# -- frame cosines under a re-parameterisation of the residual basis (x → xA, w → w A^{-T}) ------------

def _cos(u, v):
    u, v = np.asarray(u, float).ravel(), np.asarray(v, float).ravel()
    return float(u @ v / np.sqrt((u @ u) * (v @ v)))


def _setup(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)    # anisotropic, off-centre
    A = rng.normal(size=(d, d)) + 0.1 * np.eye(d)                                  # random invertible, not orthogonal
    assert abs(np.linalg.det(A)) > 1e-3 and not np.allclose(A @ A.T, np.eye(d))
    w = rng.normal(size=(2, d))
    return X, A, w, w @ np.linalg.inv(A).T                # w·x = w'·x' row by row


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_whitened_cosines_invariant_under_invertible_basis_change(seed):
    from reward_lens_spec.frames.fit import fit_whitened
    X, A, w, w_new = _setup(200, 8, seed)                 # n > d: no shrinkage needed, invariance exact
    f, g = fit_whitened(X), fit_whitened(X @ A)
    assert f.provenance["invariance"] == "exact" and g.provenance["models_fit"]["model"]["shrinkage_intensity"] == 0
    before = _cos(*f.direction_to_frame(w, "model"))
    after = _cos(*g.direction_to_frame(w_new, "model"))
    assert after == pytest.approx(before, abs=1e-9)
    lw = _cos(*fit_whitened(X @ A, shrinkage="ledoit_wolf").direction_to_frame(w_new, "model"))
    assert abs(lw - _cos(*fit_whitened(X, shrinkage="ledoit_wolf").direction_to_frame(w, "model"))) > 1e-4


@pytest.mark.parametrize("seed", [0, 1])
def test_shared_cosines_invariant_under_invertible_basis_change(seed):
    from reward_lens_spec.frames.fit import fit_shared
    Xa, A, wa, wa_new = _setup(300, 6, seed)
    Xb, B, wb, wb_new = _setup(300, 6, seed + 10)
    Xb = Xb + Xa @ np.random.default_rng(seed).normal(size=(6, 6))      # related models, same inputs
    f = fit_shared(Xa, Xb, ("a", "b"))
    g = fit_shared(Xa @ A, Xb @ B, ("a", "b"))
    assert f.provenance["invariance"] == g.provenance["invariance"] == "exact"
    for i in range(2):
        before = _cos(f.direction_to_frame(wa[i], "a"), f.direction_to_frame(wb[i], "b"))
        after = _cos(g.direction_to_frame(wa_new[i], "a"), g.direction_to_frame(wb_new[i], "b"))
        assert after == pytest.approx(before, abs=1e-8)


def test_few_activations_shrink_and_say_invariance_is_approximate():
    from reward_lens_spec.frames.fit import fit_whitened
    X, A, w, w_new = _setup(6, 10, 3)                     # n < d: the covariance is singular, shrinkage needed
    f = fit_whitened(X)
    prov = f.provenance["models_fit"]["model"]
    assert f.provenance["invariance"] == "approximate" and prov["shrinkage_intensity"] > 0
    assert prov["invariance"].startswith("approximate: orthogonal basis changes only")
    Q, _ = np.linalg.qr(np.random.default_rng(4).normal(size=(10, 10)))     # orthogonal: still exact
    assert _cos(*fit_whitened(X @ Q).direction_to_frame(w @ Q, "model")) == \
        pytest.approx(_cos(*f.direction_to_frame(w, "model")), abs=1e-9)
    moved = abs(_cos(*fit_whitened(X @ A).direction_to_frame(w_new, "model")) - _cos(*f.direction_to_frame(w, "model")))
    assert moved > 1e-3                                   # a general invertible A moves it: hence the label


# -- patching a side into itself ----------------------------------------------------------------------

@pytest.mark.parametrize("family", ["tiny_llama", "tiny_gpt2", "tiny_gemma2"])
def test_patching_a_side_into_itself_is_exactly_zero(family):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import tiny_lm

    from reward_lens_spec.data import Pair
    from reward_lens_spec.organisms.organisms import Organism, _pairset
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.trust.scorecard import evaluate

    same = [Pair(id=f"s{i}", prompt=f"Q {i} about things", chosen=f"one answer {i}" + " x" * i,
                 rejected=f"one answer {i}" + " x" * i) for i in range(3)]
    other = Pair(id="d", prompt="Q about things", chosen="a good answer", rejected="a bad one")
    ds = evaluate(load_observable("patch"), Organism("self", 1.0, tiny_lm(family), _pairset("self", same + [other])))
    eff = ds["patch_effect"]
    assert np.all(eff.sel(pair=["s0", "s1", "s2"]).values == 0.0)            # exactly, every site
    assert np.count_nonzero(eff.sel(pair="d").values) == eff.sel(pair="d").size   # a real patch is not zeroed
