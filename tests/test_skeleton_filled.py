"""A run of one chunk writes its arrays with their data in the skeleton pass (``run.stream_arrays.ensure_skeleton``
with ``filled=True``): the same bytes, and the same marker digests, as the skeleton followed by the chunk's region
write, for the dtypes pair-stage outputs hold (float32 with NaN, float64, int, bool, an operator's own per-pair
coord)."""
from __future__ import annotations

import json
import os

from reward_lens_spec.run.stream_arrays import ensure_skeleton, region_digests, write_region
from reward_lens_spec.store import store_handle
from reward_lens_spec.store.attempts import Attempt
from reward_lens_spec.store.layout import check_layout

from test_store_direct import N, mixed

RUN_NAMES = {"pair", "dimension", "flag"}


def _stored(att) -> dict:
    root = att.b.path(f"{att.prefix}/obs")
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            raw = open(os.path.join(d, n), "rb").read()
            out[os.path.relpath(os.path.join(d, n), root)] = json.loads(raw) if n == "zarr.json" else raw
    return out


def _write(url, filled: bool):
    res = {k: v for k, v in mixed().items() if "pair" in v.dims and v.dtype.kind != "U"}
    pair_coords = {k: res["margin"].coords[k] for k in RUN_NAMES}
    b = store_handle(url)
    check_layout(b, create=True)
    att = Attempt.create(b, "r1", {"kind": "test"}, role="shard-0")
    try:
        wrote = ensure_skeleton(att, "shard-0", b, [("obs", res, pair_coords)], N, N, RUN_NAMES, labels=("obs",),
                                filled=filled)
        if wrote:
            digests = region_digests("obs", res, RUN_NAMES)
        else:
            digests = write_region(att.zstore("shard-0"), "obs", res, slice(0, N), RUN_NAMES)
        return wrote, digests, _stored(att)
    finally:
        att.close()


def test_a_filled_skeleton_stores_what_skeleton_and_region_write_store(tmp_path):
    wrote, digests, stored = _write(str(tmp_path / "filled.zarr"), True)
    wrote_not, digests_not, stored_not = _write(str(tmp_path / "regions.zarr"), False)
    assert wrote and not wrote_not
    assert set(stored) == set(stored_not) and {"lens/lens/zarr.json", "count/extra/zarr.json"} <= set(stored)
    assert [k for k in stored if stored[k] != stored_not[k]] == []
    assert digests == digests_not and set(digests) == {"obs/margin", "obs/lens", "obs/count", "obs/count:extra",
                                                       "obs/agree"}
