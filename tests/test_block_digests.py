"""Digests of a dask array read several zarr chunks a task (``store.groups._coarse``) are those of its values.

``store.digest.variable_digest`` cuts a dask block that holds whole grid blocks into them (every value read
once); the reference is the definition applied naively: ``values_digest`` of each block of the grid, sliced
from the array in memory, in C order of the grid."""
from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.store.digest import grid, values_digest, variable_digest
from reward_lens_spec.store.groups import _coarse


def _naive(values: np.ndarray, chunks) -> list[str]:
    return [values_digest(values[sl]) for sl in grid(values.shape, chunks)]


CASES = [  # (shape, dims, grid chunks, dask chunks)
    ((1000,), ("pair",), (256,), (768,)),                            # ragged last grid block and dask block
    ((1000, 3, 5), ("pair", "layer", "component"), (256, 3, 5), (512, 3, 5)),
    ((3, 1000), ("layer", "pair"), (3, 256), (3, 512)),              # pair not the first dim
    ((1000, 4), ("pair", "c"), (256, 2), (512, 2)),                  # a second dim split too (C order across it)
    ((1000, 4), ("pair", "c"), (256, 4), (300, 4)),                  # dask edges off the grid: sliced per block
    ((0, 3), ("pair", "c"), (256, 3), (256, 3)),
]


@pytest.mark.parametrize("shape,dims,chunks,dchunks", CASES)
def test_a_coarse_dask_arrays_digest_is_its_values_digest(shape, dims, chunks, dchunks):
    values = np.random.default_rng(0).normal(size=shape).astype("f4")
    if values.size:
        values.reshape(-1)[::7] = np.nan
    lazy = xr.DataArray(da.from_array(values, chunks=dchunks), dims=dims)
    eager = xr.DataArray(values, dims=dims)
    got = variable_digest(lazy, chunks)
    assert got["blocks"] == _naive(values, chunks) == variable_digest(eager, chunks)["blocks"]
    changed = values.copy()
    if changed.size:
        changed.reshape(-1)[-1] = 1.0
        assert variable_digest(xr.DataArray(da.from_array(changed, chunks=dchunks), dims=dims), chunks)["blocks"] \
            != got["blocks"]


def test_a_lazy_reads_blocks_are_whole_zarr_chunks_up_to_the_block_size():
    """``_coarse``: several whole zarr chunks along ``pair`` (never a part of one), at most ``BLOCK_BYTES`` a block
    unless one chunk is bigger, no more than the pairs; other dims untouched."""
    from reward_lens_spec.store import groups

    sizes = {"pair": 256, "layer": 3, "component": 5}
    out = _coarse(sizes, np.dtype("f4"), {"pair": 100_000, "layer": 3, "component": 5})
    assert out["pair"] % 256 == 0 and out["pair"] * 15 * 4 <= groups.BLOCK_BYTES < (out["pair"] + 256) * 15 * 4
    assert {k: v for k, v in out.items() if k != "pair"} == {"layer": 3, "component": 5}
    assert _coarse(sizes, np.dtype("f4"), {"pair": 700, "layer": 3, "component": 5})["pair"] == 700
    assert _coarse({"pair": 256, "d": 10**6}, np.dtype("f8"), {"pair": 1000, "d": 10**6})["pair"] == 256
    assert _coarse({"layer": 3}, np.dtype("f8"), {"layer": 3}) == {"layer": 3}


@pytest.mark.parametrize("ids", [[f"q{i}" for i in range(9000)], ["é·π", "", "中文", "a" * 300, ""], []])
def test_an_arrow_index_is_digested_as_its_python_strings(ids):
    """``arrow_strings_digest`` (from the Arrow offsets and bytes, past ``STR_SLICE`` strings) is
    ``values_digest`` of the same strings as Python objects: ASCII, non-ASCII, empty and long strings, no ids; a
    coord's digest in ``variable_digest`` is that too, and one changed id changes it."""
    from reward_lens_spec.arrays import str_index
    from reward_lens_spec.store.digest import arrow_strings_digest

    idx = str_index(ids)
    want = values_digest(np.array(ids, dtype=object))
    assert arrow_strings_digest(idx) == want
    var = xr.DataArray(np.zeros(len(ids)), dims=("pair",), coords={"pair": idx})
    assert variable_digest(var, (256,))["coords"]["pair"] == want
    if ids:
        other = str_index(ids[:-1] + [ids[-1] + "x"])
        assert arrow_strings_digest(other) != want
    assert arrow_strings_digest(np.array(ids, dtype=object)) is None
