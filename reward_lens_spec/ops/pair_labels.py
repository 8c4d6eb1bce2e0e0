"""Per-pair label fields read by the preference-structure operators (no operator here).

``Pair.meta`` keys (a JSONL row's own keys, or mapped with ``dataset.fields.<name>=<key>``):

  group      comparison-graph id: pairs sharing it compare responses of one set (best-of-N, a
             multi-pair prompt). Absent: the pair's ``prompt_id`` (sha256[:12] of the exact prompt).
  agreement  share of annotators who prefer the chosen side, a number in [0, 1].
  votes      one vote per annotator, a JSON list of 1 (chosen) / 0 (rejected); agreement = mean.

``agreement`` wins over ``votes``; a pair with neither has agreement NaN (no annotator record).
Errors: ``SpecError`` naming ``dataset.fields.agreement`` / ``dataset.fields.votes`` for a value
outside [0, 1] or a vote list that is not all 0/1.
"""
from __future__ import annotations

import json

import numpy as np

from ..errors import SpecError


def _by_id(ctx) -> list:
    by_id = {p.id: p for p in ctx.pairs}
    return [by_id[i] for i in ctx.encoded.pair_ids]


def pair_groups(ctx) -> np.ndarray:
    """Group id per encoded pair (pair,), str: ``meta["group"]`` else the prompt id."""
    prompt_ids = ctx.pair_coords()["prompt_id"][1]
    out = []
    for p, pid in zip(_by_id(ctx), prompt_ids):
        g = p.meta_dict().get("group")
        out.append(pid if g is None or g == "" else str(g))
    return np.array(out, dtype=str)


def agreement_of(meta: dict, pair_id: str) -> float:
    """One pair's annotator agreement with its label (see module doc); NaN when unrecorded."""
    if meta.get("agreement") is not None:
        a = meta["agreement"]
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= float(a) <= 1.0:
            raise SpecError("dataset.fields.agreement", f"pair {pair_id!r}: agreement must be a number in [0, 1] "
                            f"(share of annotators preferring the chosen side), got {a!r}.",
                            fix="map dataset.fields.agreement to such a key, or give votes instead.")
        return float(a)
    v = meta.get("votes")
    if v is None:
        return float("nan")
    try:
        votes = json.loads(v) if isinstance(v, str) else v
    except json.JSONDecodeError:
        votes = None
    if not isinstance(votes, list) or not votes or any(x not in (0, 1) or isinstance(x, float) and x not in (0.0, 1.0)
                                                      for x in votes):
        raise SpecError("dataset.fields.votes", f"pair {pair_id!r}: votes must be a non-empty list of 1 (chosen) / "
                        f"0 (rejected), got {v!r}.", fix="map dataset.fields.votes to such a key.")
    return float(np.mean(votes))


def pair_agreement(ctx) -> np.ndarray:
    """Agreement per encoded pair (pair,), float64 in [0, 1], NaN where no annotator record exists."""
    return np.array([agreement_of(p.meta_dict(), p.id) for p in _by_id(ctx)], np.float64)
