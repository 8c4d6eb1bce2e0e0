"""One Zarr group per output variable: each variable stored with exactly its own coordinates.

How an attempt (``store.attempts``; rooted at its own prefix) holds one observable while it is written
(store layout 3's shape; layout 4 publishes it as one Dataset on completion, ``store.publish``)::

    <observable>/            the pair labels every pair-dim variable shares (``pair`` + e.g. ``dimension``,
                             ``prompt_id``, the pair flags), stored once; attrs: trust, gauge, units,
                             provenance summary, run id, ``output_variables`` (their order)
    <observable>/<variable>/ one Dataset: that variable, its own coords and its ``pair`` index

so a streamed run writes each variable's regions into an array of its own and no variable is padded to
another's coordinate set. ``open_variables`` gives each pair-dim variable the shared labels back (the writer
shares them only when every variable's ``pair`` index is identical, so a variable's own ``pair`` copy need not
be read). A group with no listing (one Dataset, store layout 2) is read as that Dataset's variables.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from reward_lens_spec.arrays import data_array
from reward_lens_spec.result import Result
from reward_lens_spec.store._attrs import portable
from reward_lens_spec.store.digest import values_digest, variable_digest
from reward_lens_spec.store.zarr_read import decoded_as_read, read_groups

VARIABLES = "output_variables"
ZARR_KW = dict(consolidated=False, zarr_format=3)
# writes: every chunk is stored, even one equal to the fill value (zarr would otherwise delete its key, and
# an attempt's arrays are write-once: the fenced store refuses deletes; a missing chunk is then damage)
WRITE_KW = dict(ZARR_KW, write_empty_chunks=True)
# reads: variables up to this size come in one concurrent pass (``zarr_read.read_groups``); a bigger one is
# opened on its own (its chunks dominate; measured: a 146 MB array read 0.9 s alone, 1.2 s in the pass)
ONE_PASS_BYTES = 16 * 2**20


def checksum_codecs() -> tuple:
    """The bytes-to-bytes codecs of every array this package writes: zstd, then a ``crc32c`` checksum of
    each encoded chunk (Zarr v3), so a flipped bit fails at decode. Arrays written before it (no checksum)
    are read as they are: the codecs are recorded in each array's own metadata."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return (ZstdCodec(level=0), Crc32cCodec())


