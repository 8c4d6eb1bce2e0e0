"""Reading a published observable (store layout 4, ``store.publish``) back as a ``Result``: each output
variable with exactly its own coordinates under their own names.

The published group is one xarray Dataset (``xr.open_zarr(url, group="runs/<run_id>/<observable>")``
reads it as it is). Its ``stored_as`` attr says, per variable, which stored arrays are its coordinates
(``{"coords": {name: stored name}}``) and which dims were published under another name (``{"dims": {stored
dim: dim}}``, where two variables' coordinates of one name differ); a Dataset with no ``stored_as`` (a
layout-2 run, migrated) gives each variable the coordinates xarray attaches to it.
"""
from __future__ import annotations

import xarray as xr

from reward_lens_spec.result import Result
from reward_lens_spec.store.groups import ONE_PASS_BYTES, VARIABLES, ZARR_KW, finish_variable, group_attrs
from reward_lens_spec.store.publish import ATTEMPT, COORDS, STORED_AS

HIDDEN = (VARIABLES, STORED_AS, ATTEMPT, COORDS)     # the group's own bookkeeping, not the observable's attrs


def _dataset(zstore, group: str, lazy) -> xr.Dataset:
    """The group as ``xr.open_zarr(..., chunks=None)`` decodes it: every array read in one concurrent pass
    (``zarr_read.read_groups``) when ``lazy`` is False and the group is small, else lazily indexed."""
    if lazy is False:                 # one pass: the group's metadata, then its arrays when small enough
        from reward_lens_spec.store.zarr_read import read_groups

        ds = read_groups(zstore, group, (), root_max_bytes=ONE_PASS_BYTES)[0]
        if ds is not None:
            return ds.set_coords([n for n in ds.data_vars if n in str(ds.attrs.get(COORDS, "")).split()])
    return xr.open_zarr(zstore, group=group, chunks=None, **ZARR_KW)


def _own(ds: xr.Dataset, name: str, spec: dict | None) -> tuple[xr.DataArray, dict]:
    """``(variable under its own dim names, {coord name: Variable in memory})``."""
    if spec is None:
        v = ds[name]
        return v, {c: v[c].variable.load() for c in v.coords}
    dims = spec.get("dims") or {}
    var = ds.variables[name]
    back = xr.Variable([dims.get(d, d) for d in var.dims], var._data, var.attrs, var.encoding)
    enc = dict(var.encoding)
    if "preferred_chunks" in enc:
        enc["preferred_chunks"] = {dims.get(d, d): n for d, n in enc["preferred_chunks"].items()}
    back.encoding = enc
    v = xr.DataArray(back, name=name)
    coords = {}
    for own, stored in (spec.get("coords") or {}).items():
        c = ds.variables[stored].load()
        coords[own] = xr.Variable([dims.get(d, d) for d in c.dims], c.values, c.attrs)
    return v, coords


def open_published(zstore, group: str, names=None, *, lazy: bool | int = True, digests: dict | None = None,
                   where: str = "") -> Result:
    """The observable published at ``group`` as a ``Result`` (attrs: the group's, less its bookkeeping
    ``HIDDEN``). ``names``: only these variables (default: the group's ``output_variables``). ``lazy``,
    ``digests`` and ``where`` as ``store.groups.open_variables``. Raises ``KeyError`` for a group with no
    listing or a listed variable that is not stored, ``DigestError`` for data that fail their seal."""
    attrs = group_attrs(zstore, group)
    listed = attrs.get(VARIABLES)
    if listed is None:
        raise KeyError(f"group {group} lists no {VARIABLES}")
    stored_as = attrs.get(STORED_AS)
    attrs = {k: v for k, v in attrs.items() if k not in HIDDEN}
    want = list(listed if names is None else names)
    if digests is not None:
        from reward_lens_spec.store.digest import DigestError

        missing = [n for n in want if n not in digests]
        if missing or (names is None and set(digests) - set(want)):
            raise DigestError(f"{where or group}: variables {sorted(set(want) ^ set(digests))} are not those the "
                              "run's seal records; the stored data were changed after the run was written.")
    if not want:
        return Result({}, attrs)
    ds = _dataset(zstore, group, lazy)
    out = {}
    for n in want:
        if n not in ds.variables:
            raise KeyError(f"{group}: no variable {n}")
        v, coords = _own(ds, n, None if stored_as is None else stored_as.get(n, {}))
        out[n] = finish_variable(v, coords, n, lazy=lazy, digest=None if digests is None else digests[n],
                                 label=f"{where or group}: variable {n}")
    return Result(out, attrs)
