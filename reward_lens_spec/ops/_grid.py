"""Shared plumbing of the intervention operators (head patching, ablation, steering): the layer grid,
the first ``observable.pairs`` pairs, and the labelled result on the run's one pair axis."""
from __future__ import annotations

import numpy as np
import xarray as xr

from ..errors import SpecError
from .base import INVARIANT, labelled
from .project import Project, ProjectParams


def grid_layers(info, where: str) -> tuple[int, ...]:
    """``observable.layers`` (default: every layer), each checked against the model's depth."""
    layers = tuple(info.layers) if info.layers is not None else tuple(range(info.n_layers))
    bad = [l for l in layers if not 0 <= l < info.n_layers]
    if bad:
        raise SpecError("observable.layers", f"layer(s) {bad} out of range for {where}; "
                        f"valid range is 0..{info.n_layers - 1}.",
                        fix=f"set observable.layers to layers in 0..{info.n_layers - 1}, or drop it (every layer).")
    return layers


def need_site(info, site: str, where: str) -> None:
    if not info.family.has_site(site):
        raise SpecError(where, f"model family '{info.family.name}' has no site '{site}'.", options=info.family.sites)


def choice(value, options, where: str) -> None:
    if value not in options:
        raise SpecError(where, f"unknown value '{value}'.", value=value, options=options)


def first_pairs(ctx) -> list[int]:
    """Indices of the pairs an intervention runs on: the first ``observable.pairs`` (default all)."""
    n = len(ctx.encoded.pair_ids)
    return list(range(n if ctx.info.pairs is None else min(ctx.info.pairs, n)))


def objective_dims(info) -> tuple[str, ...]:
    return ("objective",) if info.n_outputs > 1 else ()


def result(ctx, data: np.ndarray, pidx, dims: tuple[str, ...], coords: dict, units: str, description: str,
           method: str = "exact") -> xr.DataArray:
    """``data`` (len(pidx), *grid, output) → a labelled DataArray over every pair of the run
    (pairs outside ``pidx`` are NaN, so all variables share one pair axis); gauge invariant."""
    full = np.full((len(ctx.encoded.pair_ids),) + data.shape[1:], np.nan)
    full[pidx] = data
    coords = {**ctx.pair_coords(), **coords}
    if full.shape[-1] > 1:
        arr = xr.DataArray(full, dims=("pair",) + dims + ("objective",),
                           coords={**coords, "objective": list(ctx.lm.head.objectives)})
    else:
        arr = xr.DataArray(full[..., 0], dims=("pair",) + dims, coords=coords)
    out = labelled(arr, units, INVARIANT, description)
    out.attrs["method"] = method
    return out


def reward_direction(ctx, d: str) -> np.ndarray:
    """The d_model vector ``d`` names (``head`` | ``objective:<name>`` | ``store:…``, as ``project``
    reads it), float64. For a gated head, ``head`` is its effective direction ``g(h)ᵀW`` averaged over
    every pair and side (the gate moves with h, so no one fixed vector is the reward direction)."""
    head = ctx.lm.head
    if d == "head" and head.gate is not None:
        return head.directions(ctx.capture.h)[..., 0, :].reshape(-1, head.W.shape[1]).astype(np.float64).mean(0)
    return np.asarray(Project(ProjectParams(direction=d))._direction(ctx)[0][0], np.float64)
