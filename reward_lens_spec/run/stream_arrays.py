"""A streamed run's arrays in the store (``run.stream``): the skeleton every chunk writes into, each chunk's
regions, the groups' pair labels read once per run, and the observable group's attrs.

The skeleton: every output and scratch variable of one pass as an array of the run's full pair length, zarr
chunks = the run's chunks (``store.chunk_pairs``), created once per attempt — by its first holder in one
concurrent pass (``store.zarr_io.write_new_groups``), by a writer taking over a dead holder's skeleton through
``to_zarr`` into what it left (never deleting). A chunk's regions of numbers and flags are written in one
concurrent pass (``zarr_io.write_regions``), strings and CF-encoded values through ``to_zarr(region=...)``;
the digest of every region written goes to the chunk's marker. Every write goes through the attempt's fenced
store (``store.attempts``).

A dim whose size depends on the data (PRM steps, response positions: ``Operator.data_dims``) is sized for the
whole run before the first chunk (``planning.data_widths``), and each chunk's rows are padded to that size
(``pad_widths``: NaN past a row's own length), so the skeleton any chunk creates fits every other chunk.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import xarray as xr
from xarray.indexes import PandasIndex

from ..arrays import bytes_index, data_array
from ..errors import StoreError
from ..store.digest import values_digest
from ..store.groups import (VARIABLES, WRITE_KW, group_labels, label_dataset, set_group_attrs, variable_dataset,
                           with_checksum, write_labels)
from ..store.staged import update_staged_group
from ..store.zarr_io import plain_region, vlen_strings, write_new_groups, write_regions


def pad_widths(v: xr.DataArray, widths: dict, where: str) -> xr.DataArray:
    """``v`` with each dim of ``widths`` (dim -> the run's size, ``planning.data_widths``) padded at its end to
    that size: NaN values (floats only), index coord ``0 … size−1``; attrs kept, ``padding`` added. Raises
    ``StoreError`` naming ``where`` when a chunk holds more than the planned size, or a dim to pad has a coord
    other than ``0 … n−1`` or non-float values (an operator that breaks ``Operator.width``'s contract)."""
    for dim, size in widths.items():
        n = v.sizes[dim]
        if dim in v.indexes and not np.array_equal(v.indexes[dim], np.arange(n)):
            raise StoreError(f"{where}: dim {dim!r} depends on the data but its coord is not 0 … {n - 1}.")
        if n > size:
            raise StoreError(f"{where}: a chunk holds {n} along {dim!r}, more than the {size} planned over every "
                             "pair (Operator.width disagrees with the operator's run).")
        if n < size:
            if v.dtype.kind != "f":
                raise StoreError(f"{where}: dim {dim!r} depends on the data, so it is padded with NaN; the values "
                                 f"are {v.dtype}, not floats.")
            attrs = dict(v.attrs)
            v = v.pad({dim: (0, size - n)}, constant_values=np.nan)
            v.attrs = attrs
            if dim in v.indexes:
                v = v.assign_coords({dim: np.arange(size)})
    if widths:
        v.attrs["padding"] = (f"NaN past each row's own length along {', '.join(widths)}; size = the largest over "
                              "the run's pairs")
    return v


def labels_once(b, same: dict | None = None) -> "GroupLabels":
    """``labels(group)``: the group's stored pair labels (``store.groups.group_labels``), read once per run:
    every later open of the group's variables is given them. ``b``: what holds the groups (an attempt:
    ``store.attempts.Attempt``, whose ``zarr_store()`` is rooted at its prefix). ``same``: ``{group: the group
    whose labels it shares}`` (the scratch group, which ``ensure_skeleton`` gives no labels of its own)."""
    return GroupLabels(b, same)


class GroupLabels:
    """``labels_once``'s memo: ``labels(group)`` reads a group's pair labels the first time, ``labels.held(group)``
    gives them only when read already (None: a reader of the group's variables reads them in its own pass)."""

    def __init__(self, b, same=None):
        self._b, self._memo, self._same = b, {}, dict(same or {})

    def __call__(self, group):
        group = self._same.get(group, group)
        if group not in self._memo:
            self._memo[group] = group_labels(self._b.zarr_store(), group)
        return self._memo[group]

    def held(self, group):
        return self._memo.get(self._same.get(group, group))

    def known(self, group, pair_coords):
        """The group's labels when read already, else the run's own (``run_labels(pair_coords)``: the labels the
        skeleton wrote, as read back), not read from the store."""
        held = self.held(group)
        return held if held is not None else run_labels(pair_coords)


def ensure_skeleton(att, role, b, groups, n, size, run_names, *, marker="skeleton", labels=(),
                    filled=False, staged=None) -> bool:
    """Create every run array of one pass once per attempt (full pair length, zarr chunks = run chunks):
    the groups named in ``labels`` hold the run's pair labels once (the first pass's skeleton: the observable's
    group; the scratch group reads them there, ``labels_once``), each variable its own group (``store.groups``)
    with its own coords but the ``pair`` ids, which the group's labels hold; then marker ``marker``.
    ``filled``: the run is this one chunk (``groups`` hold every pair), so the first holder writes each
    array with its data in the same pass (the bytes a region write of the whole run would store); returns
    True when it did (no region write follows), False when the arrays wait for their regions. ``staged``: a
    ``zarr_io.Written`` given every key the first holder wrote with the data and the values it wrote
    (``zarr_io.write_new_groups``), so the run's completion takes those instead of reading them back
    (``store.staged.read_staged``)."""
    wrote = False
    while att.marker(marker) is None:
        if not att.claim(marker):
            att.fence(role)
            time.sleep(0.2)                        # another job is creating it
            continue
        # the first holder creates every group exclusively; one taking over from a dead or stalled holder
        # writes into what it left (never deleting: the stalled one may resume, and is fenced out per key)
        mode = "w-" if att.generation(marker) == 0 else "a"
        zs = att.zstore(marker)
        wrote = filled and mode == "w-"
        made = {group: _skeleton(res, n, size, run_names, wrote) for group, res, _ in groups}
        if mode == "w-":        # every group and array in one concurrent pass (store.zarr_io), fenced per key
            att.fence(marker)
            first, shared = {}, {}        # one labels Dataset per distinct labels: encoded once (zarr_io.stage)
            for group, _, pair_coords in [g for g in groups if g[0] in labels]:
                if id(pair_coords) not in shared:
                    shared[id(pair_coords)] = new_labels(pair_coords)
                first[group] = shared[id(pair_coords)]
            write_new_groups(zs, first, {f"{group}/{name}": with_checksum(tmpl.to_dataset(name=name).copy(deep=False))
                                         for group, tmpls in made.items() for name, tmpl in tmpls.items()},
                             staged=staged if wrote else None)
        else:
            for group, res, pair_coords in _decoded_once(groups):
                att.fence(marker)
                if group in labels:
                    write_labels(zs, group, pair_coords["pair"], _labels_of(pair_coords), mode=mode)
                for name, tmpl in made[group].items():
                    att.fence(marker)
                    variable_dataset(tmpl, name).to_zarr(zs, group=f"{group}/{name}", mode=mode, compute=False,
                                                         **WRITE_KW)
        att.mark(marker, {"writer": att.writer}, marker)
        att.release(marker)
    return wrote


def _decoded_once(groups) -> list:
    """``groups`` with each distinct ``pair_coords`` (a ``context.PairLabels`` decodes its labels anew on every
    access) decoded once, for a writer taking over a skeleton (``write_labels``) and ``new_labels``' fallback:
    the ``pair`` ids as one object-dtype ``pandas.Index``, the other labels as arrays (text as
    ``store.zarr_io.vlen_strings``: the same stored bytes as fixed-width unicode, a third of its memory)."""
    done = {}
    out = []
    for group, res, pair_coords in groups:
        if id(pair_coords) not in done:
            d = {k: pair_coords[k] for k in pair_coords}
            d = {k: _vlen_label(v) if k != "pair" else v for k, v in d.items()}
            d["pair"] = pd.Index(np.asarray(d["pair"], dtype=object), dtype=object, name="pair")
            done[id(pair_coords)] = d
        out.append((group, res, done[id(pair_coords)]))
    return out


def new_labels(pair_coords) -> xr.Dataset:
    """The run's pair labels as the coords-only Dataset ``zarr_io.write_new_groups`` stores in the labels group:
    from a ``context.PairLabels`` each text label as numpy's ``StringDType`` decoded straight from its UTF-8 bytes
    (no Python string per pair) and no pandas index (a writer needs none: ~18 MB less transient at 100,000 pairs,
    issue 40 item 5); the same stored bytes as ``label_dataset`` of the decoded labels (``_decoded_once``), which
    any other ``pair_coords``, or numpy without ``StringDType``, goes through."""
    sdt, raw = getattr(np.dtypes, "StringDType", None), getattr(pair_coords, "raw", None)
    if sdt is None or raw is None or next(iter(pair_coords), None) != "pair":
        [(_, _, d)] = _decoded_once([(None, None, pair_coords)])
        return label_dataset(d["pair"], _labels_of(d), direct=True)
    variables = {}
    for k in pair_coords:
        b, v = raw(k), None
        if b is not None:
            try:
                v = b.astype(sdt())                 # numpy decodes the UTF-8 bytes
            except UnicodeDecodeError:              # (a lone surrogate): decoded as the run decodes it
                v = None
        if v is None:
            x = pair_coords[k] if k == "pair" else pair_coords[k][1]
            v = vlen_strings(x) if x.dtype.kind == "U" else x
        variables[k] = xr.Variable(("pair",), v)
    return with_checksum(xr.Dataset(coords=xr.Coordinates(variables, indexes={})))


def run_labels(pair_coords) -> xr.Dataset:
    """The run's pair labels (``pair_coords``: ``RunContext.pair_coords``, e.g. a ``context.PairLabels``) as the
    coords-only Dataset ``store.groups.group_labels`` reads back from a group the skeleton wrote them to: the same
    names, dims, values and dtypes (``pair`` ids as the index; text labels as zarr reads them,
    ``store.zarr_io.vlen_strings``; flags as bools), built without reading the store (issue 40 item 5). From a
    ``PairLabels``'s UTF-8 bytes the ids' index is an Arrow string array made from those bytes, not through a
    Python string per id (pandas' own ``str`` dtype, as it indexes the strings zarr reads)."""
    raw = getattr(pair_coords, "raw", None)
    fast = bytes_index(raw("pair")) if raw is not None else None
    coords = {}
    for k in pair_coords:
        b = raw(k) if fast is not None and k != "pair" else None
        if b is not None:
            try:
                coords[k] = ("pair", b.astype(np.dtypes.StringDType()))    # numpy decodes the UTF-8 bytes
                continue
            except UnicodeDecodeError:                                     # (e.g. a lone surrogate): decoded below
                pass
        if k != "pair" or fast is None:
            v = pair_coords[k]
            v = np.asarray(v) if k == "pair" else v[1]
            v = vlen_strings(v) if v.dtype.kind == "U" else v
            coords[k] = v if k == "pair" else ("pair", v)
    if fast is None:
        return xr.Dataset(coords=coords)
    index = PandasIndex(fast, "pair", coord_dtype=np.dtypes.StringDType())
    return xr.Dataset(coords=xr.Coordinates(index.create_variables(), {"pair": index})).assign_coords(coords)


def _vlen_label(v):
    """A ``("pair", fixed-width unicode)`` label as ``("pair", vlen_strings(...))``; any other label as it is."""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], np.ndarray) and v[1].dtype.kind == "U":
        return v[0], vlen_strings(v[1])
    return v


