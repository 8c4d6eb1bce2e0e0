"""Memory on the user's route (issue 40 item 5): what a command-line run holds per pair is bounded in bytes.

``reward-lens-spec observable=dla model=tiny dataset=jsonl dataset.path=F`` runs in process on JSONL files of
N and 4N pairs (after a warm-up run, so imports and caches are not counted); the peak of Python-traced memory
(``tracemalloc``: Python objects and NumPy buffers) during the run may grow by at most ``BYTES_PER_PAIR`` per
added pair. What the run holds per pair by design is listed in ``run.executor.execute``'s docstring; anything
built over every pair besides that (the stored result read back whole, a second copy of the pairs, a list per
pair) breaks the bound. Bytes, never time.
"""
from __future__ import annotations

import gc
import json
import tracemalloc

import numpy as np
import pytest

from reward_lens_spec.context import RunContext, take_pairs
from reward_lens_spec.data import Pair, PairSet

# Measured 2026-12-04 on this route (tiny model, dla, 64 → 256 pairs): ~1.0 KB per added pair traced (texts as
# Pair objects, token ids, pair labels); before the fixes of issue 40 item 5 it was ~2.7 KB (the pairs held
# twice, the stored result loaded whole at the end, labels of every pair rebuilt per chunk).
BYTES_PER_PAIR = 1600


def _write(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "prompt": f"Q{i % 97}: {i % 7} + {i % 5}?",
                                "chosen": f"It is {i % 7 + i % 5}.", "rejected": f"Maybe {i % 11}."}) + "\n")
    return path


def _held(tmp_path, monkeypatch, n, tag) -> int:
    """Python-traced bytes the run holds, over what was held before it, at the two moments it holds the most
    for its pairs: when its attempt completes (pairs, tokens, labels, the outputs opened for the seal) and
    when the command prints (the outcome in hand)."""
    from reward_lens_spec import cli
    from reward_lens_spec.store.attempts import Attempt

    seen = []
    complete, printed = Attempt.complete, cli._print_summary

    def on_complete(self, *a, **k):
        seen.append(tracemalloc.get_traced_memory()[0])
        return complete(self, *a, **k)

    def on_print(out):
        seen.append(tracemalloc.get_traced_memory()[0])
        return printed(out)
    monkeypatch.setattr(Attempt, "complete", on_complete)
    monkeypatch.setattr(cli, "_print_summary", on_print)
    data = _write(tmp_path / f"p{tag}.jsonl", n)
    gc.collect()
    start = tracemalloc.get_traced_memory()[0]
    cli.main(["observable=dla", "model=tiny", "model.threads=1", "dataset=jsonl", f"dataset.path={data}",
              f"store.url={tmp_path / f's{tag}.zarr'}", "store.chunk_pairs=16"])
    assert len(seen) == 2
    return max(seen) - start


def test_cli_run_holds_bounded_bytes_per_pair(tmp_path, monkeypatch, capsys):
    n = 64
    tracemalloc.start(1)
    try:
        _held(tmp_path, monkeypatch, 16, "warm")            # imports, caches, the model's first build
        small = _held(tmp_path, monkeypatch, n, "small")
        big = _held(tmp_path, monkeypatch, 4 * n, "big")
    finally:
        tracemalloc.stop()
    per_pair = (big - small) / (3 * n)
    assert "run id: dla-" in capsys.readouterr().out
    assert per_pair <= BYTES_PER_PAIR, (f"the run holds {per_pair:.0f} B more per pair from {n} to {4 * n} pairs "
                                        f"({small / 1e6:.2f} → {big / 1e6:.2f} MB), over {BYTES_PER_PAIR}")


def _ctx(n):
    pairs = [Pair(id=f"p{i}", prompt=f"q{i % 3}", chosen="a", rejected="b" if i % 4 else "a",
                  dimension="d" if i % 2 else "") for i in range(n)]
    ps = PairSet(name="x", pairs=tuple(pairs), checksum="c", n_unique=n, n_prompt_clusters=3,
                 flags={"identical_sides": [p.id for p in pairs if p.chosen == p.rejected]})

    class Enc:                                       # what pair_coords reads of an encoding
        pair_ids = [p.id for p in pairs][::-1]
        prompt_truncated = ["p3"]
        response_truncated = []
    return RunContext(lm=None, pairs=ps, encoded=Enc(), capture=None, info=None)


@pytest.mark.parametrize("idx", [None, [0, 5, 2], slice(3, 7)])
def test_chunk_coords_sliced_from_the_run_equal_coords_computed_from_the_pairs(idx):
    ctx = _ctx(9)
    full = ctx.pair_coords()
    want = ctx.pair_coords(None if idx is None else (list(range(9))[idx] if isinstance(idx, slice) else idx))
    got = take_pairs(full, slice(None) if idx is None else idx)
    assert set(got) == set(want) and list(got["pair"]) == list(want["pair"])
    for k in want:
        if k != "pair":
            assert got[k][0] == "pair" and np.array_equal(got[k][1], want[k][1]), k
    assert "identical_sides" in got and got["prompt_truncated"][1].sum() == 1
    given = RunContext(lm=None, pairs=None, encoded=None, capture=None, info=None, coords=full)
    again = given.pair_coords([1, 2])                # a context given its coords never reads its pairs
    assert list(again["pair"]) == list(full["pair"][[1, 2]])
    again["pair"][0] = "changed"                     # a copy: the run's coords are not changed through it
    assert full["pair"][1] != "changed"
