"""Token ids of many sequences, stored flat: the memory of a tokenized dataset is its tokens.

``TokenRows`` holds ``n`` sequences of token ids as one flat array (dims: token, all rows concatenated):
``uint16`` when the ids fit (vocabularies up to 65,536), else ``int32``; and ``n + 1`` offsets (row ``i`` is
``flat[off[i]:off[i+1]]``). A Python list of int lists costs 8 bytes per token for the pointer, a list header per row, and a 28-byte int object
per token id above 256; this costs 2 (or 4) bytes per token and 8 per row. A run over many pairs keeps
the encoded pairs for its whole length (chunks are cut from them), so this is most of what a
streamed run holds per pair (``benchmarks/results.md`` §12).

It reads as a sequence of ``list[int]``: ``rows[i]`` is a fresh list, ``rows[a:b]`` a ``TokenRows``
view sharing the flat array, iteration yields lists, it compares equal to any sequence of the same
rows, and ``a + b`` is the list of both's rows. Token ids must fit ``int32`` (every vocabulary
does); a negative or larger id is a ``ValueError``.

``rows.spilled()``: the same rows with the flat array in an unlinked temporary file (only the offsets, 8 bytes a
row, stay in memory), for a run's whole dataset (``models.formatting.encode_pairs`` builds it slice by slice with
``RowsBuilder``, which moves the tokens to the file part by part once they pass ``SPILL_BYTES``, so they are never
held twice): ``rows[a:b]`` (a chunk) then reads its tokens into an in-memory ``TokenRows``, ``rows[i]``
one row, iteration ``READ_ROWS`` rows at a time; every value read is the one the in-memory rows give. Reads are
explicit (no memory map), so a pass over every token (the run's digest) does not leave the file's pages in the
process's resident memory (benchmarks/results.md §25).
"""
from __future__ import annotations

import tempfile
import threading
from collections.abc import Sequence
from itertools import chain

import numpy as np

_MAX = np.iinfo(np.int32).max
_U16 = np.iinfo(np.uint16).max
SPILL_BYTES = 1 << 20        # encode_pairs spills a side above this many bytes (sides of ~40 tokens: ~12,000 pairs)
READ_ROWS = 4096             # rows read per file access when iterating spilled rows


def compact(flat: np.ndarray) -> np.ndarray:
    """``flat`` token ids as ``uint16`` when every id fits (vocabularies up to 65,536: 2 bytes a token), else
    ``int32``. Rows read back as Python ints either way, so no consumer sees the difference."""
    small = flat.size == 0 or (int(flat.min()) >= 0 and int(flat.max()) <= _U16)
    return flat.astype(np.uint16 if small else np.int32, copy=False)


class _FileTokens:
    """A flat token array in an unlinked temporary file, written by ``append``: ``[a:b]`` (step 1) reads those
    tokens into a new array. A part wider than the file's ``dtype`` (an ``int32`` slice after ``uint16`` ones)
    widens the file first, so every token keeps its value."""

    __slots__ = ("_file", "_lock", "dtype", "size")

    def __init__(self, flat: np.ndarray | None = None):
        self._file = tempfile.TemporaryFile()
        self._lock = threading.Lock()
        self.dtype, self.size = np.dtype(np.uint16), 0
        if flat is not None:
            self.append(flat)

    def append(self, flat: np.ndarray) -> None:
        if np.promote_types(self.dtype, flat.dtype) != self.dtype:
            self._widen(np.promote_types(self.dtype, flat.dtype))
        self._file.seek(self.size * self.itemsize)
        flat.astype(self.dtype, copy=False).tofile(self._file)
        self._file.flush()
        self.size += int(flat.size)

    def _widen(self, dtype) -> None:
        old, size, was = self._file, self.size, self.dtype
        self._file, self.dtype, self.size = tempfile.TemporaryFile(), np.dtype(dtype), 0
        step = READ_ROWS * 256
        for a in range(0, size, step):
            old.seek(a * was.itemsize)
            self.append(np.fromfile(old, was, count=min(step, size - a)))
        old.close()

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def __getitem__(self, sl: slice) -> np.ndarray:
        a, b, _ = sl.indices(self.size)
        out = np.empty(max(0, b - a), self.dtype)
        with self._lock:
            self._file.seek(a * self.itemsize)
            got = self._file.readinto(memoryview(out).cast("B"))
        if got != out.nbytes:
            raise OSError(f"token file: read {got} of {out.nbytes} bytes")
        return out