def _labels_of(pair_coords) -> dict:
    return {k: c for k, c in pair_coords.items() if k != "pair"}


def _skeleton(res, n, size, run_names, filled=False) -> dict:
    """``{name: template}``: each variable of one chunk's ``res`` as a dask-zeros DataArray of the run's full
    pair length (zarr chunks = the run's chunks) with its own coords but the ``pair`` ids (the group's labels hold
    them: a reader gives them back, ``store.groups.open_variable``), the operator's own per-pair coords (dask
    zeros too: written by region) on it. ``filled``: ``res`` is the whole run (one chunk): its own values instead
    of the zeros, in one zarr chunk along ``pair`` as the dask zeros would have. Each template is built by
    ``arrays.data_array``."""
    out = {}
    for name, v in res.items():
        coords = {k: c for k, c in v.coords.variables.items() if "pair" not in c.dims}
        for k in op_pair_coords(v, run_names):      # an operator's own per-pair labels: regions too
            coords[k] = _template(v.coords[k].variable, n, size, f"{name}.{k}", filled)
        out[name] = data_array(_template(v.variable, n, size, name, filled), coords, None)
    return out


def _template(var: xr.Variable, n, size, label, filled) -> xr.Variable:
    shape = tuple(n if d == "pair" else var.sizes[d] for d in var.dims)
    chunks = tuple(min(size, n) if d == "pair" else var.sizes[d] for d in var.dims)
    if not filled:
        return xr.Variable(var.dims, _zeros(shape, chunks, var.dtype, label), attrs=var.attrs)
    if var.shape != shape:
        raise StoreError(f"{label}: {var.shape} is not the run's {shape}; a filled skeleton holds every pair.")
    return xr.Variable(var.dims, var.data, attrs=var.attrs, encoding={"chunks": chunks})


