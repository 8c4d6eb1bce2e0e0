"""Memory bounded by the chunk (issue 27 item 2): a run computed chunk by chunk holds at most the chunk it is
computing, never earlier chunks' captures, even when its last context is handed back (``keep_context``)."""
from __future__ import annotations

import gc
import weakref

import numpy as np

import reward_lens_spec.engine.capture as capture_mod
from reward_lens_spec.run import compute
from tests.conftest import make_pairs, tiny_lm
from tests.test_streaming import plan_of


def test_chunked_compute_holds_no_earlier_chunk_capture(monkeypatch):
    lm, pairs = tiny_lm("tiny_llama"), make_pairs(7)
    plan, info = plan_of(lm, "dla")
    made, alive_at_start = [], []
    real = capture_mod.capture

    def tracked(*a, **k):
        gc.collect()
        alive_at_start.append(sum(r() is not None for r in made))    # captures still held as this one starts
        out = real(*a, **k)
        made.append(weakref.ref(out))
        return out
    monkeypatch.setattr(capture_mod, "capture", tracked)
    ds, ctx, _ = compute(lm, pairs, plan, info, batch_size=2, chunk_pairs=2)
    gc.collect()
    assert len(made) == 4                                             # 7 pairs in chunks of 2
    assert alive_at_start == [0, 0, 0, 0]                             # no chunk's capture outlives its chunk
    assert [r() is not None for r in made] == [False, False, False, True]   # only the last, handed back
    assert ctx.capture is made[-1]() and list(ctx.capture.pair_ids) == [pairs[6].id]
    assert list(ds.pair.values) == [p.id for p in pairs] and np.isfinite(ds["dla"].values).any(axis=(1, 2)).all()


class _Attempt:
    """What ``ensure_skeleton`` asks of an attempt (``store.attempts.Attempt``), over one memory store."""
    writer = "w"

    def __init__(self):
        from zarr.storage import MemoryStore
        self.zs, self.markers = MemoryStore(), {}

    def marker(self, name):
        return self.markers.get(name)

    def claim(self, name):
        return True

    def fence(self, role):
        pass

    def generation(self, name):
        return 0

    def zstore(self, role):
        return self.zs

    def mark(self, name, doc, role):
        self.markers[name] = doc

    def release(self, role):
        pass


def _skeleton_peak(n: int, k: int, size: int = 256) -> int:
    """Traced peak bytes of creating one group's skeleton: ``k`` pair × 3 variables over ``n`` pairs whose ids
    and dimensions are held as a run holds them (``context.PairLabels``)."""
    import tracemalloc

    import xarray as xr

    from reward_lens_spec.context import PairLabels
    from reward_lens_spec.run.stream_arrays import ensure_skeleton

    ids = np.array([f"q{i}".encode() for i in range(n)])
    dims = np.array([f"dim{i % 7}".encode() for i in range(n)])
    labels = PairLabels({"pair": ids, "dimension": dims}, {"pair": ids.itemsize, "dimension": dims.itemsize},
                        {"duplicate": np.zeros(n, bool)})
    chunk = labels.take(slice(0, size))
    res = {f"v{j}": xr.DataArray(np.zeros((size, 3), "f4"), dims=("pair", "c"),
                                 coords={"pair": chunk["pair"], "dimension": chunk["dimension"]}) for j in range(k)}
    att = _Attempt()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        ensure_skeleton(att, "w", None, [("obs", res, labels)], n, size, set(labels), labels=("obs",))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert att.markers["skeleton"] and len([k for k in att.zs._store_dict if k.endswith("zarr.json")]) > k
    return peak


def test_the_skeleton_holds_the_runs_pair_labels_once_not_once_per_variable():
    """Issue 40 item 5: every variable's array carries the run's ``pair`` index, so a skeleton that decoded the
    labels, built a pandas index and encoded them per variable (all at once) held per-pair strings k times over
    (measured at 10,000 pairs: 3.0 MB with one variable, 6.7 MB with six). Decoded once and encoded one array
    at a time, six variables cost little more than one."""
    one, six = _skeleton_peak(10_000, 1), _skeleton_peak(10_000, 6)
    assert six <= 1.3 * one, (one, six)


