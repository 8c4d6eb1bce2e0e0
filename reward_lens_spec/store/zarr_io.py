"""Many small in-memory Datasets written as new Zarr v3 groups in one pass.

Store layout 3 (``store.groups``) writes one group per output variable; through ``Dataset.to_zarr`` every
array costs several blocking round trips to zarr's event loop (open the group, check what exists,
create, set attrs, write), one after the other. ``write_new_groups`` makes the same arrays, encoded by
xarray's own Zarr encoder (``encode_dataset_coordinates``, ``encode_zarr_variable``,
``extract_zarr_variable_encoding``: CF encoding, fill values, chunks, ``dimension_names``, attrs) with the
same ``create_array`` arguments ``to_zarr`` passes; each array's document and chunks are made in this thread
by zarr's own classes (``store.zarr_sync``), one group and one array at a time (one array's transient
encoded copy, e.g. a string array's Python objects, alive at once), then every key is uploaded in one
concurrent call, the group holding the listing last. The bytes are those ``to_zarr(mode="w-")`` writes (checked in
``tests/test_store_direct.py``) and plain ``xr.open_zarr`` / ``xr.open_datatree`` read them.

A dask-backed variable's array is created and not written, as ``to_zarr(compute=False)`` does (a streamed
run's skeleton, whose regions are written later). Exclusive creation only: an existing group fails before
anything is written (``mode="w-"``), nothing is ever deleted; writes into existing groups go through
``to_zarr``. A fenced store (``store.leases``) checks its writer's role once per uploaded batch.

``write_regions`` writes a streamed chunk's regions of existing arrays (numbers and flags; a string or
CF-encoded variable goes through ``to_zarr(region=...)``) in one concurrent pass, the same bytes.
Reading them back is ``store.zarr_read``'s; ``store.staged`` gives what ``write_new_groups`` wrote from the
values it kept (``Written``).
"""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pandas as pd
import xarray as xr
from xarray import conventions
from xarray.backends.zarr import (FillValueCoder, encode_zarr_attr_value, encode_zarr_variable,
                                  extract_zarr_variable_encoding)
from xarray.coding.strings import check_vlen_dtype, create_vlen_dtype
from xarray.namedarray.pycompat import is_chunked_array


def _array_args(name: str, var: xr.Variable) -> tuple[dict, object]:
    """(``create_array`` keyword arguments, data) of one variable, as ``ZarrStore.set_variables`` makes them
    for a new array in a Zarr v3 group (``use_zarr_fill_value_as_mask`` False, xarray's v3 default)."""
    v = encode_zarr_variable(var, name=name, zarr_format=3)
    attrs = v.attrs.copy()
    fill_value = v.encoding.pop("fill_value", None)
    if fill_value is None and v.dtype.kind == "f":
        fill_value = np.nan                       # xarray's default for floats
    if "_FillValue" in attrs:
        fv = attrs.pop("_FillValue")
        if fv is not None:
            attrs["_FillValue"] = FillValueCoder.encode(fv, v.dtype)
    if v.encoding.pop("_FillValue", None) is not None:
        raise ValueError("Zarr does not support _FillValue in encoding.")
    enc = extract_zarr_variable_encoding(v, raise_on_invalid=False, name=name, zarr_format=3)
    config = {"write_empty_chunks": True}
    if "order" in enc:
        config["order"] = enc.pop("order")
    enc.pop("write_empty_chunks", None)
    enc.pop("fill_value", None)
    dtype = str if check_vlen_dtype(v.dtype) is str else v.dtype
    kw = dict(enc, name=name, shape=v.shape, dtype=dtype, fill_value=fill_value, config=config,
              dimension_names=v.dims, overwrite=False,
              attributes={k: encode_zarr_attr_value(a) for k, a in attrs.items()})
    return kw, v.data


def encoded(ds: xr.Dataset) -> tuple[dict, list]:
    """(group attrs, [(name, Variable), ...]) of ``ds`` as ``to_zarr`` encodes its coordinates; each Variable
    becomes its ``create_array`` arguments and data through ``_array_args(name, _vlen(v))``, one at a time
    (``_group_keys``), fixed-width unicode written as variable-length strings (``store._attrs.portable``)."""
    variables, attrs = conventions.encode_dataset_coordinates(ds)
    return {k: encode_zarr_attr_value(a) for k, a in attrs.items()}, [(str(k), v) for k, v in variables.items()]