class RowsBuilder:
    """``TokenRows`` built part by part (``append`` a ``TokenRows`` per slice of a dataset; ``rows()`` the whole):
    once the parts pass ``spill_bytes`` of tokens, they and every later part go to a temporary file as they come
    (``_FileTokens``), so a dataset's tokens are never held twice, as parts and joined (``TokenRows.concat``).
    ``rows()`` is what ``TokenRows.concat(parts)`` gives, spilled (``TokenRows.spilled``) above the size."""

    def __init__(self, spill_bytes: int):
        self._spill, self._parts, self._lengths, self._file, self._bytes = spill_bytes, [], [], None, 0

    def append(self, part: "TokenRows") -> None:
        self._lengths.append(part.lengths())
        flat = part._flat[part._off[0]:part._off[-1]]
        if self._file is not None:
            self._file.append(flat)
            return
        self._parts.append(part)
        self._bytes += flat.nbytes
        if self._bytes > self._spill:
            self._file = _FileTokens()
            for held in self._parts:
                self._file.append(held._flat[held._off[0]:held._off[-1]])
            self._parts = []

    def rows(self) -> "TokenRows":
        if self._file is None:
            return TokenRows.concat(self._parts)
        lengths = np.concatenate(self._lengths)
        off = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        return TokenRows._view(self._file, off)


class TokenRows(Sequence):
    """``n`` token-id sequences in one flat ``uint16``/``int32`` array; see the module doc."""

    __slots__ = ("_flat", "_off")

    def __init__(self, rows=()):
        if isinstance(rows, TokenRows):
            self._flat, self._off = rows._flat, rows._off
            return
        rows = [r if isinstance(r, (list, tuple, np.ndarray)) else list(r) for r in rows]
        lengths = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
        off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        flat = np.fromiter(chain.from_iterable(rows), np.int64, count=int(off[-1]))
        if flat.size and (flat.min() < 0 or flat.max() > _MAX):
            raise ValueError(f"TokenRows: token ids must lie in [0, {_MAX}]; got {flat.min()}..{flat.max()}")
        self._flat, self._off = compact(flat), off

    @classmethod
    def _view(cls, flat: np.ndarray, off: np.ndarray) -> "TokenRows":
        out = cls.__new__(cls)
        out._flat, out._off = flat, off
        return out

    @classmethod
    def concat(cls, parts) -> "TokenRows":
        """One ``TokenRows`` of the rows of ``parts`` (``TokenRows``), in order."""
        parts = [p if isinstance(p, TokenRows) else TokenRows(p) for p in parts]
        if not parts:
            return cls()
        flats = [p._flat[p._off[0]:p._off[-1]] for p in parts]
        lengths = np.concatenate([np.diff(p._off) for p in parts])
        off = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        return cls._view(compact(np.concatenate(flats)), off)

    def __len__(self) -> int:
        return self._off.size - 1

    def spilled(self) -> "TokenRows":
        """These rows with their tokens in a temporary file (see the module doc); the offsets stay in memory."""
        off = self._off - self._off[0]
        return TokenRows._view(_FileTokens(self._flat[self._off[0]:self._off[-1]]), off)

    def __getitem__(self, i):
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step == 1 and isinstance(self._flat, _FileTokens):     # a chunk: its tokens read into memory
                off = self._off[a:max(a, b) + 1]
                return TokenRows._view(self._flat[off[0]:off[-1]], off - off[0])
            if step == 1:
                return TokenRows._view(self._flat, self._off[a:max(a, b) + 1])
            return TokenRows(self[k] for k in range(a, b, step))
        n = len(self)
        k = int(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"TokenRows index {i} out of range for {n} rows")
        return self._flat[self._off[k]:self._off[k + 1]].tolist()

    def __iter__(self):
        if isinstance(self._flat, _FileTokens):
            for a in range(0, len(self), READ_ROWS):
                yield from self[a:a + READ_ROWS]
            return
        flat, off = self._flat, self._off
        for k in range(off.size - 1):
            yield flat[off[k]:off[k + 1]].tolist()

    def __eq__(self, other) -> bool:
        if isinstance(other, TokenRows):
            return (len(self) == len(other) and np.array_equal(self.lengths(), other.lengths())
                    and np.array_equal(self._flat[self._off[0]:self._off[-1]],
                                       other._flat[other._off[0]:other._off[-1]]))
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == list(b) for a, b in zip(self, other))

    __hash__ = None

    def __add__(self, other) -> list:
        """``rows + other``: the rows of both as one list of lists, as for the lists this replaces."""
        return list(self) + list(other)

    def __radd__(self, other) -> list:
        return list(other) + list(self)

    def lengths(self) -> np.ndarray:
        """Tokens per row, shape ``(n,)``, int64."""
        return np.diff(self._off)

    @property
    def nbytes(self) -> int:
        """Bytes held in memory: the rows' tokens (only those this view spans; none when spilled) and its offsets."""
        if not self._off.size:
            return 0
        tokens = 0 if isinstance(self._flat, _FileTokens) else self._flat.itemsize * (self._off[-1] - self._off[0])
        return int(tokens + self._off.nbytes)

    def __getstate__(self):
        return {"flat": self._flat[self._off[0]:self._off[-1]].copy(), "off": self._off - self._off[0]}

    def __setstate__(self, state):
        self._flat, self._off = state["flat"], state["off"]

    def __repr__(self) -> str:
        return f"TokenRows({len(self)} rows, {int(self._off[-1] - self._off[0])} tokens)"
