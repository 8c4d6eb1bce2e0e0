"""Attribute hygiene for the store: JSON-safety of run attrs, portable dtypes,
and JSON-encoding of attrs that a target format cannot hold.

Zarr v3 attributes are JSON, so ``None`` and nested dicts round-trip through
the store unchanged. netCDF (``Store.export(..., "x.nc")``) cannot hold them:
there each such attr is written as a JSON string and its name is listed in the
``_json_attrs`` attr (comma-separated); ``decode_json_attrs`` undoes that.
"""
from __future__ import annotations

import json
import math
import numbers

import numpy as np
import xarray as xr

from reward_lens_spec.errors import StoreError

JSON_ATTRS = "_json_attrs"


def check_json_safe(value, where: str = "attrs") -> None:
    """Raise ``StoreError`` naming the first key path whose value is not plain JSON.

    Plain JSON: None, bool, int, finite float, str, list/tuple of those, dict
    with str keys. numpy scalars and arrays are refused (call ``.item()`` /
    ``.tolist()`` first) so that what is stored is exactly what was passed.
    """
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int) and type(value) is not bool and not isinstance(value, np.generic):
        return
    if isinstance(value, float) and not isinstance(value, np.generic):
        if not math.isfinite(value):
            raise StoreError(f"{where} = {value!r} is not JSON-safe (NaN/inf). "
                             "Fix: store null or a string instead.")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json_safe(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise StoreError(f"{where} has a non-string key {k!r}; JSON keys must be strings.")
            check_json_safe(item, f"{where}[{k!r}]")
        return
    raise StoreError(f"{where} = {value!r} ({type(value).__name__}) is not JSON-safe. "
                     "Fix: convert it to str/int/float/bool/None/list/dict "
                     "(numpy values: .item() or .tolist()).")



def attrs_problem(attrs: dict, *, numpy_top: bool = True) -> tuple[str, object] | None:
    """The first ``(key path, value)`` among ``attrs`` that a Zarr v3 attribute (JSON) cannot hold, else None.

    ``numpy_top``: a top-level numpy array or scalar is fine (xarray writes ``.tolist()`` / ``.item()`` of it,
    as for a variable's attrs); nested values must be plain JSON: str, int, float, bool, None, list/tuple,
    dict with str keys.
    """
    def bad(value, path):
        if value is None or isinstance(value, (str, bool)):
            return None
        if isinstance(value, (int, float)) and not isinstance(value, np.generic):
            return None
        if isinstance(value, (list, tuple)):
            return next((b for i, v in enumerate(value) if (b := bad(v, f"{path}[{i}]"))), None)
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    return path + f"[{k!r}] (a non-string key)", k
                if (b := bad(v, f"{path}[{k!r}]")):
                    return b
            return None
        return path, value

    for key, value in attrs.items():
        if numpy_top and isinstance(value, (np.ndarray, np.generic)):
            continue
        found = bad(value, repr(key)) if isinstance(key, str) else (f"{key!r} (a non-string key)", key)
        if found:
            return found
    return None

def portable(ds: xr.Dataset) -> xr.Dataset:
    """Copy of ``ds`` with fixed-width unicode arrays made variable-length strings.

    Zarr v3 has a specified variable-length ``string`` type but only an
    unstable fixed-width one, so ``<U`` data and coords are written as object
    strings; readers get the same values back.
    """
    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        if var.dtype.kind == "U":
            new = var.astype(object)
            new.encoding = {k: v for k, v in var.encoding.items() if k != "dtype"}
            if name in ds.coords:
                out = out.assign_coords({name: new})
            else:
                out[name] = new
    return out


def _netcdf_ok(value) -> bool:
    if isinstance(value, (bool, np.bool_)) or value is None:
        return False
    if isinstance(value, (str, numbers.Number, np.number)):
        return True
    if isinstance(value, (list, tuple, np.ndarray)):
        arr = np.asarray(value)
        return arr.ndim == 1 and arr.dtype.kind in "iuf" and arr.size > 0
    return False


def _encode(attrs: dict) -> dict:
    out, encoded = {}, []
    for k, v in attrs.items():
        if _netcdf_ok(v):
            out[k] = v
        else:
            out[k] = json.dumps(v, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
            encoded.append(k)
    if encoded:
        out[JSON_ATTRS] = ",".join(encoded)
    return out


def _decode(attrs: dict) -> dict:
    names = [n for n in str(attrs.get(JSON_ATTRS, "")).split(",") if n]
    out = {k: v for k, v in attrs.items() if k != JSON_ATTRS}
    for n in names:
        if n in out:
            out[n] = json.loads(out[n])
    return out


def encode_json_attrs(ds: xr.Dataset) -> xr.Dataset:
    """Copy of ``ds`` whose dataset and variable attrs netCDF can store.

    None, bools, dicts and lists of strings become JSON strings, listed in
    ``_json_attrs``.
    """
    out = ds.copy(deep=False)
    out.attrs = _encode(ds.attrs)
    for name, var in out.variables.items():
        var.attrs = _encode(ds.variables[name].attrs)
    return out


def decode_json_attrs(ds: xr.Dataset) -> xr.Dataset:
    """Inverse of ``encode_json_attrs`` (for a dataset read back from netCDF)."""
    out = ds.copy(deep=False)
    out.attrs = _decode(ds.attrs)
    for name, var in out.variables.items():
        var.attrs = _decode(ds.variables[name].attrs)
    return out