def vlen_strings(a: np.ndarray) -> np.ndarray:
    """Fixed-width unicode ``a`` as the variable-length strings zarr reads a ``string`` array back as: numpy's
    ``StringDType`` (numpy ≥ 2: no Python string per element; issue 40 item 5), else xarray's object strings.
    Either is stored as the same ``string`` array (document and vlen-utf8 chunks; ``tests/test_store_direct.py``)."""
    sdt = getattr(np.dtypes, "StringDType", None)
    return a.astype(sdt() if sdt is not None else create_vlen_dtype(str))


def _vlen(v: xr.Variable) -> xr.Variable:
    """Fixed-width unicode, and object arrays of ``str`` alone (e.g. the run's pair ids as a pandas index), as
    variable-length strings (``vlen_strings``; numpy's ``StringDType`` where there is one), which xarray's encoder
    keeps as they are instead of inferring each element's type (~100 µs an object array of 64 ids). Any other
    object array (``None``, bytes, numbers: xarray infers and fills), a dask-backed one and one whose encoding names
    a dtype go as they are."""
    if v.dtype.kind == "O":
        sdt = getattr(np.dtypes, "StringDType", None)
        if sdt is None or "dtype" in v.encoding or is_chunked_array(v.data) or pd.api.types.infer_dtype(
                np.ravel(v.values), skipna=False) != "string":
            return v
        try:
            values = v.values.astype(sdt())
        except UnicodeEncodeError:               # a lone surrogate: xarray's encoder says what it does with it
            return v
    elif v.dtype.kind == "U":
        values = vlen_strings(v.values)
    else:
        return v
    return xr.Variable(v.dims, values, v.attrs,   # fastpath: no pandas round trip
                       {k: e for k, e in v.encoding.items() if k != "dtype"}, fastpath=True)


def _group_keys(ds: xr.Dataset, keep: bool) -> tuple[dict, dict, dict]:
    """``({key: Buffer}, {array: chunk shape}, {array: values})`` of ``ds`` as one new group (keys relative to
    it): the group document and every array's document and chunks (``store.zarr_sync``: made in this thread by
    zarr's own classes); a dask-backed variable's array is created, not written (``to_zarr(compute=False)``).
    ``keep``: the values of each array written with data, as ``zarr_sync.array_keys`` gives them (else {})."""
    from zarr.core.group import GroupMetadata

    from .zarr_sync import array_keys

    attrs, arrays = encoded(ds)
    keys = {"zarr.json": GroupMetadata(attributes=attrs, zarr_format=3).to_buffer_dict(proto())["zarr.json"]}
    chunks, kept = {}, {}
    for name, var in arrays:               # one array's encoded copy (strings: Python objects) alive at a time
        kw, data = _array_args(name, _vlen(var))
        meta, own, values = array_keys(kw, None if is_chunked_array(data) else data)
        keys.update({f"{name}/{k}": v for k, v in own.items()})
        chunks[name] = tuple(meta.chunks)
        if keep and values is not None:
            kept[name] = values
        del kw, data, values
    return keys, chunks, kept


def proto():
    from zarr.core.buffer import default_buffer_prototype

    return default_buffer_prototype()


def stage(first: dict, then: dict, attrs_of=None, kept: dict | None = None) -> tuple[dict, dict]:
    """``({key: Buffer}, {path: {array: chunk shape}})``: each group of ``first``, then of ``then``, encoded
    on its own (so zarr makes no parent documents per array), its keys under the group's path; ``attrs_of =
    (path, attrs)`` added to that group's attrs; each parent group above them that is not one of them gets the
    implicit group document zarr would have made. One Dataset object given for several groups (a run's pair
    labels in each of its groups) is encoded once. ``kept``: a dict given ``{array path: values}`` of every
    array written with data (``_group_keys``; one group's arrays the same objects as another's where the
    Dataset is). No I/O."""
    from zarr.core.group import GroupMetadata

    staged, out, own, done = {}, {}, {}, {}
    for p, ds in [*first.items(), *then.items()]:
        if id(ds) not in done:                     # (every ds is held by first/then: no id is reused)
            done[id(ds)] = _group_keys(ds, kept is not None)
        own[p], out[p] = dict(done[id(ds)][0]), dict(done[id(ds)][1])
        if kept is not None:
            kept.update({f"{p}/{name}": v for name, v in done[id(ds)][2].items()})
    if attrs_of is not None:
        g = GroupMetadata.from_dict(json.loads(own[attrs_of[0]]["zarr.json"].to_bytes()))
        g = GroupMetadata(attributes={**g.attributes, **attrs_of[1]}, zarr_format=3)
        own[attrs_of[0]]["zarr.json"] = g.to_buffer_dict(proto())["zarr.json"]
    implicit = GroupMetadata(zarr_format=3).to_buffer_dict(proto())["zarr.json"]
    for p in own:
        parts = p.split("/")[:-1]
        for parent in ["", *("/".join(parts[:i + 1]) for i in range(len(parts)))]:
            if parent not in own:
                staged.setdefault(f"{parent}/zarr.json" if parent else "zarr.json", implicit)
    for p, keys in own.items():
        staged.update({f"{p}/{k}": v for k, v in keys.items()})
    return staged, out


