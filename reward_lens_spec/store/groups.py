"""One Zarr group per output variable: each variable stored with exactly its own coordinates.

Layout (store layout 3) of one observable of a run::

    runs/<run_id>/<attempt>/<observable>/            attrs: trust, gauge, units, provenance summary,
                                                    run id, ``output_variables`` (their order)
    runs/<run_id>/<attempt>/<observable>/<variable>/ one Dataset: that variable and its coords

so ``xr.open_zarr(url, group=".../<observable>/<variable>")`` or
``xr.open_datatree(url, group=".../<observable>", engine="zarr")`` reads it with plain xarray and
no variable is padded to another's coordinate set. Runs written before layout 3 hold one Dataset
in the observable group; ``open_variables`` still reads them (with whatever padding they stored).
"""
from __future__ import annotations

import xarray as xr

from reward_lens_spec.result import Result
from reward_lens_spec.store._attrs import portable

VARIABLES = "output_variables"
ZARR_KW = dict(consolidated=False, zarr_format=3)


def variable_dataset(da: xr.DataArray, name: str) -> xr.Dataset:
    """``da`` alone as a Dataset (its own coords only), strings made Zarr-v3 portable."""
    return portable(da.to_dataset(name=name))


def set_group_attrs(zstore, group: str, attrs: dict) -> None:
    """Replace the attrs of the (existing or new) group ``group``."""
    import zarr

    g = zarr.open_group(store=zstore, path=group, mode="a", zarr_format=3)
    g.attrs.put(attrs)


def write_variables(zstore, res, group: str, attrs: dict | None = None) -> None:
    """Write every variable of ``res`` (Result or Dataset) as ``group/<variable>``, then ``group``'s attrs
    (``attrs`` plus ``output_variables``), so the listing is written last."""
    res = Result.of(res)
    for name, da in res.items():
        variable_dataset(da, name).to_zarr(zstore, group=f"{group}/{name}", mode="w", **ZARR_KW)
    if attrs is not None:
        set_group_attrs(zstore, group, {**attrs, VARIABLES: list(res)})


def group_attrs(zstore, group: str) -> dict:
    import zarr

    return dict(zarr.open_group(store=zstore, path=group, mode="r", zarr_format=3).attrs)


def open_variable(zstore, group: str, name: str, *, lazy: bool = True) -> xr.DataArray:
    """The variable stored at ``group/name`` (dask-backed when ``lazy``; its coords in memory)."""
    ds = xr.open_zarr(zstore, group=f"{group}/{name}", chunks={} if lazy else None, **ZARR_KW)
    da = ds[name]
    da = da.assign_coords({c: da[c].load() for c in da.coords})
    return da if lazy else da.load()


def open_variables(zstore, group: str, names=None, *, lazy: bool = True) -> Result:
    """The observable stored at ``group`` as a ``Result`` (attrs: the group's, less ``output_variables``).

    ``names``: only these variables (default: the group's ``variables`` listing). A group written
    before layout 3 (one Dataset, no listing) is read as that Dataset's variables.
    Raises ``FileNotFoundError`` / ``KeyError`` for a missing group or variable, and ``KeyError`` for a
    group with neither a listing nor arrays of its own.
    """
    if names is not None and not list(names):
        return Result({})
    attrs = group_attrs(zstore, group)
    listed = attrs.pop(VARIABLES, None)
    if listed is None and names is None:                        # layout ≤ 2: one Dataset
        ds = xr.open_zarr(zstore, group=group, chunks={} if lazy else None, **ZARR_KW)
        if not ds.data_vars:
            raise KeyError(f"group {group} lists no {VARIABLES} and holds no arrays of its own")
        return Result.of(ds if lazy else ds.load())
    want = list(listed if names is None else names)
    return Result({n: open_variable(zstore, group, n, lazy=lazy) for n in want}, attrs)
