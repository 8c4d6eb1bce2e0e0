"""Memory on the user's route (issue 40 item 5): what a command-line run holds per pair is bounded in bytes.

- The run's per-pair state, built by the functions ``run.executor.execute`` calls (pairs read from a JSONL file,
  token ids, the operators' view as the one copy of the pairs, the pair labels): at most ``BYTES_PER_PAIR``
  Python-traced bytes (``tracemalloc``: Python objects and NumPy buffers) per pair of short synthetic sides.
- The command line prints from the run document and never reads the stored result back whole.
- A chunk's pair labels are the run's, sliced: no pass over every pair per chunk.
- The command line's process gives Arrow (pandas' string labels) the C library's allocator, which returns what it
  frees, unless the user chose one (``ARROW_DEFAULT_MEMORY_POOL``).
Bytes, never time.
"""
from __future__ import annotations


import numpy as np
import pytest

from reward_lens_spec.context import RunContext, take_pairs
from reward_lens_spec.data import Pair, PairSet
from tests.numbered_pairs import held_by_a_run, write_numbered_pairs

# Measured 2026-12-04 (2,048 and 4,096 pairs, the sides of benchmarks/memory.py): ~790 B per pair — the texts as
# one Pair each (~390 B), token ids as int32 rows with offsets (~330 B), labels (~70 B). Token ids as Python lists
# of ints (~2.7 KB per pair) or a list per pair anywhere else break it.
BYTES_PER_PAIR = 1000




def test_the_per_pair_state_a_run_holds_is_bounded_in_bytes(tmp_path):
    n = 2048
    held = held_by_a_run(tmp_path, n)
    assert held / n <= BYTES_PER_PAIR, f"{held / n:.0f} B per pair held, over {BYTES_PER_PAIR}"


def test_the_command_line_never_reads_the_result_back(tmp_path, monkeypatch, capsys):
    from reward_lens_spec.cli import main
    from reward_lens_spec.store.reader import Store

    def refuse(self, *a, **k):
        raise AssertionError("the command line read a stored result back (its memory grows with the pairs)")
    monkeypatch.setattr(Store, "load", refuse)
    main(["observable=dla", "model=tiny", "model.threads=1", "dataset=jsonl",
          f"dataset.path={write_numbered_pairs(tmp_path / 'p.jsonl', 8)}", f"store.url={tmp_path / 's.zarr'}"])
    out = capsys.readouterr().out
    assert "run id: dla-" in out and "dla_heads" in out      # the table, from the run document


_POOL = ("from reward_lens_spec.cli import main; main(['help']); import pyarrow; "
         "print('POOL', pyarrow.default_memory_pool().backend_name)")


@pytest.mark.parametrize("chosen", [None, "mimalloc"])
def test_the_command_line_gives_arrow_an_allocator_that_returns_memory(chosen):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    out = subprocess.run([sys.executable, "-c", _POOL], env=env, capture_output=True, text=True, check=True).stdout
    assert f"POOL {chosen or 'system'}" in out.splitlines()


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
