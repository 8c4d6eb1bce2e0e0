"""A JSON-Lines file of ``n`` numbered pairs (ids ``q0``…; prompts repeat every 97 rows), and the Python-traced
bytes a run holds for them, for the tests that measure what a run holds per pair (``test_memory_route``,
``test_file_pairs``)."""
from __future__ import annotations

import gc
import json
import tracemalloc
from types import SimpleNamespace


def write_numbered_pairs(path, n: int):
    """Write ``n`` pairs to ``path`` (one JSON object per line) and return ``path``."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "prompt": f"Q{i % 97}: {i % 7} + {i % 5}?",
                                "chosen": f"It is {i % 7 + i % 5}.", "rejected": f"Maybe {i % 11}."}) + "\n")
    return path


def held_by_a_run(folder, n: int) -> int:
    """Python-traced bytes (``tracemalloc``: Python objects and NumPy buffers) that a run's per-pair state holds
    for ``n`` numbered pairs, built by the functions ``run.executor.execute`` calls: the pairs read from a JSONL
    file under ``folder``, their token ids (built-in byte tokenizer), the operators' view as the run's one copy of
    the pairs, and the pair labels. A warm-up on 8 pairs first (lazy imports, caches)."""
    from reward_lens_spec.context import RunContext
    from reward_lens_spec.data import load_pairs
    from reward_lens_spec.inputs import encode, ops_view
    from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer

    lm = SimpleNamespace(tokenizer=build_tiny_tokenizer(), name="tiny")      # what encoding reads of a model
    encode(lm, load_pairs("jsonl", path=str(write_numbered_pairs(folder / "warm.jsonl", 8))))
    path = write_numbered_pairs(folder / f"p{n}.jsonl", n)
    gc.collect()
    tracemalloc.start(1)
    try:
        start = tracemalloc.get_traced_memory()[0]
        pairs = load_pairs("jsonl", path=str(path))
        enc = encode(lm, pairs)
        pairs = ops_view(pairs, ())            # as execute: the operators' view is kept, the loader's pairs freed
        coords = RunContext(lm=lm, pairs=pairs, encoded=enc, capture=None, info=None).pair_coords()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(enc.pair_ids) == n and coords["pair"].shape == (n,)
    return held
