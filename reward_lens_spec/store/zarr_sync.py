"""Zarr v3 documents and chunks made and read in the calling thread, by zarr's own classes.

Creating an array through zarr's API (``AsyncGroup.create_array``, ``AsyncArray.setitem``) runs on zarr's
event-loop thread: per array a dozen tasks, dtype matching, an existence check, and each chunk's zstd step
handed to a worker thread. For new arrays whose every byte is known now (``store.zarr_io.write_new_groups``)
that machinery is most of a small run's store cost (benchmarks/results.md §23). Here the same steps run in
the caller's thread, each done by the zarr code ``init_array`` and the codec pipeline call:
``parse_dtype``, ``_auto_partition`` (chunk shape, "auto" guessed as zarr guesses it),
``_parse_chunk_encoding_v3``, ``AsyncArray._create_metadata_v3`` and ``ArrayV3Metadata.to_buffer_dict`` make
the ``zarr.json`` document; each chunk is padded with the fill value past the array's edge as zarr's codec
pipeline pads it, and encoded by the metadata's own codecs (``_encode_sync``: bytes or vlen-utf8, zstd,
crc32c). ``tests/test_store_direct.py`` checks every key against ``Dataset.to_zarr``. ``metadata_of`` parses
a stored document as zarr parses it.
"""
from __future__ import annotations

import itertools
import json
import math
from functools import lru_cache

import numpy as np
from zarr.core.array import AsyncArray, _parse_chunk_encoding_v3, _parse_chunk_key_encoding
from zarr.core.array_spec import ArrayConfig
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_grids import _auto_partition
from zarr.core.common import parse_shapelike
from zarr.core.dtype import parse_dtype
from zarr.core.dtype.common import HasItemSize
from zarr.core.metadata.v3 import ArrayV3Metadata


def _proto():
    return default_buffer_prototype()


@lru_cache(maxsize=64)
def _zdtype(dtype):
    return parse_dtype(dtype, zarr_format=3)


def array_metadata(kw: dict):
    """``ArrayV3Metadata`` of a new array created with ``create_array(**kw)`` (keywords as
    ``store.zarr_io`` passes them: shape, dtype, chunks, compressors, filters, serializer, fill_value,
    attributes, dimension_names; ``name``, ``config``, ``overwrite`` do not enter the document)."""
    unknown = set(kw) - {"name", "shape", "dtype", "chunks", "compressors", "filters", "serializer", "fill_value",
                         "attributes", "dimension_names", "config", "overwrite", "shards", "preferred_chunks"}
    if unknown or kw.get("shards") is not None:
        raise ValueError(f"zarr_sync: keywords {sorted(unknown)} or shards are not handled here")
    zdtype = _zdtype(str if kw["dtype"] is str else np.dtype(kw["dtype"]))
    shape = parse_shapelike(kw["shape"])
    _, chunks = _auto_partition(array_shape=shape, shard_shape=None, chunk_shape=kw.get("chunks", "auto"),
                                item_size=zdtype.item_size if isinstance(zdtype, HasItemSize) else 1)
    a2a, a2b, b2b = _parse_chunk_encoding_v3(compressors=kw.get("compressors", "auto"),
                                             filters=kw.get("filters", "auto"),
                                             serializer=kw.get("serializer", "auto"), dtype=zdtype)
    return AsyncArray._create_metadata_v3(shape=shape, dtype=zdtype, fill_value=kw.get("fill_value"),
                                          chunk_shape=chunks, chunk_key_encoding=_parse_chunk_key_encoding(None, 3),
                                          codecs=(*a2a, a2b, *b2b), dimension_names=kw.get("dimension_names"),
                                          attributes=kw.get("attributes"))


_DOCS: dict = {}          # repr of the keywords that enter an array's document -> (metadata, zarr.json)
DOCS_KEPT = 512           # a run makes a few dozen; the same kinds recur run after run