def with_checksum(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` whose every variable (coords included) is encoded with ``checksum_codecs``."""
    codecs = checksum_codecs()
    for v in ds.variables.values():
        v.encoding = {**v.encoding, "compressors": codecs}
    return ds


def variable_dataset(da: xr.DataArray, name: str) -> xr.Dataset:
    """``da`` alone as a Dataset (its own coords only), strings made Zarr-v3 portable."""
    return with_checksum(portable(da.to_dataset(name=name)))


def shared_pair_labels(res: Result) -> dict[str, xr.DataArray]:
    """Non-index coords along ``pair`` alone that every pair-dim variable holds, identically."""
    holders = [v for v in res.values() if "pair" in v.dims]
    if not holders:
        return {}
    out = {}
    for k, c in holders[0].coords.items():
        if k != "pair" and c.dims == ("pair",) and all(
                k in v.coords and v.coords[k].variable.identical(c.variable) for v in holders[1:]):
            out[k] = c
    return out


def write_labels(zstore, group: str, pair, labels: dict, *, mode: str = "w-") -> None:
    """Create ``group`` holding the ``pair`` index and the shared pair ``labels`` (before its children).

    Never ``mode="w"`` (it deletes the group's children: another writer's arrays): ``"w-"`` creates it
    exclusively (fails when it exists), ``"a"`` (re)writes the label values into an existing group, keeping
    its children (a writer taking over an unfinished skeleton).
    """
    if mode not in ("w-", "a"):
        raise ValueError(f"write_labels: mode {mode!r}; only 'w-' or 'a' (never one that deletes)")
    label_dataset(pair, labels).to_zarr(zstore, group=group, mode=mode, **WRITE_KW)


def label_dataset(pair, labels: dict, *, direct: bool = False) -> xr.Dataset:
    """The coords-only Dataset a group's shared pair labels are stored as: the ``pair`` index (when not
    None) and ``labels`` (name -> DataArray or Variable along ``pair``), strings portable, checksummed.
    ``direct``: for ``zarr_io.write_new_groups``, which writes fixed-width strings as variable-length ones
    itself (the same bytes), so they are left as they are here."""
    coords = {"pair": pair} if pair is not None else {}
    coords.update({k: c.variable if isinstance(c, xr.DataArray) else c for k, c in labels.items()})
    ds = xr.Dataset(coords=coords)
    return with_checksum(ds.copy(deep=False) if direct else portable(ds))    # the caller's variables untouched


def set_group_attrs(zstore, group: str, attrs: dict) -> None:
    """Add ``attrs`` to those of the (existing or new) group ``group`` (xarray's own ``coordinates``, naming
    the pair labels, stays)."""
    import zarr

    g = zarr.open_group(store=zstore, path=group, mode="a", zarr_format=3)
    g.attrs.update(attrs)


def write_variables(zstore, res, group: str, attrs: dict | None = None, *, labels: bool = True,
                    mode: str = "w-") -> dict | None:
    """Write every variable of ``res`` (Result or Dataset) as ``group/<variable>``, then ``group``'s attrs
    (``attrs`` plus ``output_variables``), so the listing is written last.

    ``labels``: (re)create ``group`` first with the shared pair labels (``shared_pair_labels``), left out
    of each variable's group; ``False``: ``group`` exists (a streamed run's reduce stage), so only the
    labels it already holds are left out. ``mode``: ``"w-"`` creates every group exclusively, ``"a"``
    writes into existing ones; never a mode that deletes.

    New groups of in-memory data (``labels`` and ``"w-"``, no dask array) are written in one concurrent
    pass (``store.zarr_io``: the same bytes ``to_zarr`` writes); returns then ``{variable: its zarr chunk
    shape}`` (for ``written_digests``), else None.
    """
    if mode not in ("w-", "a"):
        raise ValueError(f"write_variables: mode {mode!r}; only 'w-' or 'a' (never one that deletes)")
    res = Result.of(res)
    direct = labels and mode == "w-" and not any(v.chunks is not None for v in res.values())
    if labels:
        pairs = [v["pair"].variable for v in res.values() if "pair" in v.dims and "pair" in v.coords]
        same = bool(pairs) and all(p.identical(pairs[0]) for p in pairs[1:])
        pair = pairs[0] if same else None             # the group's pair ids only when every variable agrees
        shared = shared_pair_labels(res) if same else {}    # labels go back by pair id
        if not direct:
            write_labels(zstore, group, pair, shared, mode=mode)
        drop = set(shared)
    else:
        drop = set(xr.open_zarr(zstore, group=group, chunks=None, **ZARR_KW).variables) - {"pair"}
    own = {name: da.drop_vars([k for k in drop if k in da.coords]) if "pair" in da.dims else da
           for name, da in res.items()}
    listing = None if attrs is None else {**attrs, VARIABLES: list(res)}
    if direct:
        from reward_lens_spec.store.zarr_io import write_new_groups

        # shallow copies: the caller's variables keep their encoding
        first = {group: label_dataset(pair, shared, direct=True)}
        then = {f"{group}/{n}": with_checksum(da.to_dataset(name=n).copy(deep=False)) for n, da in own.items()}
        chunks = write_new_groups(zstore, first, then,
                                  attrs_of=None if listing is None else (group, listing))
        return {n: chunks[f"{group}/{n}"][n] for n in own}
    for name, da in own.items():
        variable_dataset(da, name).to_zarr(zstore, group=f"{group}/{name}", mode=mode, **WRITE_KW)
    if listing is not None:
        set_group_attrs(zstore, group, listing)
    return None


def written_digests(res, chunks: dict) -> dict | None:
    """``{variable: digest}`` (``store.digest``) of ``res`` as written by ``write_variables`` (``chunks``: what
    it returned), decoded as a reader decodes the stored bytes (``zarr_read.decoded_as_read``), so equal to
    reading them back; None where a reader would see other coords (a pair-dim variable with no ``pair``
    index gets the group's): read them back then."""
    res = Result.of(res)
    if any("pair" in v.dims and "pair" not in v.coords for v in res.values()):
        return None
    seen: dict = {}                      # coord name -> (variable, digest): the shared labels digested once

    def coord_digest(k, c: xr.Variable) -> str:
        if k in seen and (seen[k][0] is c or seen[k][0].identical(c)):
            return seen[k][1]
        seen[k] = (c, values_digest(decoded_as_read(str(k), c).values))
        return seen[k][1]

    out = {}
    for name, da in res.items():
        d = variable_digest(xr.DataArray(decoded_as_read(str(name), da.variable), name=name), chunks=chunks[name])
        d["coords"] = {str(k): coord_digest(k, c.variable) for k, c in da.coords.items()}
        out[str(name)] = d
    return out


def group_attrs(zstore, group: str) -> dict:
    import zarr

    return dict(zarr.open_group(store=zstore, path=group, mode="r", zarr_format=3).attrs)


def open_variable(zstore, group: str, name: str, *, lazy: bool = True, labels=None, digest: dict | None = None,
                  where: str = "", read: xr.Dataset | None = None, known: dict | None = None) -> xr.DataArray:
    """The variable stored at ``group/name``: its coords read into memory, its data dask-backed (in its
    zarr chunks) when ``lazy`` is True, read when False; an int ``lazy``: read if it holds at most that
    many bytes, else dask-backed. ``labels``: the group's shared pair labels (an
    ``xarray.Dataset``; default: read them), given back to a pair-dim variable (same pair order, by
    construction of ``write_variables`` and the streamed skeleton; the pair count is checked).
    Opened without dask, so coords are read straight from zarr; a pair-dim variable's own ``pair`` copy
    is not read when the group's labels hold the pair ids.
    ``digest``: the variable's sealed digest (``store.digest``): its coords are checked now, its data
    block by block as they are read (now, or when a dask block is computed); a mismatch raises
    ``store.digest.DigestError`` naming ``where`` (run, observable) and the variable.
    ``read``: the variable's group as ``zarr_read.read_groups`` read it (data in memory), else opened here.
    ``known``: digests of the group's labels (``{coord: hex}``), computed once for all its variables.
    """
    if labels is None:
        labels = group_labels(zstore, group)
    shared = "pair" in labels.coords
    ds = read if read is not None else xr.open_zarr(zstore, group=f"{group}/{name}", chunks=None,
                                                    drop_variables=["pair"] if shared else None, **ZARR_KW)
    v = ds[name]
    coords = {c: x.load() for c, x in v.coords.variables.items()}
    if "pair" in v.dims and shared:
        if labels.sizes["pair"] != v.sizes["pair"]:
            raise KeyError(f"{group}/{name}: {v.sizes['pair']} pairs, the group labels {labels.sizes['pair']}")
        coords.update(labels.coords.variables)
    done = set()
    if digest is not None:
        rec = digest.get("coords") or {}
        done = {k for k in coords if shared and k in labels.coords and (known or {}).get(k) == rec.get(str(k))
                and set(map(str, coords)) == set(rec)}
    return finish_variable(v, coords, name, lazy=lazy, digest=digest, label=f"{where or group}: variable {name}",
                           done=done)


def finish_variable(v: xr.DataArray, coords: dict, name: str, *, lazy, digest: dict | None, label: str,
                    done=()) -> xr.DataArray:
    """The stored variable ``v`` (its data lazily indexed or in memory, its zarr encoding) with ``coords``
    (name -> Variable, in memory): dask-backed or read per ``lazy`` (``open_variable``), checked against its
    sealed ``digest`` when given (coords now, except those in ``done``, already checked; data now or block by
    block as read), a mismatch raising ``DigestError`` naming ``label``."""
    if digest is not None:
        from reward_lens_spec.store.digest import check_coords, check_header

        check_header(v, digest, label)
        rec = digest.get("coords") or {}
        rest = {k: c for k, c in coords.items() if k not in done}
        check_coords(xr.DataArray(v.variable, coords=rest, name=name),
                     {**digest, "coords": {k: h for k, h in rec.items() if k not in done}}, label)
    if lazy is True or (lazy is not False and v.nbytes > lazy):
        chunks = v.encoding.get("preferred_chunks") or {}
        sizes = {d: chunks.get(d, n) for d, n in v.sizes.items()}
        if digest is not None:                       # dask blocks on the sealed grid, each checked as read
            from reward_lens_spec.store.digest import verified_dask

            sizes = dict(zip(v.dims, digest["chunks"]))
            var = v.variable.chunk(sizes)
            var = xr.Variable(var.dims, verified_dask(var.data, digest, label), attrs=var.attrs,
                              encoding=var.encoding)
        else:
            var = v.variable.chunk(_coarse(sizes, v.dtype, v.sizes))
    else:
        var = v.variable.load()
        if digest is not None:
            from reward_lens_spec.store.digest import check_values

            check_values(var.values, digest, label)
    out = data_array(var, coords, name)
    out.encoding = v.encoding
    return out


BLOCK_BYTES = 2**18      # a lazily read variable's dask blocks: whole zarr chunks along pair, up to this size


def _coarse(sizes: dict, dtype, full: dict) -> dict:
    """Dask block ``sizes`` of whole zarr chunks (``sizes``) taken several at a time along ``pair``, up to
    ``BLOCK_BYTES`` a block: a pass over every pair (a completion's summary, digests and identities, a reduce
    step) then runs tens of tasks, not one per 256-pair chunk, whose graphs were most of its transient memory
    (issue 40 item 5). Sealed reads keep the sealed grid (``store.digest.verified_dask``)."""
    if "pair" not in sizes:
        return sizes
    chunk = max(1, np.dtype(dtype).itemsize * int(np.prod([max(1, n) for n in sizes.values()])))
    return {**sizes, "pair": min(max(1, full["pair"]), sizes["pair"] * max(1, BLOCK_BYTES // chunk))}


def group_labels(zstore, group: str) -> xr.Dataset:
    """The group's shared pair labels, as coords (a coords-only group may read them back as data vars): its
    own arrays, read in one concurrent pass (``zarr_read.read_groups``), decoded as ``xr.open_zarr`` does."""
    return _as_labels(read_groups(zstore, group, ())[0])


def _as_labels(ds: xr.Dataset) -> xr.Dataset:
    """A group's labels as read (``zarr_read``: no indexes) as coords, in memory, each dim coord with its default
    index (what ``assign_coords`` of the loaded coords makes, without its merge: ~0.3 ms a read)."""
    ds = ds.set_coords([v for v in ds.data_vars if ds[v].dims == ("pair",)]).load()
    for c in [c for c, v in ds.coords.variables.items() if v.dims == (c,) and c not in ds.xindexes]:
        ds = ds.set_xindex(c)
    return ds


def variable_values(zstore, group: str, name: str) -> np.ndarray:
    """The values of the variable stored at ``group/name``, decoded as ``xr.open_zarr`` decodes them, in its stored
    order along every dim; no labels are read (its ``pair`` ids, ``group``'s shared labels): for a reader that
    needs the numbers only, whose per-pair strings would grow its memory with the pairs (issue 40 item 5)."""
    ds = xr.open_zarr(zstore, group=f"{group}/{name}", chunks=None, drop_variables=["pair"], **ZARR_KW)
    return np.asarray(ds[name].values)


def open_variables(zstore, group: str, names=None, *, lazy: bool = True, digests: dict | None = None,
                   where: str = "", labels: xr.Dataset | None = None, staged: dict | None = None) -> Result:
    """The observable stored at ``group`` as a ``Result`` (attrs: the group's, less ``output_variables``).

    ``names``: only these variables (default: the group's ``variables`` listing). A group written
    before layout 3 (one Dataset, no listing) is read as that Dataset's variables.
    Raises ``FileNotFoundError`` / ``KeyError`` for a missing group or variable, and ``KeyError`` for a
    group with neither a listing nor arrays of its own. ``digests``: ``{variable: sealed digest}``
    (``store.digest``), checked as each variable is read (``open_variable``); a variable it lacks, or a
    listed variable missing from it, raises ``DigestError``. ``labels``: the group's pair labels
    (``group_labels``) when the caller read them already (a streamed run opens its groups several times).
    ``staged``: what this process wrote there (``zarr_io.write_new_groups(staged=)``, a ``zarr_io.Written``):
    ``names`` read eagerly are built from the values it kept (``store.staged.read_staged``) when it holds them
    all, not read back.
    """
    if names is not None and not list(names):
        return Result({})
    pre = None
    if staged is not None and names is not None and lazy is not True:
        from reward_lens_spec.store.staged import read_staged, staged_attrs

        cap = ONE_PASS_BYTES if lazy is False else min(lazy, ONE_PASS_BYTES)
        pre = read_staged(staged, group, list(names), shared=("pair",), max_bytes=cap)
    attrs = group_attrs(zstore, group) if pre is None else staged_attrs(staged, group)
    listed = attrs.pop(VARIABLES, None)
    attrs.pop("coordinates", None)                  # xarray's encoding of the pair labels, not an attr
    if listed is None and names is None:                        # layout ≤ 2: one Dataset
        ds = xr.open_zarr(zstore, group=group, chunks={} if lazy else None, **ZARR_KW)
        if not ds.data_vars:
            raise KeyError(f"group {group} lists no {VARIABLES} and holds no arrays of its own")
        return Result.of(ds if lazy else ds.load())
    want = list(listed if names is None else names)
    if digests is not None:
        from reward_lens_spec.store.digest import DigestError

        missing = [n for n in want if n not in digests]
        if missing or (names is None and set(digests) - set(want)):
            raise DigestError(f"{where or group}: variables {sorted(set(want) ^ set(digests))} are not those the "
                              "run's seal records; the stored data were changed after the run was written.")
    read = {}
    if lazy is not True:              # every small variable's arrays and the labels in one concurrent pass
        from reward_lens_spec.store.zarr_read import read_groups

        cap = ONE_PASS_BYTES if lazy is False else min(lazy, ONE_PASS_BYTES)
        lab, read = pre or read_groups(zstore, group, want, shared=("pair",), max_bytes=cap, own=labels is None)
        labels = _as_labels(lab) if labels is None else labels
    elif labels is None:
        labels = group_labels(zstore, group)
    known = None
    if digests is not None and "pair" in labels.coords:
        from reward_lens_spec.store.digest import values_digest

        known = {k: values_digest(c.values) for k, c in labels.coords.items()}
    return Result({n: open_variable(zstore, group, n, lazy=lazy, labels=labels, read=read.get(n), known=known,
                                    digest=None if digests is None else digests[n], where=where)
                   for n in want}, attrs)
