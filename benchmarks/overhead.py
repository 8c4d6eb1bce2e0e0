"""Section 1: the battery's capture pass against bare forwards of the same model on the same batches."""
from __future__ import annotations

import time

from common import encode, med
from common import _sync


def capture_overhead(lm, pairs, batch_size: int, repeats: int, fmt: str = "plain", budget_s: float = 20.0) -> dict:
    """Battery capture pass vs bare forwards on identical length-sorted, left-padded batches.
    Both feed ids, mask and position ids (``padding.pad_batch``) with ``use_cache=False``; bare and capture alternate in adjacent pairs
    (order flipped every round), each sample looping enough to last ~50 ms, for ``repeats`` rounds or
    as many as fit in ``budget_s`` (at most 41). Returns seconds per pass (medians), the ratio of the
    medians, the median of the per-round ratios, and the number of rounds."""
    import torch

    from reward_lens_spec.engine.capture import capture
    from reward_lens_spec.models.padding import batches_by_length, pad_batch
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.observables import load_observable
    obs = load_observable("battery")
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name)
    sites = build_plan(obs, info, load_observable).sites
    enc = encode(lm, pairs, fmt)
    seqs = [s for pair in zip(enc.chosen, enc.rejected) for s in pair]
    batches = batches_by_length([len(s) for s in seqs], batch_size)
    dev = next(lm.model.parameters()).device
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    pre = [tuple(t.to(dev) for t in pad_batch([seqs[r] for r in rows], pad, "left")[:3]) for rows in batches]

    def bare():                        # the same inputs the capture feeds: ids, mask, position ids from the mask
        with torch.inference_mode():
            for ids, mask, pos in pre:
                lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)

    def cap():
        capture(lm, enc, sites, batch_size=batch_size)

    def timed(fn, k):
        _sync(lm)
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        _sync(lm)
        return (time.perf_counter() - t0) / k

    bare(), cap()
    t_pair = timed(bare, 1) + timed(cap, 1)
    k = max(1, round(0.05 / max(t_pair / 2, 1e-4)))            # a sample lasts >= ~50 ms
    rounds = max(repeats, min(41, int(budget_s / (k * t_pair))))  # short adjacent pairs: drift cancels
    tb, tc = [], []
    for i in range(rounds):
        for fn, acc in ([(bare, tb), (cap, tc)] if i % 2 == 0 else [(cap, tc), (bare, tb)]):
            acc.append(timed(fn, k))
    return {"pairs": len(enc.pair_ids), "batches": len(batches), "bare": med(tb), "capture": med(tc),
            "ratio": med(tc) / med(tb), "ratio_med": med([c / b for c, b in zip(tc, tb)]), "rounds": rounds,
            "sites": sorted(sites)}
