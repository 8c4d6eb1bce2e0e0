"""Per-group statistics of a per-pair value with cluster-bootstrap CIs (``accuracy``, ``effect_size``).

The bootstrap and the effective n are ``stats``'s: whole prompt clusters resampled
(``data.checksum.prompt_cluster_key``; Field & Welsh 2007, "Bootstrapping clustered data"),
percentile intervals (Efron & Tibshirani 1993, ch. 13), seeded; ``n_eff`` = distinct prompt
clusters, the project's effective sample size (``data.effective_sample_size``).
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from ..errors import SpecError
from .base import INVARIANT, labelled
from .confounders import prompt_groups as prompt_clusters
from ..stats import bootstrap_ci, n_eff

BOUNDS = ("estimate", "ci_low", "ci_high")


def by_group(ctx, x: xr.DataArray, stat, by, cluster: str, ci: float, resamples: int, seed: int, units: str,
             description: str) -> xr.DataArray:
    """``stat(values (n,)) -> float`` per group of ``by`` (a pair coord; None = all pairs) and per cell
    of the input's other dims, with bounds; dims ([by] ×) others × ``bound``; coords ``n``, ``n_eff``
    (per group). ``cluster``: ``prompt`` (clusters resampled) or ``pair`` (plain bootstrap). Pairs
    with a NaN value (e.g. outside ``observable.pairs``) are dropped per cell."""
    if not 0 < ci < 1:
        raise SpecError("observable.steps.ci", f"ci must be in (0, 1), got {ci}.", fix="e.g. ci: 0.95 in the step.")
    if by and (by not in x.coords or x.coords[by].dims != ("pair",)):
        raise SpecError("observable.steps.by", f"'{by}' is not a pair coordinate.",
                        options=[k for k, v in x.coords.items() if v.dims == ("pair",)])
    xt = x.transpose("pair", ...)
    vals = np.asarray(xt.values, np.float64)
    flat = vals.reshape(vals.shape[0], -1)
    groups = np.asarray(xt.coords[by].values) if by else np.full(vals.shape[0], "all")
    clusters = prompt_clusters(ctx) if cluster == "prompt" else None
    names = list(dict.fromkeys(groups.tolist()))
    data = np.full((len(names), flat.shape[1], 3), np.nan)
    n, ne = [], []
    for gi, g in enumerate(names):
        rows = np.flatnonzero(groups == g)
        for j in range(flat.shape[1]):
            r = rows[np.isfinite(flat[rows, j])]
            v, cl = flat[r, j], None if clusters is None else clusters[r]
            if r.size:
                data[gi, j] = (stat(v), *bootstrap_ci(lambda idx, v=v: stat(v[idx]), r.size, groups=cl,
                                                       n_boot=resamples, seed=seed, level=ci))
        keep = rows[np.isfinite(flat[rows]).all(1)]
        n.append(int(keep.size))
        ne.append(n_eff(None if clusters is None else clusters[keep], int(keep.size)))
    other = xt.dims[1:]
    data = data.reshape((len(names),) + vals.shape[1:] + (3,))
    coords = {k: v for k, v in xt.coords.items() if "pair" not in v.dims}
    if by:
        arr = xr.DataArray(data, dims=(by,) + other + ("bound",),
                           coords={**coords, "bound": list(BOUNDS), by: np.array(names, dtype=str),
                                   "n": (by, n), "n_eff": (by, ne)})
    else:
        arr = xr.DataArray(data[0], dims=other + ("bound",),
                           coords={**coords, "bound": list(BOUNDS), "n": n[0], "n_eff": ne[0]})
    res = labelled(arr, units, INVARIANT, description)
    res.attrs.update(ci=ci, resamples=resamples, seed=seed, cluster=cluster,
                     method="cluster bootstrap over prompt clusters, percentile interval"
                     if cluster == "prompt" else "bootstrap over pairs, percentile interval")
    return res