def _zeros(shape, chunks, dtype, label):
    """Dask zeros standing for an array whose regions are written later (never computed): named, so dask
    does not hash the call to name it."""
    import dask.array as da

    return da.zeros(shape, chunks=chunks, dtype=dtype, name=f"skeleton-{label}-{shape}-{chunks}-{dtype}")


def label_group(zstore, group, attrs: dict, variables, staged: dict | None = None) -> None:
    """Put what a plain-xarray reader needs (``store.writer.observable_attrs``) and the variable listing
    on the observable group (``zstore``: the completing writer's fenced store). ``staged``: the keys this job
    wrote with the skeleton (``ensure_skeleton``); when they hold the group's document, the new one is made
    from it (``store.staged.update_staged_group``), not read back."""
    if staged and f"{group}/zarr.json" in staged:
        update_staged_group(zstore, staged, group, {**attrs, VARIABLES: list(variables)})
    else:
        set_group_attrs(zstore, group, {**attrs, VARIABLES: list(variables)})


def op_pair_coords(v, run_names) -> list[str]:
    """Coords along ``pair`` that an operator made (e.g. a side's response length), beyond the run's own
    (``run_names``: pair, dimension, prompt_id, the pair flags)."""
    return [k for k, c in v.coords.variables.items() if "pair" in c.dims and k not in run_names]


