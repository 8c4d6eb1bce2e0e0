"""Read preference pairs from the built-in diagnostic set or from JSON-Lines files.

``load_pairs(kind, path=..., fields=..., limit=..., dimensions=..., base_dir=...)``

Kinds:

- ``diagnostic``: the built-in set ``reward_lens_spec/data/diagnostic.jsonl`` (13 dimensions,
  7 pairs each). It takes no ``path`` and no ``fields``.
- ``jsonl``: a JSON-Lines file (``.jsonl``, optionally ``.gz``), or a ``.json`` file that holds
  a list of objects. ``fields`` maps our names (``id, prompt, chosen, rejected, dimension,
  rubric, source, prompt_rejected``) to the file's keys. The default is the identity. The keys
  ``prompt``, ``chosen`` and ``rejected`` must be present in every row. The other keys are
  optional unless ``fields`` maps them. A row without an id gets one from its content, never
  from its line number: ``"pair-" + pair_hash(pair)[:16]`` (``data.checksum.pair_hash``: the
  exact prompt, prompt_rejected, chosen, rejected and dimension), and the k-th exact repeat of
  one content (k >= 2, in file order) gets ``-k`` appended. Reordering a file therefore keeps
  every pair's id, and the id of a margin always names the text it was computed on.
- ``trl``: TRL's four preference shapes (standard or conversational, explicit or implicit prompt), and
  ``trl_stepwise``: TRL's stepwise supervision (one response per row): read by the reader objects of
  ``data.readers`` (its docstring states the implicit-prompt rule). ``fields`` may rename the shape's keys
  and ``id``, ``dimension``, ``source``; ids, duplicates, ``dimensions`` and ``limit`` as for ``jsonl``.
  ``chat_template`` (conversational shapes) and ``step_separator`` (stepwise) are recorded on the
  ``PairSet`` (``shape``, ``PairSet.shape_record``). A stepwise row is never flagged ``identical_sides``.
- ``hh_rlhf``: like ``jsonl``. ``attribute`` becomes the ``dimension`` when a row has no
  dimension. A row with no prompt key (and ``fields`` not mapping one) is read as a raw
  Anthropic HH-RLHF row: ``chosen`` and ``rejected`` are whole transcripts. Each is split at
  its last ``"\\n\\nAssistant:"``. The prompt keeps that tag, so ``prompt + chosen`` equals
  the chosen transcript. The rejected transcript's prompt becomes ``prompt_rejected`` when it
  differs.

Keys the mapping does not use are kept in ``Pair.meta``. ``fields`` may also map the meta
names ``group``, ``agreement`` and ``votes`` (read by the preference-structure operators, see
``ops/pair_labels.py``): the file's key is then kept in ``meta`` under our name. A row without
``source`` gets the file name as its source.

Filtering, in order: ``dimensions`` keeps the named dimensions. Pairs whose two prompts
differ are excluded; ``flags["prompt_mismatch"]`` lists those excluded from the selected
dimensions, and a warning gives the count. Then ``limit`` keeps the first N in file order. ``identical_sides`` and ``empty_response`` are
flagged on the pairs that are kept.

``PairSet.source_file`` records the file read: ``name``, ``bytes`` (its size on disk) and
``sha256`` of those bytes.

A plain (uncompressed) JSON-Lines file is read in one pass that keeps ~50 bytes per pair: ``PairSet.pairs``
is then a ``data.file_pairs.FilePairs``, which re-reads each pair from the file on access and refuses a line
whose bytes changed since (``dataset.path``). Ids, checksum, flags, sizes, warnings and errors are those of the
in-memory read (``.gz``, ``.json``, a reader's own ``rows``, the built-in sets), which holds every ``Pair``.

Relative paths resolve against ``base_dir`` (the directory the user started in, which Hydra
may have changed), else the current directory. Every bad input raises one ``SpecError`` that
names the config field (``dataset.path``, ``dataset.kind``, ``dataset.fields.<name>``,
``dataset.limit``, ``dataset.dimensions``), the line, and the fix.
"""
from __future__ import annotations

