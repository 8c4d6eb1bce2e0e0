"""Pairs that stay in their file: a ``Sequence`` of ``Pair`` re-read from a JSON-Lines file on access.

``data.loaders`` reads a plain (uncompressed) JSON-Lines file once, row by row, for everything a run records
about it (checksum, ids, flags, effective sample size: ``PairSet``), and keeps per kept pair only where its
line lies and what it holds: byte offset (int64), length (int32), a 16-byte BLAKE2b digest of the line's bytes,
its record index (int32) and its id (fixed-width UTF-8 bytes): about 50 bytes a pair, against ~400 for the texts
as ``Pair`` objects. ``FilePairs[i]`` / ``FilePairs[a:b]`` / iteration read those lines again, check each
against its digest, parse them by the same strict reader and turn them into the same ``Pair`` s by the same
row reader (``convert``), so what a chunk sees is exactly what the first pass hashed.

A line whose bytes changed since the first pass (the file edited, replaced or truncated while a run reads it)
raises one ``SpecError`` (``dataset.path``) naming the file and the line's record; nothing is read from a file
that no longer holds the data the run's identity covers.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import SpecError
from .files import jsonl_row

DIGEST_BYTES = 16
READ_BLOCK = 4096           # pairs read per file access when iterating


def line_digest(raw: bytes) -> bytes:
    """The 16-byte BLAKE2b digest a line's bytes are checked against on every re-read."""
    return hashlib.blake2b(raw, digest_size=DIGEST_BYTES).digest()


class FilePairs(Sequence):
    """The kept pairs of a JSON-Lines file, in order, re-read on access (see the module doc).

    ``offsets`` (int64), ``lengths`` (int32), ``digests`` (``S16``), ``index`` (record index, int32) and
    ``ids`` (``S<n>``, UTF-8) are per pair, dims ``pair``; ``convert(row, index, where) -> Pair`` is the loader's
    row reader; ``after`` (``Pair -> Pair``) a view applied to each pair read (``inputs.ops_view``).
    Raises ``SpecError`` (``dataset.path``) when a line changed since it was first read."""

    def __init__(self, path: Path, label: str, offsets, lengths, digests, index, ids, convert: Callable,
                 after: Callable | None = None):
        self.path, self.label, self.convert, self.after = Path(path), label, convert, after
        self.offsets, self.lengths, self.digests = offsets, lengths, digests
        self.index, self._ids = index, ids

    def __len__(self) -> int:
        return int(self.offsets.size)

    @property
    def ids(self) -> "FileIds":
        """Pair ids, in order (from the ids kept, no file access; each decoded as it is read)."""
        return FileIds(self._ids)

    def id_at(self, k: int) -> str:
        return self._ids[k].decode("utf-8", "surrogatepass")

    @property
    def nbytes(self) -> int:
        """Bytes held for the pairs (the per-pair arrays)."""
        return sum(a.nbytes for a in (self.offsets, self.lengths, self.digests, self.index, self._ids))

    def take(self, positions) -> "FilePairs":
        """The pairs at ``positions`` (a slice, or an int array), in that order, still in the file."""
        return FilePairs(self.path, self.label, *(a[positions] for a in (self.offsets, self.lengths, self.digests,
                                                                           self.index, self._ids)),
                         convert=self.convert, after=self.after)

    def view(self, after: Callable) -> "FilePairs":
        """The same pairs, each read through ``after`` (``Pair -> Pair``)."""
        return FilePairs(self.path, self.label, self.offsets, self.lengths, self.digests, self.index, self._ids,
                         convert=self.convert, after=after)

    def __getitem__(self, i):
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            return tuple(self._read(range(a, b, step)))
        n, k = len(self), int(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"FilePairs index {i} out of range for {n} pairs")
        return self._read([k])[0]

    def __iter__(self) -> Iterator:
        for a in range(0, len(self), READ_BLOCK):
            yield from self._read(range(a, min(a + READ_BLOCK, len(self))))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"FilePairs({len(self)} pairs of {self.path.name})"

    def _read(self, ks) -> list:
        """The pairs ``ks`` (positions), read from the file in one span and checked line by line."""
        ks = list(ks)
        if not ks:
            return []
        lo = int(min(self.offsets[k] for k in ks))
        hi = int(max(self.offsets[k] + self.lengths[k] for k in ks))
        try:
            with open(self.path, "rb") as f:
                f.seek(lo)
                span = f.read(hi - lo)
        except OSError as e:
            raise SpecError("dataset.path", f"cannot read {self.label} again: {e}.",
                            fix="keep the data file in place until the run completes; run the same command again.") \
                from None
        out = []
        for k in ks:
            a = int(self.offsets[k]) - lo
            raw = span[a:a + int(self.lengths[k])]
            record = int(self.index[k])
            if len(raw) != int(self.lengths[k]) or line_digest(raw) != self.digests[k].ljust(DIGEST_BYTES, b"\0"):
                raise SpecError("dataset.path", f"{self.label} changed while the run read it: record {record + 1} "
                                "no longer holds the bytes its checksum and run id were computed from.",
                                fix="do not edit or replace the data file while a run reads it; run the same "
                                    "command again on the file as it is now.")
            row = jsonl_row(raw.decode("utf-8"), self.label, record + 1)
            pair = self.convert(row, record, f"record {record + 1}")
            pair = _with_id(pair, self.id_at(k))
            out.append(self.after(pair) if self.after is not None else pair)
        return out


class FileIds(Sequence):
    """A file's pair ids in order, decoded one at a time from the ``S<n>`` UTF-8 bytes ``FilePairs`` keeps (no
    string per pair held: 100,000 ids as a tuple are ~7 MB); a slice is a tuple; equal to any sequence of the
    same ids, as the tuple ``PairSet.ids`` gives for pairs in memory."""

    __slots__ = ("_raw",)

    def __init__(self, raw: np.ndarray):
        self._raw = raw

    def __len__(self) -> int:
        return int(self._raw.size)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(len(self))))
        return self._raw[i].decode("utf-8", "surrogatepass")       # numpy: negative k, IndexError past the end

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"FileIds({list(self[:3])}{'…' if len(self) > 3 else ''}, {len(self)} ids)"


def _with_id(pair, pair_id: str):
    from dataclasses import replace
    return pair if pair.id == pair_id else replace(pair, id=pair_id)


def id_array(ids: list) -> np.ndarray:
    """``ids`` (str) as fixed-width UTF-8 bytes (``S<n>``; lone surrogates kept by ``surrogatepass``)."""
    return np.array([i.encode("utf-8", "surrogatepass") for i in ids], dtype=bytes) if ids else \
        np.zeros(0, dtype="S1")


def concat(parts: list, dtype) -> np.ndarray:
    """One array of ``parts`` (arrays), ``dtype`` when there is none."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def row_digest(values: Any) -> bytes:
    """16 bytes of sha256 of ``repr`` of ``values`` (a tuple of strings): an equality key for counting."""
    return hashlib.sha256(repr(values).encode("utf-8", "surrogatepass")).digest()[:16]
