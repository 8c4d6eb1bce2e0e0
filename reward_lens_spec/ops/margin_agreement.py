"""compare_margins: gauge-invariant agreement of two models' margins on the same pairs.

Margins Δ = r_c − r_r are invariant under any change of basis of either model, so two models
can be compared through them without a shared frame. Reported for Pearson's r and Spearman's ρ:

  estimate      the correlation over pairs
  ci_low/high   percentile bootstrap interval over pairs resampled with replacement
                (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13)
  p_perm        two-sided permutation p-value against shuffled pairings (model b's margins
                permuted across pairs): (1 + #{|stat_perm| ≥ |stat|}) / (1 + n_perm)
                (Phipson & Smyth 2010, Stat. Appl. Genet. Mol. Biol. 9(1):39)

Inputs: DataArrays with a ``pair`` dim (aligned on pair ids, inner join) or equal-length 1-D
arrays; pairs where either margin is NaN are dropped. Resamples with a constant side give NaN
and are ignored by the interval. Raises ``SpecError`` for fewer than 3 pairs or other dims,
``GaugeError`` (via the gate) for inputs in different frames.
"""
from __future__ import annotations

import numpy as np
import xarray as xr
from scipy.stats import rankdata

from ..errors import SpecError
from ..frames.gate import require_shared_frame

STATISTICS = ("pearson", "spearman")


def _pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Pearson r of (..., n) arrays (NaN where a row is constant)."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (a * b).sum(-1) / den
    return np.where(den > 0, np.clip(r, -1.0, 1.0), np.nan)


def _stats(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., 2): Pearson and Spearman (Pearson of average ranks) per row."""
    return np.stack([_pearson(a, b), _pearson(rankdata(a, axis=-1), rankdata(b, axis=-1))], -1)


def _values(m_a, m_b) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(m_a, xr.DataArray) and isinstance(m_b, xr.DataArray):
        for m in (m_a, m_b):
            if m.dims != ("pair",):
                raise SpecError("compare_margins", f"margins must have exactly the dim 'pair', got {m.dims}.",
                                fix="select one objective / layer first.")
        m_a, m_b = xr.align(m_a, m_b, join="inner")
    a, b = np.asarray(m_a, np.float64).reshape(-1), np.asarray(m_b, np.float64).reshape(-1)
    if a.shape != b.shape:
        raise SpecError("compare_margins", f"margins cover different numbers of pairs ({a.size} vs {b.size}).",
                        fix="give margins indexed by pair (a DataArray with a pair coord), or two runs on one dataset.")
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        raise SpecError("compare_margins", f"need at least 3 shared pairs with finite margins, got {int(ok.sum())}.",
                        fix="score both on more shared pairs (dataset.limit), with finite margins.")
    return a[ok], b[ok]


def compare_margins(m_a, m_b, *, n_boot: int = 1000, n_perm: int = 1000, seed: int = 0, ci: float = 0.95,
                    chunk: int = 200) -> xr.Dataset:
    """Correlation of two models' margins with bootstrap CI and permutation p (see module doc).

    Returns a Dataset over dim ``statistic`` (pearson, spearman): ``estimate``, ``ci_low``,
    ``ci_high`` (units correlation) and ``p_perm`` (probability), all gauge ``invariant``;
    attrs n, n_boot, n_perm, seed, ci.
    """
    require_shared_frame(m_a, m_b, names=[str(getattr(m_a, "name", None) or "m_a"),
                                          str(getattr(m_b, "name", None) or "m_b")], op="compare_margins")
    a, b = _values(m_a, m_b)
    n = a.size
    rng = np.random.Generator(np.random.PCG64(seed))
    est = _stats(a, b)
    boot = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))
        boot.append(_stats(a[idx], b[idx]))
    boot = np.concatenate(boot) if boot else np.full((0, 2), np.nan)
    alpha = (1.0 - ci) / 2.0
    with np.errstate(invalid="ignore"):
        lo = np.nanquantile(boot, alpha, axis=0) if boot.size else np.full(2, np.nan)
        hi = np.nanquantile(boot, 1.0 - alpha, axis=0) if boot.size else np.full(2, np.nan)
    hits = np.zeros(2)
    for start in range(0, n_perm, chunk):
        k = min(chunk, n_perm - start)
        perm = rng.permuted(np.broadcast_to(b, (k, n)), axis=1)
        st = _stats(np.broadcast_to(a, (k, n)), perm)
        hits += np.sum(np.abs(st) >= np.abs(est) - 1e-12, axis=0)
    p = (1.0 + hits) / (1.0 + n_perm)
    coords = {"statistic": list(STATISTICS)}
    inv = {"gauge": "invariant"}
    ds = xr.Dataset({
        "estimate": xr.DataArray(est, dims=("statistic",), coords=coords, attrs={"units": "correlation", **inv}),
        "ci_low": xr.DataArray(lo, dims=("statistic",), coords=coords, attrs={"units": "correlation", **inv}),
        "ci_high": xr.DataArray(hi, dims=("statistic",), coords=coords, attrs={"units": "correlation", **inv}),
        "p_perm": xr.DataArray(p, dims=("statistic",), coords=coords, attrs={"units": "probability", **inv}),
    })
    ds.attrs = {"n": int(n), "n_boot": int(n_boot), "n_perm": int(n_perm), "seed": int(seed), "ci": float(ci),
                "method": "percentile bootstrap over pairs; permutation of pairings"}
    return ds