from enum import Enum
from importlib import resources
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from ..errors import SpecError, did_you_mean

from .checksum import dataset_checksum, effective_sample_size, pair_hash
from .files import (check_dimension_names, check_file, check_limit, file_info, file_stem, json_list_records,
                    jsonl_records, read_bytes, read_text, resolve_path)
from .pairs import FLAG_REASONS, Pair, PairSet, make_meta
from .readers import CONVERSATIONAL, STEPWISE, check_trl_fields, check_trl_options, preference_reader
from .stream_load import empty_response, load_streamed, warn_prompt_mismatch

KINDS = ("diagnostic", "jsonl", "hh_rlhf", "rewardbench", "rewardbench2", "trl", "trl_stepwise")
TRL_KINDS = ("trl", "trl_stepwise")
FIELD_NAMES = ("id", "prompt", "chosen", "rejected", "dimension", "rubric", "source",
               "prompt_rejected")
META_FIELDS = ("group", "agreement", "votes")   # kept in Pair.meta under these names (ops/pair_labels.py)
REQUIRED = ("prompt", "chosen", "rejected")
ASSISTANT_TAG = "\n\nAssistant:"
DIAGNOSTIC_FILE = "diagnostic.jsonl"


def load_pairs(kind: str, *, path: str | None = None, fields: Mapping[str, str] | None = None,
               limit: int | None = None, dimensions: Iterable[str] | None = None,
               base_dir: str | None = None, subset: str | None = None, chat_template: str | None = None,
               step_separator: str = "\n", rows: Callable[[Path], Iterable[Mapping]] | None = None) -> PairSet:
    """Load, check and filter preference pairs; see the module docstring for the rules.

    ``rewardbench``/``rewardbench2`` (and ``subset``, the subset of rows without one) are read by
    ``data.rewardbench.load_rewardbench``. ``rows`` (kind ``jsonl``): a reader's parser of the resolved file
    into records (a third-party ``DatasetReader``), used instead of JSON; the records then meet every rule
    above, and ``source_file`` is the file's bytes as stored.
    """
    kind = _check_kind(kind)
    if kind in ("rewardbench", "rewardbench2"):
        from .rewardbench import load_rewardbench
        return load_rewardbench(path, version=1 if kind == "rewardbench" else 2, fields=fields, limit=limit,
                                dimensions=dimensions, subset=subset, base_dir=base_dir)
    if subset is not None:
        raise SpecError("dataset.subset", f"kind={kind} has no subsets.", fix="drop dataset.subset, or use "
                        "dataset=rewardbench.")
    limit = check_limit(limit)
    check_trl_options(kind, chat_template, step_separator)
    if kind in TRL_KINDS:
        mapping, explicit = check_trl_fields(fields, kind), frozenset()
    else:
        mapping, explicit = _check_fields(fields, kind)
    wanted = check_dimension_names(dimensions)
    if path is not None and str(path).strip() == "":
        path = None

    if kind == "diagnostic":
        if path is not None:
            raise SpecError("dataset.path", f"kind=diagnostic reads the built-in set and takes no path "
                            f"(got {path!r}).", fix="remove dataset.path, or set dataset.kind=jsonl "
                            "to read that file.")
        ref = resources.files("reward_lens_spec.data").joinpath(DIAGNOSTIC_FILE)
        raw = ref.read_bytes()
        text = raw.decode("utf-8")
        source_file = file_info(DIAGNOSTIC_FILE, raw)
        name, file_label = "diagnostic", f"builtin {DIAGNOSTIC_FILE}"
        records = jsonl_records(text, file_label)
    else:
        if path is None:
            raise SpecError("dataset.path", f"kind={kind} needs a file path.",
                            fix="set dataset.path=<file.jsonl> (relative paths resolve against "
                                "the directory you started in).")
        resolved = resolve_path(path, base_dir)
        file_label = str(resolved)
        name = file_stem(resolved)
        if rows is None and not resolved.name.lower().endswith((".gz", ".json")):   # plain JSON-Lines: streamed
            check_file(resolved, path)
            convert = RowReader(kind, mapping, explicit, file_label, step_separator)
            return load_streamed(resolved, convert, name, limit, wanted, chat_template, step_separator)
        if rows is not None and kind == "jsonl":      # a reader's own parser (inputs.DatasetReader.rows)
            source_file = file_info(resolved.name, read_bytes(resolved, path))
            records = ((i, f"record {i + 1}", row) for i, row in enumerate(rows(resolved)))
        else:
            text, source_file = read_text(resolved, path)
            records = (json_list_records if resolved.name.lower().endswith((".json", ".json.gz")) else
                       jsonl_records)(text, file_label)

    pairs: list[Pair] = []
    seen: dict[str, str] = {}
    repeats: dict[str, int] = {}
    convert = RowReader(kind, mapping, explicit, file_label, step_separator)
    for index, where, row in records:
        pair = convert(row, index, where)
        if pair.id is None:                       # generated from content, never from the line
            base = "pair-" + pair_hash(pair)[:16]
            repeats[base] = repeats.get(base, 0) + 1
            pair = replace(pair, id=base if repeats[base] == 1 else f"{base}-{repeats[base]}")
        if pair.id in seen:
            raise SpecError("dataset.fields.id", f"duplicate id {pair.id!r} in {file_label} "
                            f"({seen[pair.id]} and {where}).",
                            fix="ids must be unique: map dataset.fields.id to a unique key, or "
                                "remove the id key so ids are generated from each pair's content.")
        seen[pair.id] = where
        pairs.append(pair)
    if not pairs:
        raise SpecError("dataset.path", f"{file_label} holds no pairs.",
                        fix="point dataset.path at a file with one JSON object per line.")

    if wanted is not None:
        available = sorted({p.dimension for p in pairs})
        for d in wanted:
            if d not in available:
                raise SpecError("dataset.dimensions", f"unknown dimension {d!r} in {name}.",
                                value=d, options=available,
                                fix="use dimensions the file has, or drop dataset.dimensions.")
        keep = set(wanted)
        pairs = [p for p in pairs if p.dimension in keep]

    mismatched = [p.id for p in pairs if p.prompt_rejected is not None]
    if mismatched:
        warn_prompt_mismatch(name, mismatched, stacklevel=2)
        pairs = [p for p in pairs if p.prompt_rejected is None]
    if not pairs:
        raise SpecError("dataset.path", f"{file_label}: every pair was excluded because its two "
                        "prompts differ.", fix="give each pair one shared prompt.")

    if limit is not None:
        pairs = pairs[:limit]

    flags: dict[str, list[str]] = {reason: [] for reason in FLAG_REASONS}
    flags["prompt_mismatch"] = mismatched
    shape = convert.reader.name if convert.reader is not None else None
    conversational = shape in CONVERSATIONAL
    for p in pairs:
        if p.chosen == p.rejected and shape != "stepwise":
            flags["identical_sides"].append(p.id)
        if any(empty_response(t, conversational) for t in (p.chosen, p.rejected)):
            flags["empty_response"].append(p.id)

    ess = effective_sample_size(pairs)
    return PairSet(name=name, pairs=tuple(pairs), checksum=dataset_checksum(pairs),
                   n_unique=ess["n_unique"], n_prompt_clusters=ess["n_prompt_clusters"],
                   flags=flags, source_file=source_file, shape=shape,
                   chat_template=chat_template if conversational else None,
                   step_separator=step_separator if shape == "stepwise" else None)