def test_the_completion_reads_the_head_logits_numbers_without_the_pair_labels():
    """A multi-chunk run's completion needs the head logits' numbers only (``run.stream``): read with the labels,
    every pair's id, dimension and prompt id came back as Python strings (~10 MB at 100,000 pairs).
    ``variable_values`` gives the stored numbers and reads no label chunk; a labelled read reads them."""
    import xarray as xr
    from zarr.storage import MemoryStore

    from reward_lens_spec.store.groups import open_variable, variable_values, write_variables

    class Recording(MemoryStore):
        read: list = []

        async def get(self, key, *a, **k):
            Recording.read.append(key)
            return await super().get(key, *a, **k)

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 2, 1)).astype("f4")
    da = xr.DataArray(logits, dims=("pair", "side", "output"),
                      coords={"pair": [f"q{i}" for i in range(5)], "side": ["chosen", "rejected"],
                              "dimension": ("pair", ["a", "b", "a", "c", "b"])})
    zs = Recording()
    write_variables(zs, da.to_dataset(name="head_logits"), "scratch")

    def label_chunks_read():
        return [k for k in Recording.read if "/c" in k and k.split("/c")[0].rsplit("/", 1)[-1] in ("pair", "dimension")]

    Recording.read.clear()
    assert np.array_equal(variable_values(zs, "scratch", "head_logits"), logits)
    assert label_chunks_read() == [] and any(k.startswith("scratch/head_logits/head_logits/c") for k in Recording.read)
    Recording.read.clear()
    assert np.array_equal(open_variable(zs, "scratch", "head_logits").values, logits)
    assert label_chunks_read()


def test_the_completion_of_a_chunked_run_reads_no_pair_labels_and_returns_the_same_result(monkeypatch):
    """Issue 40 item 5: a multi-chunk run's completion read its observable group's pair labels back from the store
    (ids, dimensions, prompt ids: ~22 MB of RSS at 100,000 pairs with the index pandas built from them), the labels
    it wrote with the skeleton from what it holds. It now builds them from the run's own labels
    (``run.stream_arrays.run_labels``): no read of the group's own arrays, and the same result as one chunk's."""
    import xarray as xr

    import reward_lens_spec.store.groups as groups_mod
    import reward_lens_spec.store.zarr_read as zarr_read

    lm, pairs = tiny_lm("tiny_llama"), make_pairs(7)
    plan, info = plan_of(lm, "dla")
    whole, _, _ = compute(lm, pairs, plan, info, batch_size=2)          # one chunk: its staged bytes, as before
    reads, real = [], zarr_read.read_groups

    def recording(zstore, group, children, **kw):
        reads.append((group, kw.get("own", True)))
        return real(zstore, group, children, **kw)
    monkeypatch.setattr(zarr_read, "read_groups", recording)
    monkeypatch.setattr(groups_mod, "read_groups", recording)
    chunked, _, _ = compute(lm, pairs, plan, info, batch_size=2, chunk_pairs=2)
    assert ("dla", False) in reads and ("dla", True) not in reads, reads
    assert list(chunked) == list(whole)
    for name in whole:
        xr.testing.assert_identical(chunked[name], whole[name])
        for k, c in chunked[name].coords.items():
            assert c.dtype == whole[name].coords[k].dtype, (name, k, c.dtype, whole[name].coords[k].dtype)


