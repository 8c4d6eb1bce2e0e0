"""The preference-pair schema: one ``Pair`` per labelled comparison, a ``PairSet`` per dataset.

A ``Pair`` holds one prompt and two responses: ``chosen`` (preferred by the label) and
``rejected``. ``prompt_rejected`` is the rejected side's own prompt and is set only when it
differs from ``prompt``. The loaders EXCLUDE such pairs, because a margin between two
different contexts is not a preference. The field is kept for pairs built in code.

``meta`` keeps every extra key of the source row as sorted ``(key, value)`` tuples. Scalars
(str, int, float, bool, None) are kept as they are. Lists and dicts are stored as their
canonical JSON text (``json.dumps(..., sort_keys=True)``). So a ``Pair`` stays hashable and
``meta`` can always be written to JSON.

A ``PairSet`` is the loaded, filtered dataset. It carries its ``checksum``
(``dataset_checksum``), its effective sample size (``n_unique``, ``n_prompt_clusters``; see
``effective_sample_size``) and ``flags``: reason -> list of pair ids. The reasons are
``identical_sides`` (kept; chosen == rejected on the same prompt, so the margin must be exactly
0), ``empty_response`` (kept; a side is empty or whitespace only) and ``prompt_mismatch``
(EXCLUDED; the two sides have different prompts). ``source_file`` is ``{name, bytes, sha256}``
of the file the pairs were read from (``None`` for pairs built in code).

``PAIR_FLAGS`` are the per-pair flags every stored result carries as boolean coords on its
``pair`` dim (``data.accounting.pair_flags``): ``empty_response``, ``identical_sides`` (from the
data) and ``prompt_truncated``, ``response_truncated`` (from the encoding,
``models.formatting.encode_pairs``). ``KIND_FLAGS`` are the flags a kind adds to its own runs only (its
encoding hook, ``EncodedPairs.kind_flags``): ``no_step_separator`` (``model.kind=prm``: a side in which the step
token never occurs, read as one step; ``kinds.prm``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

FLAG_REASONS = ("identical_sides", "empty_response", "prompt_mismatch")
PAIR_FLAGS = ("empty_response", "identical_sides", "prompt_truncated", "response_truncated")
KIND_FLAGS = ("no_step_separator",)


def json_safe(value: Any) -> Any:
    """Return ``value`` as a hashable, JSON-writable meta value (see module docstring)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def make_meta(extra: Mapping[str, Any]) -> tuple:
    """Sorted ``(key, json_safe(value))`` tuples of the extra keys of a row."""
    return tuple(sorted((str(k), json_safe(v)) for k, v in extra.items()))


@dataclass(frozen=True)
class Pair:
    """One preference pair; ``chosen`` is the response the label prefers."""

    id: str
    prompt: str
    chosen: str
    rejected: str
    dimension: str = ""
    rubric: str = ""
    source: str = ""
    prompt_rejected: str | None = None
    meta: tuple = ()

    @property
    def rejected_prompt(self) -> str:
        """The prompt the rejected response answers (``prompt_rejected`` or ``prompt``)."""
        return self.prompt if self.prompt_rejected is None else self.prompt_rejected

    def meta_dict(self) -> dict[str, Any]:
        """``meta`` as a dict."""
        return dict(self.meta)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-writable dict of every field (``meta`` as a dict)."""
        return {"id": self.id, "prompt": self.prompt, "chosen": self.chosen,
                "rejected": self.rejected, "dimension": self.dimension, "rubric": self.rubric,
                "source": self.source, "prompt_rejected": self.prompt_rejected,
                "meta": self.meta_dict()}


@dataclass(frozen=True)
class PairSet:
    """A loaded dataset: pairs in file order, plus checksum, effective size and flags."""

    name: str
    pairs: tuple[Pair, ...]
    checksum: str
    n_unique: int
    n_prompt_clusters: int
    flags: dict = field(default_factory=dict)
    source_file: dict | None = None
    shape: str | None = None            # a TRL shape (data.readers), None for the other kinds
    chat_template: str | None = None    # dataset.chat_template (conversational shapes; None: the model's)
    step_separator: str | None = None   # dataset.step_separator (stepwise shape)

    def shape_record(self) -> dict | None:
        """What a run records (and its id covers) about the shape: ``{shape, chat_template, step_separator}``
        — ``chat_template`` is ``"model"`` (the tokenizer's) or ``"dataset:<sha256>"`` of the declared one for
        conversational shapes, else None — or ``None`` for data not read by a TRL reader."""
        if self.shape is None:
            return None
        import hashlib
        tmpl = None
        if self.shape.startswith("conversational"):
            tmpl = "model" if self.chat_template is None else \
                "dataset:" + hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()
        return {"shape": self.shape, "chat_template": tmpl,
                "step_separator": self.step_separator if self.shape == "stepwise" else None}

    @property
    def ids(self) -> Sequence[str]:
        """Pair ids, in order: a tuple, or for pairs left in their file a ``data.file_pairs.FileIds`` (from the
        ids kept, no re-read, each decoded as read), equal to the tuple of the same ids."""
        kept = getattr(self.pairs, "ids", None)
        return kept if kept is not None else tuple(p.id for p in self.pairs)

    @property
    def dimensions(self) -> tuple[str, ...]:
        """Distinct dimension labels, sorted."""
        return tuple(sorted({p.dimension for p in self.pairs}))

    def __len__(self) -> int:
        return len(self.pairs)

    def __iter__(self) -> Iterator[Pair]:
        return iter(self.pairs)

    def __getitem__(self, index):
        return self.pairs[index]

    def by_id(self, pair_id: str) -> Pair:
        """The pair with id ``pair_id`` (``KeyError`` if absent)."""
        for p in self.pairs:
            if p.id == pair_id:
                return p
        raise KeyError(pair_id)

    def provenance(self) -> dict[str, Any]:
        """What a store records about the dataset: name, file, checksum, sizes, flag counts."""
        return {"name": self.name, "file": self.source_file, "checksum": self.checksum, "n": len(self.pairs),
                "n_unique": self.n_unique, "n_prompt_clusters": self.n_prompt_clusters,
                "flags": {k: len(v) for k, v in self.flags.items()},
                **({"shape": self.shape_record()} if self.shape else {})}