class RowReader:
    """One record of a file as a ``Pair`` (``id`` None when the row has none), by the rules of ``kind``: the
    one row reader of the in-memory loop and of ``data.file_pairs.FilePairs``' re-reads. A TRL kind's shape is
    fixed by the first record read (``reader``)."""

    def __init__(self, kind, mapping, explicit, file_label, step_separator):
        self.kind, self.mapping, self.explicit, self.file_label = kind, mapping, explicit, file_label
        self.step_separator, self.reader = step_separator, None

    def __call__(self, row, index: int, where: str) -> Pair:
        if self.kind in TRL_KINDS:
            place = f"{self.file_label} {where}"
            self.reader = self.reader or _trl_reader(self.kind, row, place, self.mapping)
            pair = _read_trl(self.reader, row, place, self.mapping, self.step_separator)
            return pair if pair.source else replace(pair, source=Path(self.file_label).name)
        return _row_to_pair(row, index=index, where=where, kind=self.kind, mapping=self.mapping,
                            explicit=self.explicit, file_label=self.file_label,
                            default_source="" if self.kind == "diagnostic" else Path(self.file_label).name)


# ----------------------------------------------------------------------------- TRL shapes (data.readers)

def _trl_reader(kind: str, row: Any, where: str, mapping: dict):
    if kind == "trl_stepwise":
        return STEPWISE
    return preference_reader(row, where, mapping)


