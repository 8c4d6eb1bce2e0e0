"""A plain JSON-Lines file read once and left on disk (``data.loaders.load_pairs``' streamed route).

``load_streamed`` reads the file line by line for everything a run records — file sha256, checksum, ids (given,
or generated from content with ``-k`` for repeats), flags, sizes, warnings — and keeps per kept pair only where
its line lies (offset, length, a 16-byte BLAKE2b digest, record index) and its id (``data.file_pairs.FilePairs``
re-reads, checks and converts lines on access). Ids, checksum, flags, sizes and errors equal the in-memory loop's
(``tests/test_file_pairs.py``). Raises ``SpecError`` (``dataset.path``, ``dataset.dimensions``,
``dataset.fields.id``) as that loop does.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np

from ..errors import SpecError
from .checksum import checksum_of_digests, normalize, pair_hash, prompt_cluster_key
from .file_pairs import FilePairs, concat, id_array, line_digest, row_digest
from .files import jsonl_row
from .pairs import FLAG_REASONS, PairSet
from .readers import CONVERSATIONAL


def warn_prompt_mismatch(name: str, ids: list, stacklevel: int = 2) -> None:
    """The one warning for pairs left out because their chosen and rejected prompts differ (``UserWarning``;
    the run counts them in its ``data_flags`` as ``prompt_mismatch``); ``stacklevel`` as the caller's own
    ``warnings.warn`` would take it."""
    shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
    warnings.warn(f"dataset {name!r}: excluded {len(ids)} pair(s) whose chosen and rejected prompts differ "
                  f"({shown}); the run counts them in its data_flags (prompt_mismatch).", UserWarning,
                  stacklevel=stacklevel + 1)


def empty_response(text: str, conversational: bool) -> bool:
    """An empty response: blank text, or (messages) every message's content blank."""
    if not conversational:
        return not text.strip()
    return all(not str(m.get("content", "")).strip() for m in json.loads(text))


