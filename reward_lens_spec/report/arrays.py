"""Array helpers shared by the report's plots and figures (numpy only; no plotting)."""
from __future__ import annotations

import numpy as np

from ..stats import mean_ci  # noqa: F401  (the report's plots and figures import it from here)

BINS_PER_UNIT = 20                  # crystallization histogram: bins of 0.05 (fraction of depth)


def strs(values) -> np.ndarray:
    """Any string array (numpy StringDType from zarr included) → flat ``<U`` array."""
    return np.array([str(x) for x in np.asarray(values, dtype=object).reshape(-1)])


def first_objective(da):
    """``(da at the first objective, " [name]")`` when ``da`` has an ``objective`` dim, else ``(da, "")``."""
    if "objective" in da.dims:
        name = str(da["objective"].values[0])
        return da.isel(objective=0), f" [{name}]"
    return da, ""


def crystallization_bins(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(edges, counts) over the finite ``v``: 0.05-wide bins on [0, 1], extended to cover every value.

    Inside [0, 1] bins are [a, b) and the last is [0.95, 1]; below 0 bins are [a, b), above 1
    they are (a, b], so a value outside [0, 1] never shares a bin with one inside.
    ``counts.sum()`` equals the number of finite values: nothing is dropped (``numpy.histogram``
    over [0, 1] alone drops what lies outside).
    """
    v = np.asarray(v, float).ravel()
    v = v[np.isfinite(v)]
    s = v * BINS_PER_UNIT
    k = np.where(v < 0, np.floor(s), np.where(v > 1, np.ceil(s) - 1, np.minimum(np.floor(s), BINS_PER_UNIT - 1)))
    k_lo = min(0, int(k.min())) if v.size else 0
    k_hi = max(BINS_PER_UNIT, int(k.max()) + 1) if v.size else BINS_PER_UNIT
    edges = np.arange(k_lo, k_hi + 1) / BINS_PER_UNIT               # k / 20: 0 and 1 are exact edges
    return edges, np.bincount((k - k_lo).astype(int), minlength=k_hi - k_lo)
