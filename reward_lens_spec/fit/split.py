"""Train / dev / test split of preference pairs by PROMPT CLUSTER, seeded.

Pairs that share a prompt are not independent (see ``data.checksum.effective_sample_size``),
so a split that put one prompt in two parts would leak: the head could learn the prompt,
and held-out accuracy would be optimistic. ``split_by_prompt`` therefore assigns whole
clusters (``data.checksum.prompt_cluster_key``: NFC, lowercased, whitespace collapsed):

1. clusters are ordered by the sha256 of ``f"{seed}:{key}"`` — a seeded shuffle that does not
   depend on file order or on the NumPy version;
2. walking that order, each cluster goes to the part furthest below its target share
   (``fractions``, normalised), so every part gets close to its share of PAIRS;
3. ``max_pairs`` (per part, optional) then keeps the first clusters of each part, in the same
   seeded order, until the cap would be exceeded (a part may end a little under its cap; a
   cluster is never cut in two).

Errors: ``SpecError`` (``fit.fractions``, ``fit.max_pairs``) for bad arguments or a part
left empty. The result's ``check()`` raises ``AssertionError`` if any prompt cluster lies in
two parts (tests call it; ``split_by_prompt`` calls it before returning).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..data.checksum import prompt_cluster_key
from ..errors import SpecError

PARTS = ("train", "dev", "test")


@dataclass(frozen=True)
class Split:
    """Pairs per part (``train``, ``dev``, ``test``), in the seeded cluster order."""

    parts: dict
    seed: int
    fractions: tuple
    n_clusters: dict = field(default_factory=dict)

    def __getitem__(self, part: str):
        return self.parts[part]

    def ids(self, part: str) -> list[str]:
        return [p.id for p in self.parts[part]]

    def check(self) -> None:
        """Assert that no prompt cluster appears in two parts."""
        seen: dict[str, str] = {}
        for part in PARTS:
            for p in self.parts[part]:
                k = prompt_cluster_key(p.prompt)
                assert seen.setdefault(k, part) == part, f"prompt cluster in {seen[k]} and {part}: {p.id}"

    def summary(self) -> dict:
        """``{part: {"n_pairs", "n_prompt_clusters"}}`` plus seed and fractions (JSON-safe)."""
        return {"seed": int(self.seed), "fractions": [float(f) for f in self.fractions],
                **{part: {"n_pairs": len(self.parts[part]), "n_prompt_clusters": int(self.n_clusters[part])}
                   for part in PARTS}}


def _order(key: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode("utf-8")).hexdigest()


def split_by_prompt(pairs: Sequence, *, fractions: Sequence[float] = (0.6, 0.1, 0.3), seed: int = 0,
                    max_pairs: Mapping[str, int | None] | None = None) -> Split:
    """Split ``pairs`` (objects with ``.id`` and ``.prompt``) into train/dev/test by prompt cluster."""
    fr = [float(f) for f in fractions]
    if len(fr) != 3 or any(f < 0 for f in fr) or sum(fr) <= 0 or fr[0] == 0 or fr[1] == 0:
        raise SpecError("fit.fractions", f"need three non-negative shares (train, dev, test) with train "
                        f"and dev > 0, got {list(fractions)}.", fix="e.g. fit.fractions=[0.6,0.1,0.3].")
    total = sum(fr)
    fr = [f / total for f in fr]
    clusters: dict[str, list] = {}
    for p in pairs:
        clusters.setdefault(prompt_cluster_key(p.prompt), []).append(p)
    order = sorted(clusters, key=lambda k: _order(k, seed))
    counts = [0, 0, 0]
    assigned: dict[str, list[str]] = {part: [] for part in PARTS}
    n_total = 0
    for key in order:
        n_total += len(clusters[key])
        # the part with the largest shortfall against its target share of the pairs seen so far
        gaps = [fr[i] * n_total - counts[i] for i in range(3)]
        i = max(range(3), key=lambda j: (gaps[j], -j))
        assigned[PARTS[i]].append(key)
        counts[i] += len(clusters[key])
    caps = dict(max_pairs or {})
    for part, cap in caps.items():
        if part not in PARTS:
            raise SpecError("fit.max_pairs", f"unknown part {part!r}.", value=part, options=PARTS)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise SpecError("fit.max_pairs", f"cap for {part} must be a positive integer or null, got {cap!r}.",
                            fix=f"set fit.max_pairs.{part}=<an integer ≥ 1> or null (no cap).")
    parts: dict[str, list] = {}
    n_clusters: dict[str, int] = {}
    for part in PARTS:
        cap, kept, keys = caps.get(part), [], 0
        for key in assigned[part]:
            if cap is not None and len(kept) + len(clusters[key]) > cap:
                if kept:
                    continue           # try smaller clusters further on
            kept.extend(clusters[key])
            keys += 1
            if cap is not None and len(kept) >= cap:
                break
        parts[part] = kept
        n_clusters[part] = keys
    for part in ("train", "dev"):
        if not parts[part]:
            raise SpecError("fit.fractions", f"the {part} part is empty ({len(clusters)} prompt clusters in "
                            f"{len(pairs)} pairs).", fix="give more pairs or larger shares.")
    out = Split(parts=parts, seed=seed, fractions=tuple(fr), n_clusters=n_clusters)
    out.check()
    return out