def load_streamed(resolved: Path, convert, name: str, limit, wanted, chat_template, step_separator):
    """``data.loaders.load_pairs`` of a plain JSON-Lines file in one pass that keeps ~50 bytes per pair
    (``data.file_pairs``): the same ids, checksum, flags, sizes, warnings and errors as the in-memory loop, the
    pairs left in the file (``PairSet.pairs`` a ``FilePairs``)."""
    label = str(resolved)
    cols = {k: [] for k in ("off", "len", "dig", "rec", "hash", "dim", "mis", "same", "empty", "tri", "clu", "gen")}
    ids: list = []
    blocks: dict = {k: [] for k in cols}
    dims: dict[str, int] = {}
    file_hash, size, offset, record = hashlib.sha256(), 0, 0, 0

    def flush():
        kinds = {"off": np.int64, "len": np.int32, "dig": "S16", "rec": np.int32, "hash": "S32", "dim": np.int32,
                 "mis": bool, "same": bool, "empty": bool, "tri": "S16", "clu": "S16", "gen": bool}
        for k, v in cols.items():
            blocks[k].append(np.array(v, dtype=kinds[k]))
            v.clear()
        blocks.setdefault("ids", []).append(ids[:])
        ids.clear()

    try:
        with open(resolved, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                file_hash.update(raw)
                size += len(raw)
                start = offset
                offset += len(raw)
                body = raw[:-1] if raw.endswith(b"\n") else raw
                if lineno == 1 and body.startswith(b"\xef\xbb\xbf"):     # utf-8-sig, as read_text
                    body, start = body[3:], start + 3
                try:
                    line = body.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise SpecError("dataset.path", f"{resolved} is not UTF-8 text ({e.reason} at byte "
                                    f"{start + e.start}).", fix="re-save the file as UTF-8.") from None
                if not line.strip():
                    continue
                pair = convert(jsonl_row(line, label, lineno), record, f"line {lineno}")
                cols["off"].append(start)
                cols["len"].append(len(body))
                cols["dig"].append(line_digest(body))
                cols["rec"].append(record)
                cols["hash"].append(bytes.fromhex(pair_hash(pair)))
                cols["dim"].append(dims.setdefault(pair.dimension, len(dims)))
                cols["mis"].append(pair.prompt_rejected is not None)
                cols["same"].append(pair.chosen == pair.rejected)
                shape = convert.reader.name if convert.reader is not None else None
                cols["empty"].append(any(empty_response(t, shape in CONVERSATIONAL) for t in (pair.chosen, pair.rejected)))
                cols["tri"].append(row_digest(tuple(normalize(getattr(pair, k) or "")
                                                    for k in ("prompt", "chosen", "rejected"))))
                cols["clu"].append(row_digest(prompt_cluster_key(pair.prompt)))
                cols["gen"].append(pair.id is None)
                ids.append(pair.id or "")
                record += 1
                if len(ids) >= 8192:
                    flush()
    except OSError as e:
        raise SpecError("dataset.path", f"cannot read {resolved}: {e}.",
                        fix="check the file's permissions and compression.") from None
    flush()
    given = [i for part in blocks.pop("ids") for i in part]
    col = {k: concat(blocks.pop(k), None) for k in list(blocks)}      # each block list let go as it is joined
    if not record:
        raise SpecError("dataset.path", f"{label} holds no pairs.",
                        fix="point dataset.path at a file with one JSON object per line.")
    pair_ids = final_ids(given, col["hash"], col["gen"])
    check_unique(pair_ids, col["off"], resolved)
    keep = np.ones(record, bool)
    if wanted is not None:
        available = sorted(dims)
        for d in wanted:
            if d not in available:
                raise SpecError("dataset.dimensions", f"unknown dimension {d!r} in {name}.",
                                value=d, options=available,
                                fix="use dimensions the file has, or drop dataset.dimensions.")
        keep &= np.isin(col["dim"], [dims[d] for d in set(wanted)])
    mismatched = [pair_ids[k] for k in np.flatnonzero(keep & col["mis"])]
    if mismatched:
        warn_prompt_mismatch(name, mismatched, stacklevel=3)
        keep &= ~col["mis"]
    kept = np.flatnonzero(keep)
    if not kept.size:
        raise SpecError("dataset.path", f"{label}: every pair was excluded because its two "
                        "prompts differ.", fix="give each pair one shared prompt.")
    if limit is not None:
        kept = kept[:limit]
    shape = convert.reader.name if convert.reader is not None else None
    flags: dict[str, list[str]] = {reason: [] for reason in FLAG_REASONS}
    flags["prompt_mismatch"] = mismatched
    if shape != "stepwise":
        flags["identical_sides"] = [pair_ids[k] for k in kept[col["same"][kept]]]
    flags["empty_response"] = [pair_ids[k] for k in kept[col["empty"][kept]]]
    checksum = checksum_of_digests(col.pop("hash")[kept])
    conversational = shape in CONVERSATIONAL
    ids_kept = id_array([pair_ids[k] for k in kept])
    del pair_ids
    pairs = FilePairs(resolved, label, col["off"][kept], col["len"][kept], col["dig"][kept], col["rec"][kept],
                      ids_kept, convert)
    return PairSet(name=name, pairs=pairs, checksum=checksum,
                   n_unique=int(np.unique(col["tri"][kept]).size), n_prompt_clusters=int(np.unique(col["clu"][kept]).size),
                   flags=flags, source_file={"name": resolved.name, "bytes": size, "sha256": file_hash.hexdigest()},
                   shape=shape, chat_template=chat_template if conversational else None,
                   step_separator=step_separator if shape == "stepwise" else None)


def final_ids(given: list, hashes: np.ndarray, generated: np.ndarray) -> list:
    """Every row's id: its own, or ``"pair-" + pair_hash[:16]`` with ``-k`` for the k-th repeat (k >= 2) of
    one content in file order, as the in-memory loop makes them."""
    rows = np.flatnonzero(generated)
    if rows.size:
        keys = hashes[rows].astype("S8")      # the 16 hex digits of the base, as the loop keys its repeats
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        starts = np.r_[True, sk[1:] != sk[:-1]]
        group_start = np.maximum.accumulate(np.where(starts, np.arange(sk.size), 0))
        rank = np.empty(rows.size, np.int64)
        rank[order] = np.arange(sk.size) - group_start + 1
        for r, k in zip(rows, rank):
            base = "pair-" + hashes[r].ljust(32, b"\0").hex()[:16]
            given[r] = base if k == 1 else f"{base}-{k}"
    return given


def check_unique(ids: list, offsets: np.ndarray, resolved: Path) -> None:
    """Refuse the first id (in file order) that an earlier row already has, naming both lines."""
    arr = np.array([hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=16).digest() for i in ids],
                   dtype="S16")
    order = np.argsort(arr, kind="stable")
    sa = arr[order]
    dup = np.flatnonzero(sa[1:] == sa[:-1])
    clash = [(int(order[j + 1]), int(order[np.searchsorted(sa, sa[j])])) for j in dup
             if ids[order[j + 1]] == ids[order[np.searchsorted(sa, sa[j])]]]
    if not clash:
        return
    later, first = min(clash)
    with open(resolved, "rb") as f:
        head = f.read(int(offsets[later]))
    where = head.count(b"\n") + 1
    first_line = head[:int(offsets[first])].count(b"\n") + 1
    raise SpecError("dataset.fields.id", f"duplicate id {ids[later]!r} in {resolved} "
                    f"(line {first_line} and line {where}).",
                    fix="ids must be unique: map dataset.fields.id to a unique key, or "
                        "remove the id key so ids are generated from each pair's content.")
