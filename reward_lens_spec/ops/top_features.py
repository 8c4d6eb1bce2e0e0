"""top_features: the k entries of a per-pair attribution with the largest mean |value| over pairs, within
each group of pairs (e.g. the SAE features carrying the most margin in each diagnostic dimension).

Input: x (pair × ``dim`` [× objective]), e.g. ``sae_attribution``'s ``contribution`` (pair × feature).
Output: (``by`` ×) rank [× objective]: the signed mean over the group's pairs of the entries ranked
1..k by mean |x| (NaN pairs skipped; ties broken by the lower index), in x's units, with the non-index
coordinate ``<dim>_id`` ((``by`` ×) rank [× objective]) naming which entry holds each rank. The mean
|x| ranks, so features that push the margin both ways across pairs still count; the stored value is
the signed mean (what they add to the group's mean margin). Reduces over pairs (second stage).
Errors: ``SpecError`` when x lacks ``pair`` or ``dim``, or ``k`` < 1.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import Operator, need_dim, without


@dataclass(frozen=True)
class TopFeaturesParams:
    k: int = 5
    dim: str = "feature"
    by: Optional[str] = "dimension"    # a non-index coordinate of pair; None: all pairs as one group


@OPERATORS.register
class TopFeatures(Operator):
    """Top-k entries of ``dim`` by mean |value| over pairs, per group (``by``): (by ×) rank, signed means."""

    name = "top_features"
    dims = "x (pair × dim [× objective]) → [by ×] rank [× objective]"
    Params = TopFeaturesParams

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "pair", where, "the pairs to average over")
        need_dim(in_dims[0], self.p.dim, where, "the entries to rank", param="dim")
        if not (isinstance(self.p.k, int) and self.p.k >= 1):
            raise SpecError(where + ".k", f"must be an integer >= 1, got {self.p.k!r}.")
        rest = without(in_dims[0], "pair", self.p.dim)
        if set(rest) - {"objective"}:
            raise SpecError(where + ".input", f"needs pair × {self.p.dim} [× objective], got {in_dims[0]}.")
        return ((self.p.by,) if self.p.by else ()) + ("rank",) + rest

    def run(self, ctx, x):
        p = self.p
        x = x.transpose("pair", p.dim, ...)
        k = min(p.k, x.sizes[p.dim])
        if p.by:
            labels = [str(v) for v in x[p.by].values]
            groups = sorted(set(labels))
            masks = [np.array([lab == g for lab in labels]) for g in groups]
        else:
            groups, masks = [None], [np.ones(x.sizes["pair"], bool)]
        vals = np.asarray(x.values, np.float64)
        ids = np.asarray(x[p.dim].values)
        val_out, id_out = [], []
        for m in masks:
            sub = vals[m]
            with warnings.catch_warnings():                                     # all-NaN columns: NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, mabs = np.nanmean(sub, 0), np.nanmean(np.abs(sub), 0)       # dim [× objective]
            order = np.argsort(-np.nan_to_num(mabs, nan=-1.0), axis=0, kind="stable")[:k]
            val_out.append(np.take_along_axis(mean, order, 0))
            id_out.append(ids[order])
        rest = tuple(d for d in x.dims if d not in ("pair", p.dim))
        dims = ((p.by,) if p.by else ()) + ("rank",) + rest
        data, idc = np.stack(val_out), np.stack(id_out)
        if not p.by:
            data, idc = data[0], idc[0]
        coords = {"rank": np.arange(1, k + 1), f"{p.dim}_id": (dims, idc),
                  **({p.by: groups} if p.by else {}), **{d: x[d].values for d in rest}}
        out = xr.DataArray(data, dims=dims, coords=coords)
        out.attrs = {**x.attrs, "description": f"top-{k} {p.dim}s by mean |value| over pairs"
                     + (f" within each {p.by}" if p.by else "") + " (signed mean)"}
        return out

