"""Comparing directions across models — only inside one frame, beside a random-direction null.

``compare_directions(w_a, w_b, frame)`` maps each readout direction (a covector; e.g. a head
row, see ``as_direction``) from its model's native frame into ``frame`` (normally a shared
frame fitted for both models), passes the gauge gate, and returns the cosine there with a null:
|cos| between ``w_a`` and random directions drawn from the reference activations' covariance,
mapped into the frame. In a whitened or shared frame that covariance is the identity by
construction (z = (x − μ) Σ̂^{-1/2} R has covariance I under N(μ, Σ̂)), so the null vectors are
drawn as N(0, I_d) in frame coordinates; the null |cos| concentrates near √(2/(π d)).
Units: cosine (dimensionless); gauge: the frame's. Raises ``GaugeError`` when the two
directions cannot be put in one frame.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from ..errors import SpecError
from .fit import Frame, native_gauge
from .gate import gauge_of, require_shared_frame


def as_direction(w, model: str, name: str = "direction") -> xr.DataArray:
    """Wrap a (d,) vector of ``model`` as a native-frame DataArray (dims ``d_model``)."""
    arr = xr.DataArray(np.asarray(w, np.float64).reshape(-1), dims=("d_model",), name=name)
    arr.attrs = {"units": "direction", "gauge": native_gauge(model), "model": model}
    return arr


def _into(w: xr.DataArray, frame: Frame | None) -> xr.DataArray:
    if frame is None:
        return w
    g = gauge_of(w)
    if g == frame.gauge:
        return w
    model = g.split(":", 2)[2] if g.startswith("frame:native:") else None
    if model in frame.models:
        return frame.direction_to_frame(w, model)
    return w                      # left as is: the gate names it


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v)
    if n == 0:
        raise SpecError("direction", "a zero vector has no direction.",
                        fix="compare non-zero directions (check the stored vector is not all zeros).")
    return v / n


def compare_directions(w_a: xr.DataArray, w_b: xr.DataArray, frame: Frame | None = None, *, n_null: int = 1000,
                       seed: int = 0, quantiles=(0.5, 0.95, 0.99)) -> xr.Dataset:
    """Cosine of two directions in ``frame`` with a random-direction null.

    ``w_a``, ``w_b``: DataArrays with dim ``d_model`` and a ``gauge`` attr (``as_direction``).
    Returns a Dataset: ``cosine`` (scalar), ``null_abs_cosine`` (quantile), ``p_value``
    (share of null |cos| ≥ observed |cos|, with the +1 correction of Phipson & Smyth 2010),
    plus ``a_in_frame``/``b_in_frame`` (d_model). Raises ``GaugeError`` via the gate.
    """
    ua, ub = _into(w_a, frame), _into(w_b, frame)
    gauge = require_shared_frame(ua, ub, names=[str(w_a.name or "w_a"), str(w_b.name or "w_b")],
                                 op="compare_directions")
    a, b = _unit(ua.values.astype(np.float64)), _unit(ub.values.astype(np.float64))
    cos = float(a @ b)
    rng = np.random.Generator(np.random.PCG64(seed))
    g = rng.standard_normal((n_null, a.shape[0]))
    null = np.abs(g @ a) / np.linalg.norm(g, axis=1)
    p = float((1 + np.sum(null >= abs(cos))) / (1 + n_null))
    q = np.asarray(quantiles, np.float64)
    ds = xr.Dataset({
        "cosine": xr.DataArray(cos, attrs={"units": "cosine", "gauge": gauge}),
        "null_abs_cosine": xr.DataArray(np.quantile(null, q), dims=("quantile",), coords={"quantile": q},
                                        attrs={"units": "cosine", "gauge": gauge}),
        "p_value": xr.DataArray(p, attrs={"units": "probability", "gauge": gauge}),
        "a_in_frame": xr.DataArray(ua.values, dims=("d_model",), attrs={"units": "direction", "gauge": gauge}),
        "b_in_frame": xr.DataArray(ub.values, dims=("d_model",), attrs={"units": "direction", "gauge": gauge}),
    })
    ds.attrs = {"frame_id": frame.id if frame is not None else "", "n_null": int(n_null), "seed": int(seed),
                "null": "N(0, I_d) in frame coordinates (= N(0, Σ̂) mapped into a whitened frame)"}
    return ds