def _read_trl(reader, row: Any, where: str, mapping: dict, step_separator: str) -> Pair:
    if not isinstance(row, dict):
        raise SpecError("dataset.path", f"{where}: expected a JSON object, got {type(row).__name__}.",
                        fix="make every record one JSON object.")
    pair = reader.read_row(row, where, mapping, step_separator) if reader is STEPWISE else \
        reader.read_row(row, where, mapping)
    for name in ("prompt", "chosen", "rejected"):
        _check_encodable(getattr(pair, name), f"dataset.fields.{name}", where, f"field {name!r}")
    for k, v in pair.meta:
        _check_encodable(v, "dataset.path", where, f"key {k!r}")
    return pair


# ----------------------------------------------------------------------------- arguments

def _check_kind(kind: Any) -> str:
    if isinstance(kind, Enum):
        kind = kind.value
    if not isinstance(kind, str) or kind not in KINDS:
        raise SpecError("dataset.kind", f"unknown dataset kind {kind!r}.", value=kind, options=KINDS,
                        fix="set dataset.kind to one of the valid kinds.")
    return kind


def _check_fields(fields: Any, kind: str) -> tuple[dict[str, str], frozenset[str]]:
    """Return (our name -> file key, the names the user mapped on purpose)."""
    mapping = {n: n for n in FIELD_NAMES + META_FIELDS}
    if fields is None:
        return mapping, frozenset()
    if not isinstance(fields, Mapping) and not hasattr(fields, "items"):
        raise SpecError("dataset.fields", f"must be a mapping of our field names to the file's keys, "
                        f"got {type(fields).__name__}.", fix="e.g. dataset.fields={prompt: input}.")
    given = {str(k): v for k, v in dict(fields).items()}
    if given and kind == "diagnostic":
        raise SpecError("dataset.fields", "kind=diagnostic reads the built-in set and takes no "
                        "field mapping.", fix="remove dataset.fields, or set dataset.kind=jsonl.")
    for name, key in given.items():
        if name not in FIELD_NAMES + META_FIELDS:
            raise SpecError(f"dataset.fields.{name}", f"unknown field name {name!r}.", value=name,
                            options=FIELD_NAMES + META_FIELDS,
                            fix="map only these names to the file's keys: "
                                + ", ".join(f"dataset.fields.{n}" for n in FIELD_NAMES + META_FIELDS) + ".")
        if not isinstance(key, str) or not key:
            raise SpecError(f"dataset.fields.{name}", f"must name a key of the file (a non-empty "
                            f"string), got {key!r}.", fix=f"set dataset.fields.{name}=<key>.")
        mapping[name] = key
    return mapping, frozenset(given)


# ----------------------------------------------------------------------------- rows

