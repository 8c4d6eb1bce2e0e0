"""What operators see while a plan runs: the model, the pairs, the capture and run counters."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from .data.accounting import pair_flags
from .errors import SpecError


@dataclass
class RunContext:
    lm: object
    pairs: object          # PairSet, filtered to the encoded pairs, same order
    encoded: object        # EncodedPairs
    capture: object        # CaptureResult
    info: object           # PlanInfo
    memo: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    coords: dict | None = None   # ``pair_coords()`` when already known (``run.stream``: the chunk's rows of the
                                 # run's, so a chunk costs its own pairs, not a pass over every pair of the run)
    stores: object = None  # store.stored_inputs.StoredInputs: stored inputs (``store:<url>#…``) read through it

    def stored(self, ref: str, *, lazy: bool, where: str):
        """The stored variable ``ref`` (``store:<url>#<run_id>/<observable>/<variable>``) as a DataArray, read
        through the stores the executor opened for this run (operators never open a store). Raises
        ``SpecError`` naming ``where`` when no executor gave this context its stores or ``ref`` is malformed,
        ``StoreError`` / ``KeyError`` for what is not stored."""
        if self.stores is None:
            raise SpecError(where, f"reads the stored variable '{ref}', but this context has no stores.",
                            fix="run the observable through the executor (reward-lens-spec or reward_lens_spec.run).")
        return self.stores.variable(ref, lazy=lazy, where=where)

    def pair_coords(self, idx=None):
        """``pair`` (ids) plus non-index coords ``dimension``, ``prompt_id`` (sha256[:12] of the prompt) and
        one bool coord per flag of ``data.pairs.PAIR_FLAGS`` and per kind flag of the encoding
        (``data.accounting.pair_flags``). ``idx``: positions among the encoded pairs (default: all, as a
        ``PairLabels``: the same mapping, held as fixed-width bytes)."""
        if self.coords is not None:
            return take_pairs(self.coords, slice(None) if idx is None else list(idx))
        ids = self.encoded.pair_ids                # (a PairIds: read in order below, not listed)
        if idx is not None:
            ids = [ids[i] for i in idx]
        labels = pair_labels(self.pairs, self.encoded, ids)
        return labels if idx is None else labels.take(slice(None))

    def add_counts(self, what: str, counts: dict) -> None:
        for k, v in counts.items():
            self.counts[f"{what}.{k}"] = self.counts.get(f"{what}.{k}", 0) + int(v)


def take_pairs(coords, idx) -> dict:
    """``pair_coords``-shaped ``coords`` (``pair``: ids; the rest ``("pair", values)``; or a ``PairLabels``) at
    positions ``idx`` (a slice or a list of positions) along ``pair``: new arrays, so a caller may keep or change
    them."""
    if isinstance(coords, PairLabels):
        return coords.take(idx)
    return {k: (np.array(v[idx]) if k == "pair" else (v[0], np.array(v[1][idx]))) for k, v in coords.items()}


class PairLabels(Mapping):
    """A run's pair labels (``RunContext.pair_coords``) held compactly: ids, dimensions and prompt ids as
    fixed-width UTF-8 bytes, flags as bools (about 40 bytes a pair of short ids, against ~140 as unicode arrays).
    It reads as the ``pair_coords`` dict — ``["pair"]`` the ids, ``[name]`` ``("pair", values)`` — each value a
    new unicode array of the run's width (so a chunk's labels, ``take``, are those the whole run would give)."""

    def __init__(self, text: dict, widths: dict, flags: dict):
        self._text, self._widths, self._flags = text, widths, flags

    def __iter__(self):
        return iter([*self._text, *self._flags])

    def __len__(self) -> int:
        return len(self._text) + len(self._flags)

    def __getitem__(self, name):
        return self._at(name, slice(None))

    def _at(self, name, idx):
        if name in self._flags:
            return ("pair", np.array(self._flags[name][idx]))
        raw = self._text[name][idx]
        values = np.char.decode(raw, "utf-8", "surrogatepass").astype(f"<U{self._widths[name]}") if raw.size else \
            np.zeros(0, dtype=f"<U{self._widths[name]}")
        return values if name == "pair" else ("pair", values)

    def raw(self, name) -> np.ndarray | None:
        """Text label ``name`` as held: fixed-width UTF-8 bytes (trailing NULs dropped), one row per pair; None
        for a flag."""
        return self._text.get(name)

    def take(self, idx) -> dict:
        """The labels at positions ``idx`` (a slice or a list of positions), as ``take_pairs`` gives them."""
        idx = idx if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        return {k: self._at(k, idx) for k in self}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in [*self._text.values(), *self._flags.values()])


BLOCK = 8192


def pair_labels(pairs, encoded, ids: Sequence[str]) -> PairLabels:
    """The labels of the pairs ``ids`` (in that order; see ``RunContext.pair_coords``), read in one ordered walk
    over ``pairs`` (a file's pairs are read once, never all held), else through a dict by id."""
    names = ("pair", "dimension", "prompt_id")
    cols = {k: [] for k in names}
    blocks = {k: [] for k in names}
    widths = dict.fromkeys(names, 1)

    def add(pid, p):
        for k, v in zip(names, (pid, p.dimension or "", hashlib.sha256(p.prompt.encode()).hexdigest()[:12])):
            widths[k] = max(widths[k], len(v))
            cols[k].append(v.encode("utf-8", "surrogatepass"))
        if len(cols["pair"]) >= BLOCK:
            flush()

    def flush():
        for k in names:
            blocks[k].append(np.array(cols[k], dtype=bytes) if cols[k] else np.zeros(0, "S1"))
            cols[k].clear()

    j, want = 0, iter(ids)
    nxt = next(want, None)
    for p in pairs:                               # ordered walk: ids are the pairs kept, in file order
        if j < len(ids) and p.id == nxt:
            add(nxt, p)
            j += 1
            nxt = next(want, None)
    if j < len(ids):                              # not in the pairs' order: by id
        for k in names:
            cols[k].clear()
            blocks[k].clear()
        widths = dict.fromkeys(names, 1)
        by_id = {p.id: p for p in pairs}
        for i in ids:
            add(i, by_id[i])
    flush()
    text = {k: np.concatenate(blocks[k]) for k in names}
    return PairLabels(text, widths, pair_flags(pairs, encoded, ids))


def pair_positions(pairs, ids) -> np.ndarray | None:
    """Where each of ``ids`` (the encoded pairs, in order) sits among ``pairs``: int64, dims ``pair``; ``None``
    when ``ids`` are not an ordered subsequence of the pairs' ids. Read from the ids alone (a file's pairs: no
    re-read)."""
    all_ids = pairs.ids if hasattr(pairs, "ids") else [p.id for p in pairs]   # (a file's: decoded as read)
    out, j, want = np.zeros(len(ids), np.int64), 0, iter(ids)        # ids read once, in order
    nxt = next(want, None)
    for k, pid in enumerate(all_ids):
        if j < len(ids) and pid == nxt:
            out[j] = k
            j += 1
            nxt = next(want, None)
    return out if j == len(ids) else None


def pairs_at(pairs, positions, sl):
    """``pairs`` cut to the chunk ``sl`` of the encoded pairs (``positions``: ``pair_positions``), so a chunk's
    operators read (and a file's pairs re-read) that chunk's pairs only; ``pairs`` whole when ``positions`` is
    None. A ``PairSet`` keeps its checksum, flags and shape."""
    if positions is None:
        return pairs
    idx = positions[sl]
    inner = getattr(pairs, "pairs", pairs)
    cut = inner.take(idx) if hasattr(inner, "take") else tuple(inner[int(i)] for i in idx)
    if hasattr(pairs, "checksum"):
        from dataclasses import replace
        return replace(pairs, pairs=cut)
    return list(cut)
