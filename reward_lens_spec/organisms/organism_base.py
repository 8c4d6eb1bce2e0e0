"""What every model organism shares: the ``Organism`` record, the strengths, the word list and the
``PairSet`` builder. ``organisms.organisms`` (planted, trained) and ``organisms.preference_organisms``
(cycles, annotators, objectives) both build on it, so neither imports the other at module level
except ``organisms.organism_family``, which dispatches to the preference kinds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..data import Pair, PairSet, dataset_checksum, effective_sample_size
from ..models.loading import LoadedModel

STRENGTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
WORDS = ("apple", "river", "stone", "cloud", "green", "quiet", "metal", "paper", "light", "north",
         "table", "sugar", "glass", "horse", "smile", "ocean", "tiger", "bread", "chair", "music")


@dataclass
class Organism:
    """One organism at one strength: the model, the graded pairs and the planted truth."""

    kind: str
    strength: float
    lm: LoadedModel
    pairs: PairSet
    truth: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)      # how it was built (part of a scorecard's identity)

    @property
    def family(self) -> str:
        return self.lm.family.name

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.strength:g}"


def pairset(name: str, pairs: list[Pair]) -> PairSet:
    """A ``PairSet`` of ``pairs`` (in order) with its checksum and effective sample size, no flags."""
    ess = effective_sample_size(pairs)
    return PairSet(name=name, pairs=tuple(pairs), checksum=dataset_checksum(pairs),
                   n_unique=ess["n_unique"], n_prompt_clusters=ess["n_prompt_clusters"], flags={})
