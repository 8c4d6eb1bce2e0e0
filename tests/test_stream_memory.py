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
