"""Every pair accounted for: which pairs were left out and why, which kept pairs carry a flag.

``pair_flags(pairs, encoded, ids)`` gives, for the kept pair ids ``ids`` (dims: ``pair``), one
boolean array per flag of ``PAIR_FLAGS`` (``data.pairs``): ``empty_response`` and
``identical_sides`` come from the loaded ``PairSet.flags``; ``prompt_truncated`` and
``response_truncated`` from the ``EncodedPairs`` (``models.formatting.encode_pairs``). Every
stored result with a ``pair`` dim carries them as coords (``RunContext.pair_coords``).

``accounting(pairs, encoded)`` is what the run attrs record: ``excluded`` (reason -> ids:
``prompt_mismatch`` from the loader, ``identical_after_truncation`` and ``response_truncated``
from the encoding) and ``pair_flags`` (flag -> ids of KEPT pairs). ``summary_line`` is the one
console line with the counts and where the ids are.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .pairs import PAIR_FLAGS


def _flag_ids(pairs: Any, encoded: Any) -> dict[str, set[str]]:
    flags = getattr(pairs, "flags", None) or {}
    return {"empty_response": set(flags.get("empty_response", ())),
            "identical_sides": set(flags.get("identical_sides", ())),
            "prompt_truncated": set(getattr(encoded, "prompt_truncated", ()) or ()),
            "response_truncated": set(getattr(encoded, "response_truncated", ()) or ())}


def pair_flags(pairs: Any, encoded: Any, ids: Sequence[str]) -> dict[str, np.ndarray]:
    """Flag -> bool array over ``ids`` (dims: ``pair``), one per name of ``PAIR_FLAGS``."""
    sets = _flag_ids(pairs, encoded)
    return {name: np.array([i in sets[name] for i in ids], dtype=bool) for name in PAIR_FLAGS}


def accounting(pairs: Any, encoded: Any) -> dict[str, dict[str, list[str]]]:
    """``{"excluded": reason -> ids, "pair_flags": flag -> kept ids}`` (JSON-safe, ids in data order)."""
    excluded = {"prompt_mismatch": list((getattr(pairs, "flags", None) or {}).get("prompt_mismatch", ()))}
    excluded.update({k: list(v) for k, v in encoded.excluded.items()})
    kept = list(encoded.pair_ids)
    arrays = pair_flags(pairs, encoded, kept)
    return {"excluded": excluded,
            "pair_flags": {name: [i for i, on in zip(kept, arrays[name]) if on] for name in PAIR_FLAGS}}


def summary_line(acc: dict, n_scored: int) -> str:
    """One line: pairs scored, exclusions and flags by reason, and where the ids are."""
    ex = ", ".join(f"{k} {len(v)}" for k, v in acc["excluded"].items())
    fl = ", ".join(f"{k} {len(v)}" for k, v in acc["pair_flags"].items())
    n_ex = sum(len(v) for v in acc["excluded"].values())
    return (f"pairs: {n_scored} scored, {n_ex} excluded ({ex}); flagged among scored: {fl}; "
            "ids: run attrs 'excluded' and 'pair_flags', and each result's per-pair coords")
