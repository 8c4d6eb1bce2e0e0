"""Reading a dataset file and checking the arguments every dataset kind shares.

Used by ``data.loaders`` (diagnostic, jsonl, hh_rlhf) and ``data.rewardbench`` (RewardBench 1/2), so
neither imports the other for them. Every error is a ``SpecError`` naming ``dataset.path``,
``dataset.limit`` or ``dataset.dimensions``, with the line (or item) and the fix.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from ..errors import SpecError


def check_limit(limit: Any) -> int | None:
    """``dataset.limit``: ``None`` or a positive int."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise SpecError("dataset.limit", f"must be a positive integer or null, got {limit!r}.",
                        fix="set dataset.limit=<N> with N >= 1, or dataset.limit=null for all pairs.")
    if limit <= 0:
        raise SpecError("dataset.limit", f"must be >= 1, got {limit}.",
                        fix="set dataset.limit=<N> with N >= 1, or dataset.limit=null for all pairs.")
    return int(limit)


def check_dimension_names(dimensions: Any) -> list[str] | None:
    """``dataset.dimensions``: ``None``, or a non-empty list of names (one string is a list of one)."""
    if dimensions is None:
        return None
    if isinstance(dimensions, str):
        dimensions = [dimensions]
    try:
        names = list(dimensions)
    except TypeError:
        raise SpecError("dataset.dimensions", f"must be a list of dimension names, got {dimensions!r}.",
                        fix="e.g. dataset.dimensions=[helpfulness,harmlessness].") from None
    for d in names:
        if not isinstance(d, str):
            raise SpecError("dataset.dimensions", f"names must be strings, got {d!r}.",
                            fix="e.g. dataset.dimensions=[helpfulness,harmlessness].")
    if not names:
        raise SpecError("dataset.dimensions", "is an empty list, which would select no pairs.",
                        fix="name at least one dimension, or set dataset.dimensions=null for all.")
    return names


def resolve_path(path: Any, base_dir: str | None) -> Path:
    """``path`` with ``~`` expanded; relative paths against ``base_dir`` (else the current directory)."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute():
        p = Path(base_dir if base_dir else os.getcwd()) / p
    return p


def file_stem(p: Path) -> str:
    """The file name without ``.gz``, ``.jsonl``, ``.json`` (the dataset's default name)."""
    name = p.name
    for suffix in (".gz", ".jsonl", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name or p.name


def file_info(name: str, raw: bytes) -> dict[str, Any]:
    """``{name, bytes, sha256}`` of the file as stored (before any decompression)."""
    return {"name": name, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def read_text(resolved: Path, given: Any) -> tuple[str, dict[str, Any]]:
    """``(text, file_info)`` of a UTF-8 (optionally gzipped) file; ``given`` is the path as configured."""
    if not resolved.is_file():
        what = "is a directory, not a file" if resolved.is_dir() else "does not exist"
        raise SpecError("dataset.path", f"{resolved} {what} (given {str(given)!r}).",
                        fix="set dataset.path to an existing .jsonl or .json file; relative paths "
                            "resolve against the directory you started in.")
    try:
        raw = resolved.read_bytes()
        info = file_info(resolved.name, raw)
        if resolved.name.lower().endswith(".gz"):
            raw = gzip.decompress(raw)
        return raw.decode("utf-8-sig"), info
    except UnicodeDecodeError as e:
        raise SpecError("dataset.path", f"{resolved} is not UTF-8 text ({e.reason} at byte {e.start}).",
                        fix="re-save the file as UTF-8.") from None
    except (OSError, EOFError) as e:
        raise SpecError("dataset.path", f"cannot read {resolved}: {e}.",
                        fix="check the file's permissions and compression.") from None


def jsonl_records(text: str, file_label: str) -> Iterator[tuple[int, str, Any]]:
    """``(index, "line N", row)`` for each non-blank JSON-Lines line."""
    index = 0
    # split on "\n" only: str.splitlines would also cut at U+2028, U+0085 etc., which JSON
    # allows unescaped inside strings
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError("dataset.path", f"{file_label} line {lineno}: malformed JSON "
                            f"({e.msg} at column {e.colno}).",
                            fix="make every line one JSON object (JSON-Lines); a .json file must "
                                "hold one list.") from None
        yield index, f"line {lineno}", row
        index += 1


def json_list_records(text: str, file_label: str) -> Iterator[tuple[int, str, Any]]:
    """``(index, "item N", row)`` for each item of a JSON list."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError("dataset.path", f"{file_label} line {e.lineno}: malformed JSON "
                        f"({e.msg} at column {e.colno}).",
                        fix="a .json file must hold one list of objects; use .jsonl for "
                            "one object per line.") from None
    if not isinstance(data, list):
        raise SpecError("dataset.path", f"{file_label} holds a JSON {type(data).__name__}, "
                        "not a list of pairs.", fix="store the pairs as a JSON list, or as "
                        "JSON-Lines in a .jsonl file.")
    for i, row in enumerate(data):
        yield i, f"item {i}", row
