"""Pair ids of many pairs, stored as their bytes: a run keeps its ids for its whole length at 8–9 bytes an id.

``PairIds`` holds ``n`` ids (``str``) as one UTF-8 byte string (lone surrogates kept, ``surrogatepass``) and
``n + 1`` offsets (id ``i`` is ``data[off[i]:off[i+1]]``). A list of ``str`` costs a pointer and a ~50-byte
string object per id: ~6 MB a run of 100,000 short ids, held from encoding to completion
(``EncodedPairs.pair_ids``; ``benchmarks/results.md`` §43, issue 40 item 5).

It reads as a sequence of ``str``, like the list it replaces: ``ids[i]`` decodes one id, ``ids[a:b]`` (step 1)
is a ``PairIds`` of those ids, iteration yields ``str``, it compares equal to any sequence of the same ids
(list, tuple, ``PairIds``), and ``len``, ``in``, ``index`` and truthiness behave as a list's. ``raw`` gives the
bytes and offsets to a caller that reads them whole (``arrays.str_index``).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..byte_rows import prefixed

READ_IDS = 4096              # offsets turned into Python ints per step of an iteration


class PairIds(Sequence):
    """``n`` pair ids (dims ``pair``) held as UTF-8 bytes and int64 offsets; a ``Sequence[str]``.

    ``PairIds(ids)`` from any iterable of ``str`` (a ``TypeError`` names the first id that is not one);
    ``PairIds.join(parts)`` concatenates ``PairIds`` without decoding them."""

    __slots__ = ("_data", "_off")

    def __init__(self, ids=()):
        if isinstance(ids, PairIds):
            self._data, self._off = ids._data, ids._off
            return
        parts = []
        for k, i in enumerate(ids):
            if not isinstance(i, str):
                raise TypeError(f"pair id {k} is {type(i).__name__} {i!r}, not str")
            parts.append(i.encode("utf-8", "surrogatepass"))
        self._off = np.zeros(len(parts) + 1, np.int64)
        if parts:
            np.cumsum(np.fromiter(map(len, parts), np.int64, count=len(parts)), out=self._off[1:])
        self._data = b"".join(parts)

    @classmethod
    def _of(cls, data: bytes, off: np.ndarray) -> "PairIds":
        new = cls.__new__(cls)
        new._data, new._off = data, off
        return new

    @classmethod
    def join(cls, parts: Sequence["PairIds"]) -> "PairIds":
        """One ``PairIds`` of ``parts``' ids, in order (bytes and offsets concatenated, nothing decoded)."""
        parts = [p if isinstance(p, PairIds) else PairIds(p) for p in parts]
        off = np.zeros(sum(len(p) for p in parts) + 1, np.int64)
        at, base = 1, 0
        for p in parts:
            off[at:at + len(p)] = p._off[1:] + base
            at, base = at + len(p), base + len(p._data)
        return cls._of(b"".join(p._data for p in parts), off)

    def raw(self) -> tuple[bytes, np.ndarray]:
        """``(data, offsets)``: the ids' UTF-8 bytes (``surrogatepass``) and their ``n + 1`` int64 offsets."""
        return self._data, self._off

    def joined(self, sep: bytes) -> bytes:
        """The ids' bytes with ``sep`` between each two: ``sep.join(i.encode("utf-8", "surrogatepass") for i in
        ids)``, made in one numpy pass (``byte_rows.prefixed``: ``sep`` before every id, the first one cut)."""
        if len(self) <= 1 or not sep:
            return self._data
        heads = np.tile(np.frombuffer(sep, np.uint8), (len(self), 1))
        return prefixed(np.frombuffer(self._data, np.uint8), self._off, heads)[len(sep):].tobytes()

    def __len__(self) -> int:
        return self._off.size - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return PairIds([self[k] for k in range(a, b, step)])
            b = max(a, b)
            lo, hi = int(self._off[a]), int(self._off[b])
            return PairIds._of(self._data[lo:hi], self._off[a:b + 1] - lo)
        n, k = len(self), int(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"PairIds index {i} out of range for {n} ids")
        return self._data[int(self._off[k]):int(self._off[k + 1])].decode("utf-8", "surrogatepass")

    def __iter__(self):
        data = self._data
        text = data.decode("ascii") if data.isascii() else None    # ASCII: one decode, each id a slice of it
        for a in range(0, len(self), READ_IDS):
            off = self._off[a:a + READ_IDS + 1].tolist()
            for k in range(len(off) - 1):
                yield text[off[k]:off[k + 1]] if text is not None else \
                    data[off[k]:off[k + 1]].decode("utf-8", "surrogatepass")

    def __eq__(self, other) -> bool:
        if isinstance(other, PairIds):
            return self._data == other._data and np.array_equal(self._off, other._off)
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __reduce__(self):
        return PairIds._of, (self._data, self._off)

    def __repr__(self) -> str:
        head = ", ".join(repr(i) for i in self[:3])
        return f"PairIds([{head}{', …' if len(self) > 3 else ''}], {len(self)} ids)"


def joined_utf8(ids, sep: str = "\n") -> bytes:
    """``sep.join(ids).encode()`` (UTF-8; a lone surrogate raises ``UnicodeEncodeError`` as ``str.encode`` does),
    from a ``PairIds``'s bytes without a string per id."""
    if isinstance(ids, PairIds):
        data = ids.joined(sep.encode())
        try:
            data.decode("utf-8")
            return data
        except UnicodeDecodeError:
            pass
    return sep.join(ids).encode()
