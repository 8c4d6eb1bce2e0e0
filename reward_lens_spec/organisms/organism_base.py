"""What every model organism shares: the ``Organism`` record, the ``OrganismFamily`` each family registers
(``registries.ORGANISMS``), the strengths, the word list and the ``PairSet`` builder.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

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


@dataclass(frozen=True)
class OrganismFamily:
    """One family of model organisms, as ``registries.ORGANISMS`` holds it (``calibrate organism=<name>``):
    ``build(strengths, **kw)`` returns one ``Organism`` per strength, in strength order (``kw``: the builder's
    keyword arguments, e.g. ``n_pairs``, ``seed``, ``base``); ``description``: one line for listings."""

    name: str
    build: Callable[..., list]
    description: str = ""


def each_strength(name: str, builder: Callable, description: str, *, then: Callable | None = None,
                  drop: tuple[str, ...] = ()) -> OrganismFamily:
    """The family that calls ``builder(strength, **kw)`` once per strength (``kw`` without the keys in ``drop``,
    which this builder does not take) and passes each organism through ``then`` (a truth added afterwards)."""
    def build(strengths=STRENGTHS, **kw):
        kw = {k: v for k, v in kw.items() if k not in drop}
        return [then(builder(s, **kw)) if then else builder(s, **kw) for s in strengths]
    return OrganismFamily(name, build, description)


def pairset(name: str, pairs: list[Pair]) -> PairSet:
    """A ``PairSet`` of ``pairs`` (in order) with its checksum and effective sample size, no flags."""
    ess = effective_sample_size(pairs)
    return PairSet(name=name, pairs=tuple(pairs), checksum=dataset_checksum(pairs),
                   n_unique=ess["n_unique"], n_prompt_clusters=ess["n_prompt_clusters"], flags={})
