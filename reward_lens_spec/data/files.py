"""Reading a dataset file and checking the arguments every dataset kind shares.

Used by ``data.loaders`` (diagnostic, jsonl, hh_rlhf) and ``data.rewardbench`` (RewardBench 1/2), so
neither imports the other for them. Every error is a ``SpecError`` naming ``dataset.path``,
``dataset.limit`` or ``dataset.dimensions``, with the line (or item) and the fix.

A record is refused, with its line (JSON-Lines) or item (a JSON list), when it holds what strict JSON
(RFC 8259) has no meaning for and Python's reader would otherwise take silently: a key given twice in one
object (Python keeps the last), a non-finite number (``NaN``, ``Infinity``, ``-Infinity``, or a literal
such as ``1e999`` that overflows a float), or nesting deeper than ``MAX_DEPTH`` objects and lists (deeper
JSON would stop Python's reader, or a later step, with a ``RecursionError``).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
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


def check_file(resolved: Path, given: Any) -> None:
    """Raise ``SpecError`` (``dataset.path``) unless ``resolved`` is a file; ``given``: the path as configured."""
    if not resolved.is_file():
        what = "is a directory, not a file" if resolved.is_dir() else "does not exist"
        raise SpecError("dataset.path", f"{resolved} {what} (given {str(given)!r}).",
                        fix="set dataset.path to an existing .jsonl or .json file; relative paths "
                            "resolve against the directory you started in.")


def read_bytes(resolved: Path, given: Any) -> bytes:
    """The bytes of the file ``resolved`` as stored; ``given`` is the path as configured. Raises ``SpecError``
    (``dataset.path``) when it is no readable file."""
    check_file(resolved, given)
    try:
        return resolved.read_bytes()
    except OSError as e:
        raise SpecError("dataset.path", f"cannot read {resolved}: {e}.",
                        fix="check the file's permissions and compression.") from None


def read_text(resolved: Path, given: Any) -> tuple[str, dict[str, Any]]:
    """``(text, file_info)`` of a UTF-8 (optionally gzipped) file; ``given`` is the path as configured."""
    raw = read_bytes(resolved, given)
    try:
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


MAX_DEPTH = 64            # objects and lists a record may nest (the record itself is level 1)
_TOO_DEEP = (f"nested deeper than {MAX_DEPTH} levels of objects and lists",
             f"keep each record at most {MAX_DEPTH} levels deep (store deep structure as a string).")


class _Refusal:
    """What the strict reader puts where strict JSON has no value: ``(problem, fix)`` for the record's error."""

    __slots__ = ("problem", "fix")

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix


def _object(pairs: list) -> Any:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set = set()
    dup = next(k for k, _ in pairs if k in seen or seen.add(k))
    return _Refusal(f"key {dup!r} appears twice in one object (a JSON reader keeps one copy silently)",
                    "give each key once per object.")


def _non_finite(literal: str) -> _Refusal:
    return _Refusal(f"non-finite number {literal} (not JSON, and no count, score or agreement)",
                    "write a finite number, or null where the value is missing.")


def _float(literal: str) -> Any:
    value = float(literal)
    return value if math.isfinite(value) else _non_finite(f"{literal} (beyond the float range)")


_STRICT = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_non_finite, parse_float=_float)


def _refusal(row: Any) -> tuple[str, str] | None:
    """``(problem, fix)`` of the first thing strict JSON refuses in ``row`` (walked without recursion), or None."""
    stack = [(row, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, _Refusal):
            return value.problem, value.fix
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, (dict, list, _Refusal)):
                if depth >= MAX_DEPTH and not isinstance(child, _Refusal):
                    return _TOO_DEEP
                stack.append((child, depth + 1))
    return None


def _strict_loads(text: str, file_label: str, where: str | None, fix: str) -> Any:
    """``text`` read as strict JSON; ``SpecError`` naming the file and ``where`` (else the line of a syntax error)."""
    try:
        return _STRICT.decode(text)
    except json.JSONDecodeError as e:
        raise SpecError("dataset.path", f"{file_label} {where or f'line {e.lineno}'}: malformed JSON "
                        f"({e.msg} at column {e.colno}).", fix=fix) from None
    except RecursionError:
        raise SpecError("dataset.path", f"{file_label}{' ' + where if where else ''}: {_TOO_DEEP[0]}.",
                        fix=_TOO_DEEP[1]) from None


def _checked(row: Any, file_label: str, where: str) -> Any:
    found = _refusal(row)
    if found is not None:
        raise SpecError("dataset.path", f"{file_label} {where}: {found[0]}.", fix=found[1])
    return row


def jsonl_records(text: str, file_label: str) -> Iterator[tuple[int, str, Any]]:
    """``(index, "line N", row)`` for each non-blank JSON-Lines line (strict JSON: see the module doc)."""
    index = 0
    # split on "\n" only: str.splitlines would also cut at U+2028, U+0085 etc., which JSON
    # allows unescaped inside strings
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        yield index, f"line {lineno}", jsonl_row(line, file_label, lineno)
        index += 1


def jsonl_row(line: str, file_label: str, lineno: int) -> Any:
    """One non-blank JSON-Lines line read as strict JSON (see the module doc); ``SpecError`` naming the line."""
    row = _strict_loads(line, file_label, f"line {lineno}",
                        fix="make every line one JSON object (JSON-Lines); a .json file must hold one list.")
    return _checked(row, file_label, f"line {lineno}")


def json_list_records(text: str, file_label: str) -> Iterator[tuple[int, str, Any]]:
    """``(index, "item N", row)`` for each item of a JSON list (strict JSON: see the module doc)."""
    data = _strict_loads(text, file_label, None, fix="a .json file must hold one list of objects; use .jsonl "
                                                     "for one object per line.")
    if not isinstance(data, list):
        found = _refusal(data)
        if found is not None:
            raise SpecError("dataset.path", f"{file_label}: {found[0]}.", fix=found[1])
        raise SpecError("dataset.path", f"{file_label} holds a JSON {type(data).__name__}, "
                        "not a list of pairs.", fix="store the pairs as a JSON list, or as "
                        "JSON-Lines in a .jsonl file.")
    for i, row in enumerate(data):
        yield i, f"item {i}", _checked(row, file_label, f"item {i}")