def _document(kw: dict):
    """``(key, array_metadata(kw), its zarr.json Buffer)``, made once per distinct document (zarr's pure-Python
    indented JSON and dtype matching dominate the cost of a small array) and reused; ``key`` names it."""
    key = repr(sorted((k, v) for k, v in kw.items() if k not in ("name", "config", "overwrite")))
    hit = _DOCS.get(key)
    if hit is None:
        meta = array_metadata(kw)
        hit = _keep(_DOCS, key, (meta, meta.to_buffer_dict(_proto())["zarr.json"]))
    return (key, *hit)


def _keep(memo: dict, key, value):
    if len(memo) >= DOCS_KEPT:
        memo.pop(next(iter(memo)))
    memo[key] = value
    return value


_CHUNKS: dict = {}        # (document key, values) -> encoded chunks of a small label array (strings, flags): a
SMALL = 4096              # run's pair labels are the same bytes in every group, and run after run on the same pairs
LABEL_KINDS = "OTUSb"     # (numbers, the outputs, are encoded each time)


def _spec(meta, order: str = "C"):
    return meta.get_chunk_spec((0,) * len(meta.shape), ArrayConfig(order=order, write_empty_chunks=True), _proto())


def _grid(meta):
    """Every chunk's coords and its selection of the array (a regular grid; a 0-d array is one chunk)."""
    chunks = meta.chunk_grid.chunk_shape
    ranges = [range(math.ceil(n / c)) for n, c in zip(meta.shape, chunks)]
    for coords in itertools.product(*ranges):
        yield coords, tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(coords, chunks, meta.shape))


def array_keys(kw: dict, data=None) -> tuple[object, dict, np.ndarray | None]:
    """``(metadata, {key: Buffer}, values)`` of a new array: its ``zarr.json`` and, when ``data`` is given (a
    numpy array of ``kw["shape"]``), every chunk as ``AsyncArray.setitem`` of the whole array stores it (written
    even where it equals the fill value, as ``write_empty_chunks=True``); ``values``: ``data`` in the dtype
    zarr reads it back in (strings: ``StringDType``; maybe ``data`` itself, not a copy), None without data.
    Keys are relative to the array."""
    key, meta, doc = _document(kw)
    out = {"zarr.json": doc}
    if data is None:
        return meta, out, None
    native = meta.data_type.to_native_dtype()
    value = np.asarray(data)
    if value.dtype.name != native.name:
        value = value.astype(native, order="A")
    if value.shape != meta.shape:
        raise ValueError(f"zarr_sync: data of shape {value.shape} for an array of shape {meta.shape}")
    if value.size <= SMALL and value.dtype.kind in LABEL_KINDS:   # the values in the key: equal keys, equal chunks
        vkey = (key, value.dtype.str, tuple(value.ravel().tolist()) if value.dtype.kind in "OT" else value.tobytes())
        if vkey not in _CHUNKS:
            _keep(_CHUNKS, vkey, _chunks(meta, value, native, kw))
        return meta, {**out, **_CHUNKS[vkey]}, value
    return meta, {**out, **_chunks(meta, value, native, kw)}, value


def _chunks(meta, value, native, kw) -> dict:
    """Every chunk of ``value`` encoded by ``meta``'s codecs: ``{chunk key: Buffer}``."""
    out = {}
    spec = _spec(meta, (kw.get("config") or {}).get("order", "C"))
    nd = spec.prototype.nd_buffer
    for coords, sel in _grid(meta):
        part = value[sel]
        if part.shape != spec.shape:                # past the edge: the fill value, as zarr's pipeline pads
            full = nd.create(shape=spec.shape, dtype=native, order=spec.order, fill_value=meta.fill_value)
            full[tuple(slice(0, n) for n in part.shape)] = nd.from_ndarray_like(part)
            chunk = full
        else:
            chunk = nd.from_ndarray_like(part)
        for codec in meta.codecs:
            chunk = codec._encode_sync(chunk, spec)
        out[meta.encode_chunk_key(coords)] = chunk
    return out


def metadata_of(doc) -> object:
    """The ``ArrayV3Metadata`` zarr reads from a stored ``zarr.json`` (a Buffer or bytes)."""
    raw = doc.to_bytes() if hasattr(doc, "to_bytes") else doc
    return ArrayV3Metadata.from_dict(json.loads(raw))