def write_region(zstore, group, res, sl, run_names) -> dict:
    """Write one chunk's pair rows ``sl`` of every variable of ``res`` into its group (``zstore``: the
    writer's fenced store); return the digest of every region written (``"<group>/<name>"``, and
    ``"<group>/<name>:<coord>"`` for an operator's own per-pair coords) for the chunk's marker."""
    digests, plain = {}, []
    for name, v in _regions(res, run_names).items():
        own = [(name, v.variable), *((c, v.coords[c].variable) for c in v.coords)]
        if all(plain_region(x) for _, x in own):        # numbers and flags: every array in one pass below
            plain += [(f"{group}/{name}/{k}", tuple(sl if d == "pair" else slice(None) for d in x.dims), x)
                      for k, x in own]
        else:                                           # strings, times, CF-encoded values: xarray's writer
            v.to_dataset(name=name).to_zarr(zstore, group=f"{group}/{name}", region={"pair": sl}, **WRITE_KW)
        digests.update(_digests(group, name, v))
    if plain:
        write_regions(zstore, plain)
    return digests


def region_digests(group, res, run_names) -> dict:
    """The digests ``write_region`` would record for ``res``, whose rows a filled skeleton
    (``ensure_skeleton(filled=True)``) has written already, from its arrays as they are."""
    digests = {}
    for name, v in res.items():
        _need_pair(name, v)
        digests.update(_digests(group, name, v, op_pair_coords(v, run_names)))
    return digests


def _regions(res, run_names) -> dict:
    """Each variable of ``res`` as its region is written: its data and the operator's own per-pair coords."""
    out = {}
    for name, v in res.items():
        _need_pair(name, v)
        v = v.drop_vars([k for k in v.coords if k not in op_pair_coords(v, run_names)])
        v.attrs = {}
        out[name] = v
    return out


def _need_pair(name, v) -> None:
    if "pair" not in v.dims:
        raise StoreError(f"pair-stage output {name!r} has no pair dim; it cannot be written by chunk.")


def _digests(group, name, v, coords=None) -> dict:
    """``{"<group>/<name>": digest of v's values, "<group>/<name>:<coord>": each coord's}`` (``coords``: only
    those; None: every coord but ``pair``)."""
    out = {f"{group}/{name}": values_digest(v.values)}
    for c, x in v.coords.variables.items():
        if c != "pair" and (coords is None or c in coords):
            out[f"{group}/{name}:{c}"] = values_digest(x.values)
    return out
