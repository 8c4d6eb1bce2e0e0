"""Read RewardBench (pairs) and RewardBench 2 (best-of-N items) files into a ``PairSet``.

Formats: JSON-Lines (``.jsonl``, ``.jsonl.gz``), a JSON list (``.json``, or JSON-Lines under a
``.json`` name, as ``datasets`` writes it) and Parquet (``.parquet``, read with pyarrow).

RewardBench (Lambert et al. 2024, ``allenai/reward-bench``, split ``filtered``): one row per
pair, keys ``prompt, chosen, rejected`` (strings), ``subset``, ``id`` and the model-name fields
``chosen_model, rejected_model``. The subset becomes the pair's ``dimension``; ``id`` (int or
str) its id; everything else is kept in ``meta``. A row without a subset gets ``subset``
(``dataset.subset``), else the file stem. Subset names of the LLMBar release (``LLMBar/Natural``,
``LLMBar/Adversarial/Neighbor`` …) are mapped to RewardBench's (``llmbar-natural``,
``llmbar-adver-neighbor`` …), which hold those very pairs; the name in the file is kept as
``meta["source_subset"]``.

RewardBench 2 (Malik et al. 2025, ``allenai/reward-bench-2``): one row per item, keys
``prompt``, ``chosen`` and ``rejected`` (lists of strings: one correct answer and three wrong
ones, several correct ones in the Ties subset), ``subset``, ``id`` and optional ``num_correct,
num_rejected, total_completions, models``. An item with chosen ``C[0..c)`` and rejected
``R[0..r)`` becomes ``r + c − 1`` pairs ``(C[0], R[j])`` (id ``<item>:c0-r<j>``) and
``(C[i], R[0])`` for i ≥ 1 (id ``<item>:c<i>-r0``), so every candidate is a side of some pair and
the capture pass scores each distinct token sequence once. ``meta`` holds ``item``,
``chosen_index`` and ``rejected_index``; ``ops.rewardbench.BestOfN`` regroups the rewards into an
``item × candidate`` array. ``limit`` counts items, not pairs. Ties items keep their ids
(``ref:<k>``: prompt k with one correct answer; ``tied:<k>``: the same prompt with several), which
the official Ties score (``ops.rewardbench_ties``) reads to pair them.

Errors: ``SpecError`` naming ``dataset.path`` (missing or unreadable file, bad JSON, no rows,
Parquet without pyarrow), ``dataset.fields.<name>`` (a key missing or of the wrong type) or
``dataset.kind``; a duplicate id is an error.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import SpecError, did_you_mean
from .checksum import dataset_checksum, effective_sample_size, pair_hash
from .files import (check_dimension_names, check_limit, file_info, file_stem, json_list_records, jsonl_records,
                    read_text, resolve_path)
from .pairs import FLAG_REASONS, Pair, PairSet, make_meta

V1_KEYS = ("id", "prompt", "chosen", "rejected", "subset")
# The LLMBar release's subset names -> RewardBench's names for the same pairs (reward-bench
# rewardbench/constants.py SUBSET_MAPPING; LLMBar, Zeng et al. 2024).
SUBSET_ALIASES = {
    "LLMBar/Natural": "llmbar-natural",
    "LLMBar/Adversarial/Neighbor": "llmbar-adver-neighbor",
    "LLMBar/Adversarial/GPTInst": "llmbar-adver-GPTInst",
    "LLMBar/Adversarial/GPTOut": "llmbar-adver-GPTOut",
    "LLMBar/Adversarial/Manual": "llmbar-adver-manual",
}


def load_rewardbench(path, *, version: int = 1, fields: Mapping[str, str] | None = None, limit: int | None = None,
                     dimensions: Iterable[str] | None = None, subset: str | None = None,
                     base_dir: str | None = None) -> PairSet:
    """Load a RewardBench (``version=1``) or RewardBench 2 (``version=2``) file; see the module doc.

    ``fields`` maps our names (``id, prompt, chosen, rejected, subset``) to the file's keys;
    ``dimensions`` keeps the named subsets; ``limit`` keeps the first N rows (pairs, or items for
    version 2). Returns a ``PairSet`` whose ``dimension`` is the subset.
    """
    kind = "rewardbench" if version == 1 else "rewardbench2"
    if path is None or str(path).strip() == "":
        raise SpecError("dataset.path", f"kind={kind} needs a file path.",
                        fix="set dataset.path=<file.jsonl|.json|.parquet> (relative paths resolve against the "
                            "directory you started in).")
    limit = check_limit(limit)
    wanted = check_dimension_names(dimensions)
    keys = {k: k for k in V1_KEYS}
    for name, key in dict(fields or {}).items():
        if name not in V1_KEYS:
            raise SpecError(f"dataset.fields.{name}", f"unknown field name {name!r} for kind={kind}.", value=name,
                            options=V1_KEYS, fix="map only these names to the file's keys.")
        if not isinstance(key, str) or not key:
            raise SpecError(f"dataset.fields.{name}", f"must name a key of the file, got {key!r}.",
                            fix=f"set dataset.fields.{name}=<a key of the file's rows>.")
        keys[name] = key
    resolved = resolve_path(path, base_dir)
    rows = read_rows(resolved, path)
    stem = file_stem(resolved).removesuffix(".parquet")
    pairs: list[Pair] = []
    seen: dict[str, str] = {}
    n_items = 0
    for index, where, row in rows:
        if limit is not None and n_items >= limit:
            break
        made = (_v1_pair if version == 1 else _v2_pairs)(row, index, where, keys, resolved, subset or stem)
        if wanted is not None and made and made[0].dimension not in wanted:
            continue
        n_items += 1
        for p in made:
            if p.id in seen:
                raise SpecError("dataset.fields.id", f"duplicate id {p.id!r} in {resolved} ({seen[p.id]} and {where}).",
                                fix="ids must be unique: map dataset.fields.id to a unique key.")
            seen[p.id] = where
            pairs.append(p)
    if not pairs:
        raise SpecError("dataset.path", f"{resolved} holds no {'pairs' if version == 1 else 'items'}"
                        f"{' in the selected subsets' if wanted else ''}.",
                        fix="point dataset.path at a RewardBench file, or check dataset.dimensions.")
    if wanted is not None:
        missing = sorted(set(wanted) - {p.dimension for p in pairs})
        if missing and limit is None:
            warnings.warn(f"dataset {stem!r}: no rows in subset(s) {missing}.", UserWarning, stacklevel=2)
    flags: dict[str, list[str]] = {reason: [] for reason in FLAG_REASONS}
    for p in pairs:
        if p.chosen == p.rejected:
            flags["identical_sides"].append(p.id)
        if not p.chosen.strip() or not p.rejected.strip():
            flags["empty_response"].append(p.id)
    ess = effective_sample_size(pairs)
    return PairSet(name=stem, pairs=tuple(pairs), checksum=dataset_checksum(pairs), n_unique=ess["n_unique"],
                   n_prompt_clusters=ess["n_prompt_clusters"], flags=flags,
                   source_file=file_info(resolved.name, resolved.read_bytes()))


def read_rows(resolved: Path, given) -> list[tuple[int, str, Any]]:
    """``(index, where, row)`` of every record of a JSON-Lines, JSON-list or Parquet file."""
    name = resolved.name.lower()
    if name.endswith(".parquet"):
        if not resolved.is_file():
            read_text(resolved, given)                  # raises the loaders' missing-file error
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SpecError("dataset.path", f"{resolved} is Parquet, which needs pyarrow.",
                            fix="pip install pyarrow (or convert the file to JSON-Lines).") from None
        try:
            table = pq.read_table(resolved)
        except Exception as exc:                         # pyarrow raises its own ArrowInvalid / OSError
            raise SpecError("dataset.path", f"{resolved} is not a readable Parquet file ({exc}).",
                            fix="check the file, or convert it to JSON-Lines.") from None
        return [(i, f"row {i}", r) for i, r in enumerate(table.to_pylist())]
    text, _ = read_text(resolved, given)
    if name.endswith((".json", ".json.gz")) and text.lstrip().startswith("["):
        return list(json_list_records(text, str(resolved)))
    return list(jsonl_records(text, str(resolved)))


def _field(row, name, keys, where, file, *, kind=str, required=True):
    key = keys[name]
    if key not in row or row[key] is None:
        if not required:
            return None
        if isinstance(row, dict) and key in row:          # present, but null (JSON null / Parquet None)
            raise SpecError(f"dataset.fields.{name}", f"{file} {where}: key {key!r} (field '{name}') is null.",
                            fix=f"give '{key}' a string in every row, or drop the rows where it is null.")
        present = sorted(row) if isinstance(row, dict) else []
        raise SpecError(f"dataset.fields.{name}", f"{file} {where} has no key {key!r} for field '{name}' (keys "
                        f"present: {', '.join(present)}).{did_you_mean(key, present)}",
                        fix=f"set dataset.fields.{name}=<key> to the key that holds the {name}.")
    value = row[key]
    if kind is list:
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
            raise SpecError(f"dataset.fields.{name}", f"{file} {where}: key {key!r} must be a non-empty list of "
                            f"strings in RewardBench 2, got {type(value).__name__}.",
                            fix="use dataset=rewardbench for one chosen and one rejected string per row.")
        return [str(v) for v in value]
    if name == "id" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        hint = (" (a list: this looks like RewardBench 2; use dataset=rewardbench2)"
                if isinstance(value, list) and name in ("chosen", "rejected") else "")
        raise SpecError(f"dataset.fields.{name}", f"{file} {where}: key {key!r} must be a string, got "
                        f"{type(value).__name__}{hint}.", fix=f"give '{key}' a string in every row.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:                        # a lone surrogate ("\ud800") in a JSON string
        raise SpecError(f"dataset.fields.{name}", f"{file} {where}: key {key!r} holds a lone surrogate "
                        f"{value[exc.start]!r} at character {exc.start}, which is not valid Unicode text.",
                        fix="repair the file's JSON escapes, or drop the row.") from None
    return value


def _subset(row, keys, where, file, default):
    if not isinstance(row, dict):
        raise SpecError("dataset.path", f"{file} {where}: expected a JSON object, got {type(row).__name__}.",
                        fix="make every record one JSON object.")
    raw = _field(row, "subset", keys, where, file, required=False)
    name = raw if raw is not None else default
    return SUBSET_ALIASES.get(name, name), raw


def _v1_pair(row, index, where, keys, file, default_subset) -> list[Pair]:
    subset, raw = _subset(row, keys, where, file, default_subset)
    pid = _field(row, "id", keys, where, file, required=False)
    used = {keys[k] for k in V1_KEYS}
    extra = {k: v for k, v in row.items() if k not in used}
    if raw is not None and raw != subset:
        extra["source_subset"] = raw
    pair = Pair(id=str(pid), prompt=_field(row, "prompt", keys, where, file),
                chosen=_field(row, "chosen", keys, where, file), rejected=_field(row, "rejected", keys, where, file),
                dimension=subset, source=Path(str(file)).name, meta=make_meta(extra))
    # no id in the row: one from its content (as data.loaders does), never from its position in the file
    return [pair if pid is not None else dataclasses.replace(pair, id="pair-" + pair_hash(pair)[:16])]


def _v2_pairs(row, index, where, keys, file, default_subset) -> list[Pair]:
    subset, raw = _subset(row, keys, where, file, default_subset)
    prompt = _field(row, "prompt", keys, where, file)
    chosen = _field(row, "chosen", keys, where, file, kind=list)
    rejected = _field(row, "rejected", keys, where, file, kind=list)
    item = _field(row, "id", keys, where, file, required=False)
    if item is None:              # an id from the item's content, never from its position in the file
        blob = json.dumps([prompt, chosen, rejected, subset], ensure_ascii=False, separators=(",", ":"), default=str)
        item = "item-" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
    item = str(item)
    used = {keys[k] for k in V1_KEYS}
    extra = {k: v for k, v in row.items() if k not in used}
    if raw is not None and raw != subset:
        extra["source_subset"] = raw
    combos = [(0, j) for j in range(len(rejected))] + [(i, 0) for i in range(1, len(chosen))]
    return [Pair(id=f"{item}:c{i}-r{j}", prompt=prompt, chosen=chosen[i], rejected=rejected[j], dimension=subset,
                 source=Path(str(file)).name,
                 meta=make_meta({**extra, "item": item, "chosen_index": i, "rejected_index": j,
                                 "n_chosen": len(chosen), "n_rejected": len(rejected)}))
            for i, j in combos]
