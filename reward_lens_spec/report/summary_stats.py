"""The one statistic that fits each output, for the console table and the run document.

A plain mean over every cell says nothing for some shapes: a share over components always means
``1/|component|``, a spectral density ``1/bins``, a pairwise matrix (members × members, objectives ×
objectives) averages in its diagonal, and an ``estimate × ci_low × ci_high`` triple averages the estimate
with its own bounds. ``summary_cell`` picks, in this order:

1. ``bound`` dim with ``estimate``, ``ci_low``, ``ci_high``: the estimate with its interval as one cell
   (``0.904 [0.85, 0.95]``), per element of one other dim when there is one (``before …; after …``);
2. a pairwise matrix — a dim ``d`` and its partner ``other``, ``d_b`` or ``d_2`` with the same coordinate
   labels (members × other, objective × objective_b): the mean of the finite off-diagonal cells (``layer ×
   head`` with labels 0…3 each is not one);
3. a dim (not ``pair``) along which every finite slice sums to one constant (a share, a density): the mean
   of each element over the other dims (``embed 0.12 attn 0.55 mlp 0.33``); past six elements, the
   element with the largest mean (``peak <label> 0.41``);
4. otherwise the mean over finite cells.

The cell is text with its statistic named; only computed numbers are printed, and a variable with no
finite cell says so. Values are read lazily (xarray reductions), so a large output is not loaded whole.
"""
from __future__ import annotations

import numpy as np

BOUNDS = ("estimate", "ci_low", "ci_high")
MAX_LISTED = 6
SUM_RTOL = 1e-6


def _f(x: float) -> str:
    return f"{x:.4g}" if np.isfinite(x) else "nan"


def _labels(var, dim) -> list[str]:
    if dim not in var.coords:
        return [str(i) for i in range(var.sizes[dim])]
    vals = var[dim].values
    return [_f(float(v)) for v in vals] if np.issubdtype(vals.dtype, np.floating) else [str(v) for v in vals]


def _interval(var) -> str | None:
    if "bound" not in var.dims or not set(BOUNDS) <= set(_labels(var, "bound")):
        return None
    est = var.sel(bound=list(BOUNDS))
    other = [d for d in est.dims if d != "bound" and est.sizes[d] > 1]
    if len(other) > 1 or (other and est.sizes[other[0]] > MAX_LISTED):
        m = est.sel(bound="estimate").mean(skipna=True)
        return f"mean estimate {_f(float(m))}"
    def one(t) -> str:
        e, lo, hi = (float(np.asarray(t.sel(bound=b).values).reshape(-1)[0]) for b in BOUNDS)
        return f"{_f(e)} [{_f(lo)}, {_f(hi)}]"
    if not other:
        return "estimate " + one(est)
    d = other[0]
    return "; ".join(f"{lab} {one(est.isel({d: i}))}" for i, lab in enumerate(_labels(est, d)))


def _off_diagonal(var) -> str | None:
    dims = list(var.dims)
    for i, a in enumerate(dims):
        for b in dims[i + 1:]:
            if (b in ("other", f"{a}_b", f"{a}_2") and var.sizes[a] == var.sizes[b] > 1
                    and _labels(var, a) == _labels(var, b)):
                n = var.sizes[a]
                v = np.moveaxis(np.asarray(var.transpose(a, b, ...).values, float), (0, 1), (-2, -1))
                off = v[..., ~np.eye(n, dtype=bool)]
                off = off[np.isfinite(off)]
                return f"off-diagonal mean {_f(float(off.mean()))}" if off.size else "off-diagonal: no finite cell"
    return None


def _constant_sum_dim(var) -> str | None:
    """A dim along which every finite slice sums to one constant: over at least two slices, or, for a
    single slice, to 1 in a ``fraction``'s units."""
    for d in var.dims:
        if d == "pair" or var.sizes[d] < 2:
            continue
        s = var.sum(d, skipna=False)
        n = int(np.isfinite(s).sum())
        if n == 0:                      # no finite slice: no min or max to read (one pass over the data, not three)
            continue
        finite = s.where(np.isfinite(s))
        lo, hi = float(finite.min(skipna=True)), float(finite.max(skipna=True))
        if abs(hi - lo) > SUM_RTOL * max(1.0, abs(hi)):
            continue
        if n >= 2 or (var.attrs.get("units") == "fraction" and abs(hi - 1.0) <= SUM_RTOL):
            return d
    return None


def _per_element(var, d) -> str:
    means = var.where(np.isfinite(var)).mean([x for x in var.dims if x != d], skipna=True)
    vals = np.asarray(means.values, float)
    labels = _labels(var, d)
    if len(labels) <= MAX_LISTED:
        return " ".join(f"{lab} {_f(v)}" for lab, v in zip(labels, vals))
    k = int(np.nanargmax(vals)) if np.isfinite(vals).any() else 0
    return f"peak at {labels[k]} ({_f(float(vals[k]))})"


def summary_cell(var, finite: bool | None = None) -> str:
    """The statistic that fits ``var`` (an ``xarray.DataArray``, any dims), as one named cell of text.
    ``finite``: whether ``var`` has a finite cell, when the caller knows it already (a lazily read output is
    then not read once more to find out); None: read."""
    if var.size == 0:
        return "(empty)"
    if not (bool(np.isfinite(var).any()) if finite is None else finite):
        return "(no finite)"
    for rule in (_interval, _off_diagonal):
        cell = rule(var)
        if cell is not None:
            return cell
    d = _constant_sum_dim(var)
    if d is not None:
        return f"per {d}: " + _per_element(var, d)
    return f"mean {_f(float(var.where(np.isfinite(var)).mean(skipna=True)))}"