def test_run_labels_equal_the_labels_read_back_from_the_skeleton():
    """``run_labels`` (the completion's labels, from the run's ``PairLabels``) gives what ``group_labels`` reads
    back from the group the skeleton wrote: names, values, dtypes and the ``pair`` index's dtype, for ASCII and
    non-ASCII ids; a plain ``pair_coords`` dict gives the same."""
    import xarray as xr
    from zarr.storage import MemoryStore

    from reward_lens_spec.context import PairLabels
    from reward_lens_spec.run.stream_arrays import _decoded_once, _labels_of, run_labels
    from reward_lens_spec.store.groups import group_labels, label_dataset
    from reward_lens_spec.store.zarr_io import write_new_groups

    for ids in ([f"q{i}" for i in range(50)], [f"é{i}·π" if i % 3 else "" for i in range(50)]):
        text = {"pair": np.array([s.encode() for s in ids]),
                "prompt_id": np.array([f"{i * 7919:012x}".encode() for i in range(50)]),
                "dimension": np.array([("chat" if i % 2 else "").encode() for i in range(50)])}
        labels = PairLabels(text, {k: max(1, max(len(x.decode()) for x in v)) for k, v in text.items()},
                            {"duplicate": np.arange(50) % 4 == 0})
        zs = MemoryStore()
        [(_, _, coords)] = _decoded_once([("obs", {}, labels)])
        write_new_groups(zs, {"obs": label_dataset(coords["pair"], _labels_of(coords), direct=True)}, {})
        stored = group_labels(zs, "obs")
        for made in (run_labels(labels), run_labels(dict(labels))):
            xr.testing.assert_identical(made, stored)
            assert {k: c.dtype for k, c in made.coords.items()} == {k: c.dtype for k, c in stored.coords.items()}
            assert made.indexes["pair"].dtype == stored.indexes["pair"].dtype


def test_a_chunked_completion_returns_the_freed_heap_once_before_reading_back(monkeypatch):
    """The chunks' freed memory is handed back to the C library's system (``run.heap.trim_heap``) once, before a
    completion that reads its outputs back from the store; a one-chunk run's completion takes its staged values
    and trims nothing (the 64-pair runs' CPU). The result is the same either way."""
    import reward_lens_spec.run.stream as stream_mod
    from reward_lens_spec.run import heap

    calls = []
    monkeypatch.setattr(stream_mod, "trim_heap", lambda: calls.append("trim") or heap.trim_heap())
    lm, pairs = tiny_lm("tiny_llama"), make_pairs(5)
    plan, info = plan_of(lm, "dla")
    chunked, _, _ = compute(lm, pairs, plan, info, batch_size=2, chunk_pairs=2)
    assert calls == ["trim"]
    whole, _, _ = compute(lm, pairs, plan, info, batch_size=2)
    assert calls == ["trim"]
    np.testing.assert_array_equal(chunked["dla"].values, whole["dla"].values)


def test_trim_heap_asks_glibc_where_there_is_one():
    import platform

    from reward_lens_spec.run.heap import trim_heap
    assert trim_heap() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_the_skeletons_labels_store_the_bytes_the_decoded_labels_store():
    """``new_labels`` (text labels decoded from the run's UTF-8 bytes to ``StringDType``, no index) stores every
    key byte for byte as ``label_dataset`` of the labels decoded to Python strings did: ASCII, non-ASCII and
    empty ids, and a plain ``pair_coords`` dict."""
    import asyncio

    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    from reward_lens_spec.context import PairLabels
    from reward_lens_spec.run.stream_arrays import _decoded_once, _labels_of, new_labels
    from reward_lens_spec.store.groups import label_dataset
    from reward_lens_spec.store.zarr_io import write_new_groups

    def stored(ds):
        zs, out = MemoryStore(), {}
        write_new_groups(zs, {"obs": ds}, {})

        async def read():
            async for k in zs.list():
                out[k] = (await zs.get(k, prototype=default_buffer_prototype())).to_bytes()
        asyncio.run(read())
        return out

    cases = ([f"q{i}" for i in range(40)], [f"é{i}·π" if i % 3 else "" for i in range(40)])
    for ids in cases:
        text = {"pair": np.array([s.encode("utf-8", "surrogatepass") for s in ids]),
                "dimension": np.array([("chat" if i % 2 else "").encode() for i in range(40)]),
                "prompt_id": np.array([f"{i * 7919:012x}".encode() for i in range(40)])}
        labels = PairLabels(text, {k: max(1, max(len(x.decode("utf-8", "surrogatepass")) for x in v))
                                   for k, v in text.items()}, {"duplicate": np.arange(40) % 4 == 0})
        [(_, _, coords)] = _decoded_once([("obs", {}, labels)])
        want = stored(label_dataset(coords["pair"], _labels_of(coords), direct=True))
        assert len(want) == 10          # the group, and each of 4 labels: its document and one chunk
        for given in (labels, dict(labels)):
            assert stored(new_labels(given)) == want