def _upload(zstore, staged: dict, paths: list, last: str | None) -> None:
    """Copy ``staged`` (key -> Buffer) into ``zstore``: first refuse when a group in ``paths`` exists (as
    ``mode="w-"`` does), then every key under ``paths``, ``last`` after them; keys above them (parent groups
    zarr made implicitly) only where absent, so nothing stored is replaced (``put_batches``: a fenced store
    checks its writer's role before each of the three batches)."""
    from zarr.errors import ContainsGroupError

    inside = tuple(f"{p}/" for p in paths)
    batches = [([(k, staged[k]) for k in staged if not k.startswith(inside) and k != last], True),
               ([(k, staged[k]) for k in staged if k.startswith(inside) and k != last], False)]
    if last is not None:
        batches.append(([(last, staged[last])], False))
    found = put_batches(zstore, batches, [f"{p}/zarr.json" for p in paths])
    if any(found):
        raise ContainsGroupError(f"a group exists at {[p for p, f in zip(paths, found) if f]}; "
                                 "nothing was written there")


def put_batches(zstore, batches: list, checks: list = ()) -> list[bool]:
    """The one upload of this package's new keys (``write_new_groups``, ``store.staged.update_staged_group``):
    whether each key of ``checks`` exists; when none does, each ``(items, if_absent)`` of ``batches`` in order,
    every ``(key, Buffer)`` of ``items`` stored as ``zstore.set`` stores it (``if_absent``: only where no key
    is). A fenced store (``store.leases.fenced_store``) checks its writer's role once per batch, before it (the
    per-key guards of a concurrent batch all ran at its start anyway). Returns the checks' answers.

    On a ``FsspecStore`` over a synchronous filesystem in fsspec's async wrapper (``memory://``, local files:
    zarr would make each call its own worker-thread hop) everything runs in this thread, no event loop; on
    another ``FsspecStore`` each batch's plain sets are one bulk ``_pipe``; any other store gets its own
    ``set`` / ``set_if_not_exists`` per key, concurrently, in one blocking call."""
    from zarr.core.sync import sync
    from zarr.storage import FsspecStore

    guard, inner = zstore.fence_parts() if hasattr(zstore, "fence_parts") else (None, zstore)
    if isinstance(inner, FsspecStore) and hasattr(inner.fs, "sync_fs") and not inner.read_only:
        if not inner._is_open:                     # (as its ``set`` opens it)
            sync(inner._open())
        return _put_sync(guard, inner.fs.sync_fs, inner.path.rstrip("/"), batches, checks)
    return sync(_put_async(guard, inner, batches, checks))


def _put_sync(guard, fs, root: str, batches: list, checks) -> list:
    """``put_batches`` on the synchronous filesystem ``fs`` under ``root``, in this thread (``fs.exists``,
    ``fs.pipe_file`` of each key's bytes, as ``FsspecStore`` does key by key)."""
    path = (lambda k: f"{root}/{k}") if root else (lambda k: k)
    found = [fs.exists(path(k)) for k in checks]
    if any(found):
        return found
    for items, if_absent in batches:
        if guard is not None:
            guard()
        for k, v in items:
            if not (if_absent and fs.exists(path(k))):
                fs.pipe_file(path(k), v.to_bytes())
    return found


