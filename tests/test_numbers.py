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