def _row_to_pair(row: Any, *, index: int, where: str, kind: str, mapping: dict[str, str],
                 explicit: frozenset[str], file_label: str, default_source: str) -> Pair:
    """One record as a ``Pair``; ``id`` is None when the row has none (``load_pairs`` makes one)."""
    if not isinstance(row, dict):
        raise SpecError("dataset.path", f"{file_label} {where}: expected a JSON object, got "
                        f"{type(row).__name__}.", fix="make every record one JSON object.")
    used: set[str] = set()

    def get(name: str, required: bool) -> Any:
        key = mapping[name]
        if key not in row:
            if required or name in explicit:
                present = sorted(row)
                raise SpecError(
                    f"dataset.fields.{name}",
                    f"{file_label} {where} has no key {key!r} for field '{name}' "
                    f"(keys present: {', '.join(present)}).{did_you_mean(key, present)}",
                    fix=f"set dataset.fields.{name}=<key> to the key that holds the {name}.")
            return None
        used.add(key)
        value = row[key]
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise SpecError(f"dataset.fields.{name}",
                            f"{file_label} {where}: key {key!r} must be a string, got "
                            f"{type(value).__name__} ({_short(value)}).",
                            fix=f"give '{key}' a string in every row, or set "
                                f"dataset.fields.{name}=<key> to a string-valued key.")
        _check_encodable(value, f"dataset.fields.{name}", f"{file_label} {where}", f"key {key!r}")
        return value

    raw_transcript = (kind == "hh_rlhf" and "prompt" not in explicit and mapping["prompt"] not in row)
    if raw_transcript:
        chosen_t = get("chosen", True)
        rejected_t = get("rejected", True)
        prompt, chosen = _split_transcript(chosen_t, "chosen", file_label, where)
        prompt_r, rejected = _split_transcript(rejected_t, "rejected", file_label, where)
        prompt_rejected = prompt_r
    else:
        prompt = get("prompt", True)
        chosen = get("chosen", True)
        rejected = get("rejected", True)
        prompt_rejected = get("prompt_rejected", False)
    if prompt_rejected == prompt:
        prompt_rejected = None

    pair_id = get("id", False)
    dimension = get("dimension", False)
    if dimension is None and kind == "hh_rlhf" and isinstance(row.get("attribute"), str):
        dimension = row["attribute"]  # attribute stays in meta as well
    rubric = get("rubric", False)
    source = get("source", False)

    extra = {k: v for k, v in row.items() if k not in used}
    for k, v in extra.items():
        _check_encodable(v, "dataset.path", f"{file_label} {where}", f"key {k!r}")
    for name in META_FIELDS:          # a mapped meta field is kept under our name
        if name in explicit and mapping[name] in extra:
            extra[name] = extra.pop(mapping[name])
    if raw_transcript and "source_line" not in extra:
        extra["source_line"] = index
    return Pair(id=pair_id, prompt=prompt, chosen=chosen, rejected=rejected,
                dimension=dimension or "", rubric=rubric or "",
                source=source if source is not None else default_source,
                prompt_rejected=prompt_rejected, meta=make_meta(extra))


def _check_encodable(value: Any, field: str, place: str, what: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate such as ``"\\ud800"`` in a JSON string)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SpecError(field, f"{place}: {what} holds a lone surrogate {value[exc.start]!r} at character "
                                   f"{exc.start}, which is not valid Unicode text.",
                            fix="repair the file's JSON escapes (\\udXXX must come in high+low pairs), or drop "
                                "the row.") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_encodable(k, field, place, what)
            _check_encodable(v, field, place, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_encodable(v, field, place, what)


def _split_transcript(text: str, side: str, file_label: str, where: str) -> tuple[str, str]:
    """Split an HH-RLHF transcript at its last ``"\\n\\nAssistant:"``; the prompt keeps the tag."""
    i = text.rfind(ASSISTANT_TAG)
    if i < 0:
        raise SpecError(f"dataset.fields.{side}",
                        f"{file_label} {where}: the {side} transcript has no "
                        f"{ASSISTANT_TAG!r} turn, so it cannot be split into prompt and response.",
                        fix="give rows a 'prompt' key (or map dataset.fields.prompt=<key>), or use "
                            "whole HH-RLHF transcripts ('\\n\\nHuman: ...\\n\\nAssistant: ...').")
    cut = i + len(ASSISTANT_TAG)
    return text[:cut], text[cut:]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
