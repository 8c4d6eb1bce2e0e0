"""zarr's async wrapper of a synchronous fsspec filesystem (``memory://``), made once per filesystem instance:
wrapping every method of the filesystem costs ~1 ms, and ``zarr.storage.FsspecStore.from_url`` makes one per
store (``store._backend.Backend.zarr_store`` makes a store per attempt)."""
from __future__ import annotations

_WRAPPED: dict = {}      # id(a synchronous filesystem) -> (it, its async wrapper)
_KEPT = 8


def async_wrapper(fs):
    """``zarr.storage._fsspec._make_async(fs)`` for the synchronous filesystem ``fs``, the same object on every call
    for the same ``fs`` (the last ``_KEPT`` filesystems' wrappers are held)."""
    from zarr.storage._fsspec import _make_async

    held = _WRAPPED.get(id(fs))
    if held is None or held[0] is not fs:
        if len(_WRAPPED) >= _KEPT:
            _WRAPPED.pop(next(iter(_WRAPPED)))
        held = _WRAPPED[id(fs)] = (fs, _make_async(fs))
    return held[1]
