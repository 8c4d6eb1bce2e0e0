"""Dataset readers: one object per dataset format (``dataset=<name>``), in xarray's ``BackendEntrypoint`` shape.

A reader has ``name`` (what ``dataset.kind`` says), ``description``, ``url`` (where the format is defined),
``open_dataset_parameters`` (the ``DatasetSpec`` keys it honours), ``guess_can_open(filename_or_obj)`` and
``open_dataset(filename_or_obj, **kw)``: the ``PairSet`` (``data.pairs``) of a file, read through the one
loading path (``inputs.load_dataset``, as every run, frame, fit and calibration reads data), so a key means
the same on every route. ``registries.DATASET_READERS`` lists them; each built-in registers itself below.

A new format subclasses ``DatasetReader`` and implements ``rows(path) -> iterable of mappings`` (one record
per pair, keys ``prompt``, ``chosen``, ``rejected`` and optionally ``id``, ``dimension``, ``rubric``,
``source``); the loading path then applies every rule of ``jsonl`` (``data.loaders``: ``dataset.fields``,
content ids, duplicates, ``dimensions``, ``limit``, flags, the file's digest). Register it with
``@DATASET_READERS.register`` (or an entry point in the group ``reward_lens_spec.readers``; ``docs/extending.md``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from .data.readers import PREFERENCE_READERS, STEPWISE, TRL_URL
from .inputs import load_dataset
from .registries import DATASET_READERS
from .spec import DatasetSpec

JSON_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")


class DatasetReader:
    """One dataset format (see the module docstring). Subclass it; set ``name`` and ``description``;
    implement ``rows`` (and ``guess_can_open`` where a file's name or first record tells)."""

    name = ""
    description = ""
    url = ""
    open_dataset_parameters: tuple[str, ...] = ("path", "fields", "limit", "dimensions", "base_dir")
    reads_as = "jsonl"             # the built-in kind whose rules apply to the records ``rows`` gives

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {self.description}>"

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        """True when this reader reads ``filename_or_obj`` (a path); ``False`` by default."""
        return False

    def rows(self, path: Path) -> Iterable[Mapping]:
        """The records of the file at ``path`` (resolved), one mapping per pair. Raise ``SpecError`` on
        field ``dataset.path`` for a file that is not of this format."""
        raise NotImplementedError(f"dataset reader '{self.name}' gives no rows")

    def open_dataset(self, filename_or_obj: Any = None, *, base_dir: str | None = None, **kw) -> Any:
        """The ``PairSet`` of ``filename_or_obj`` (a path; ``None`` for a built-in set) read by this reader
        through ``inputs.load_dataset``; ``kw``: ``DatasetSpec`` keys (``fields``, ``limit``, ``dimensions``,
        ``subset``, ``chat_template``, ``step_separator``). Raises ``SpecError`` naming the field."""
        given = {k: v for k, v in kw.items() if v is not None}
        path = None if filename_or_obj is None else str(filename_or_obj)
        return load_dataset(DatasetSpec(name=self.name, kind=self.name, path=path, **given), base_dir)


class BuiltinReader(DatasetReader):
    """A format ``data.load_pairs`` parses itself (its ``rows`` is ``None``)."""

    rows = None                    # type: ignore[assignment]

    def __init__(self, name: str, description: str, url: str = "", suffixes: tuple[str, ...] = (),
                 parameters: tuple[str, ...] = ()):
        self.name, self.description, self.url, self.reads_as = name, description, url, name
        self.suffixes = suffixes
        self.open_dataset_parameters = DatasetReader.open_dataset_parameters + parameters

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        return bool(self.suffixes) and str(filename_or_obj).lower().endswith(self.suffixes)


class TRLReader(BuiltinReader):
    """TRL's dataset formats: the shape is the first ``data.readers`` shape whose ``guess_can_open`` takes it."""

    def __init__(self, name: str, description: str, shapes, parameters: tuple[str, ...]):
        super().__init__(name, description, TRL_URL, (), parameters)
        self.shapes = shapes

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        return any(s.guess_can_open(filename_or_obj) for s in self.shapes)


for _reader in (
        BuiltinReader("diagnostic", "the built-in diagnostic set (13 dimensions, 7 pairs each); takes no path"),
        BuiltinReader("jsonl", "JSON Lines (or a JSON list) of {prompt, chosen, rejected, ...}; dataset.fields "
                      "renames keys", "https://jsonlines.org", JSON_SUFFIXES),
        BuiltinReader("hh_rlhf", "Anthropic HH-RLHF rows: whole transcripts split at the last Assistant turn",
                      "https://huggingface.co/datasets/Anthropic/hh-rlhf"),
        BuiltinReader("rewardbench", "RewardBench (v1) rows: prompt, chosen, rejected, subset",
                      "https://huggingface.co/datasets/allenai/reward-bench", parameters=("subset",)),
        BuiltinReader("rewardbench2", "RewardBench 2 best-of-4 items: one chosen, several rejected",
                      "https://huggingface.co/datasets/allenai/reward-bench-2", parameters=("subset",)),
        TRLReader("trl", "TRL's four preference shapes (standard or conversational, explicit or implicit prompt)",
                  PREFERENCE_READERS, ("chat_template",)),
        TRLReader("trl_stepwise", "TRL's stepwise supervision: prompt, completions, labels (one response per row)",
                  (STEPWISE,), ("step_separator",))):
    DATASET_READERS.register(_reader)