async def _put_async(guard, zstore, batches: list, checks) -> list:
    """``put_batches`` on any other store (``zstore``: the one a fenced store wraps; ``guard``: its role check,
    run in a worker thread)."""
    from zarr.storage import FsspecStore

    found = list(await asyncio.gather(*(zstore.exists(k) for k in checks)))
    if any(found):
        return found
    for items, if_absent in batches:
        if guard is not None:
            await asyncio.to_thread(guard)
        if not if_absent and items and isinstance(zstore, FsspecStore) and not zstore.read_only:
            if not zstore._is_open:
                await zstore._open()
            root = zstore.path.rstrip("/")
            await zstore.fs._pipe({f"{root}/{k}" if root else k: v.to_bytes() for k, v in items})
        else:
            put = zstore.set_if_not_exists if if_absent else zstore.set
            await asyncio.gather(*(put(k, v) for k, v in items))
    return found


class Written(dict):
    """What ``write_new_groups(staged=)`` wrote under new groups: each group's and array's document (key ->
    Buffer; not the encoded chunks, which no reader takes from here), and ``arrays``: array path -> the values
    its chunks encode, in the dtype zarr reads them back in (``zarr_sync.array_keys``; not copies:
    a reader copies them). ``clear`` empties both."""

    def __init__(self):
        super().__init__()
        self.arrays: dict = {}

    def clear(self) -> None:
        super().clear()
        self.arrays.clear()


def write_new_groups(zstore, first: dict, then: dict, *, attrs_of: tuple[str, dict] | None = None,
                     staged: Written | None = None) -> dict:
    """Create the groups ``first`` (``{path: Dataset}``), then ``then`` (their children), then add
    ``attrs_of = (path, attrs)`` to the attrs of one of them, whose document is stored last.

    Encoded in this thread (``stage``: no I/O), then uploaded to ``zstore`` in one call (``put_batches``).
    Every group is created exclusively (``mode="w-"``: ``ContainsGroupError`` when one exists, before anything
    is written); never deletes. ``staged``: a ``Written`` given the documents written under the new groups
    (key -> Buffer; not the parents' implicit documents, not the chunks) and each array's values, for a reader of what this call wrote
    (``store.staged.read_staged``). Returns ``{path: {array: chunk shape}}``.
    """
    kept = None if staged is None else {}
    keys, chunks = stage(first, then, attrs_of, kept)
    last = None if attrs_of is None else f"{attrs_of[0]}/zarr.json"
    _upload(zstore, keys, [*first, *then], last)
    if staged is not None:                 # (not the parents' implicit documents: stored only where absent)
        inside = tuple(f"{p}/" for p in [*first, *then])
        staged.update({k: v for k, v in keys.items() if k.startswith(inside) and k.endswith("zarr.json")})
        staged.arrays.update(kept)
    return chunks


PLAIN_KINDS = "fiub"           # dtypes whose Zarr encoding is the values as they are (no units, no strings)


def plain_region(var: xr.Variable) -> bool:
    """Whether ``var`` (data or coord of a region write) encodes statelessly: a plain numeric or bool dtype and
    no CF encoding in its attrs or encoding (``_FillValue``, ``scale_factor``, ``add_offset``, ``units``), so
    ``write_regions`` writes what ``to_zarr(region=...)`` writes."""
    cf = ("_FillValue", "missing_value", "scale_factor", "add_offset", "units", "calendar", "dtype")
    return var.dtype.kind in PLAIN_KINDS and not any(k in var.attrs or k in var.encoding for k in cf)


def write_regions(zstore, writes) -> None:
    """Write regions of existing arrays in one concurrent pass: ``writes`` is ``[(array path, region (a tuple
    of slices), Variable)]``, each Variable encoded by xarray's Zarr encoder (a bool as the int8 xarray stores)
    and written with ``setitem``, every chunk stored even when it equals the fill value (write-once arrays,
    as ``WRITE_KW``). Only for variables ``plain_region`` accepts (others go through
    ``to_zarr(region=...)``): raises ``ValueError`` for another before anything is written, and zarr's error
    for a missing array or a region outside it. Same bytes as ``to_zarr(region=...)``
    (``tests/test_store_direct.py``)."""
    import zarr.api.asynchronous as za
    from zarr.core.sync import sync

    bad = [path for path, _, var in writes if not plain_region(var)]
    if bad:
        raise ValueError(f"write_regions: {bad} need CF encoding; write them with to_zarr(region=...)")

    async def one(path, region, var):
        arr = (await za.open_array(store=zstore, path=path, mode="r+", zarr_format=3)).with_config(
            {"write_empty_chunks": True})
        enc = encode_zarr_variable(var, name=path.rsplit("/", 1)[-1], zarr_format=3)
        await arr.setitem(region, np.asarray(enc.data))

    async def go():
        await asyncio.gather(*(one(*w) for w in writes))

    sync(go())
