"""What operators see while a plan runs: the model, the pairs, the capture and run counters."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from .data.accounting import pair_flags
from .errors import SpecError


@dataclass
class RunContext:
    lm: object
    pairs: object          # PairSet, filtered to the encoded pairs, same order
    encoded: object        # EncodedPairs
    capture: object        # CaptureResult
    info: object           # PlanInfo
    memo: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    coords: dict | None = None   # ``pair_coords()`` when already known (``run.stream``: the chunk's rows of the
                                 # run's, so a chunk costs its own pairs, not a pass over every pair of the run)
    stores: object = None  # store.stored_inputs.StoredInputs: stored inputs (``store:<url>#…``) read through it

    def stored(self, ref: str, *, lazy: bool, where: str):
        """The stored variable ``ref`` (``store:<url>#<run_id>/<observable>/<variable>``) as a DataArray, read
        through the stores the executor opened for this run (operators never open a store). Raises
        ``SpecError`` naming ``where`` when no executor gave this context its stores or ``ref`` is malformed,
        ``StoreError`` / ``KeyError`` for what is not stored."""
        if self.stores is None:
            raise SpecError(where, f"reads the stored variable '{ref}', but this context has no stores.",
                            fix="run the observable through the executor (reward-lens-spec or reward_lens_spec.run).")
        return self.stores.variable(ref, lazy=lazy, where=where)

    def pair_coords(self, idx=None) -> dict:
        """``pair`` (ids) plus non-index coords ``dimension``, ``prompt_id`` (sha256[:12] of the prompt) and
        one bool coord per flag of ``data.pairs.PAIR_FLAGS`` and per kind flag of the encoding
        (``data.accounting.pair_flags``). ``idx``: positions among the encoded pairs (default: all)."""
        if self.coords is not None:
            return take_pairs(self.coords, slice(None) if idx is None else list(idx))
        by_id = {p.id: p for p in self.pairs}
        ids = list(self.encoded.pair_ids)
        if idx is not None:
            ids = [ids[i] for i in idx]
        dims = np.array([by_id[i].dimension or "" for i in ids], dtype=str)
        prompts = np.array([hashlib.sha256(by_id[i].prompt.encode()).hexdigest()[:12] for i in ids], dtype=str)
        flags = {k: ("pair", v) for k, v in pair_flags(self.pairs, self.encoded, ids).items()}
        return {"pair": np.array(ids, dtype=str), "dimension": ("pair", dims), "prompt_id": ("pair", prompts), **flags}

    def add_counts(self, what: str, counts: dict) -> None:
        for k, v in counts.items():
            self.counts[f"{what}.{k}"] = self.counts.get(f"{what}.{k}", 0) + int(v)


def take_pairs(coords: dict, idx) -> dict:
    """``pair_coords``-shaped ``coords`` (``pair``: ids; the rest ``("pair", values)``) at positions ``idx``
    (a slice or a list of positions) along ``pair``: new arrays, so a caller may keep or change them."""
    return {k: (np.array(v[idx]) if k == "pair" else (v[0], np.array(v[1][idx]))) for k, v in coords.items()}
