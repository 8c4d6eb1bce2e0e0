"""``TokenRows``: a tokenized dataset stored flat reads exactly as the list of lists it replaces."""
from __future__ import annotations

import hashlib
import pickle
import struct

import numpy as np
import pytest

from reward_lens_spec.models.formatting import EncodedPairs, encode_pairs
from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer
from reward_lens_spec.models.token_rows import TokenRows
from reward_lens_spec.run.stream import subset

ROWS = [[1, 5, 9], [], [70000, 2], [3], [0, 0, 0, 0]]


def test_reads_as_the_list_of_lists():
    t = TokenRows(ROWS)
    assert len(t) == 5 and list(t) == ROWS and t == ROWS and ROWS == list(t)
    assert [t[i] for i in range(5)] == ROWS and t[-1] == ROWS[-1] and isinstance(t[0], list)
    assert t[1:4] == ROWS[1:4] and isinstance(t[1:4], TokenRows) and t[::2] == ROWS[::2]
    assert t[3:1] == [] and t[1:4][1:] == ROWS[2:4]
    assert t.lengths().tolist() == [len(r) for r in ROWS]
    assert t != ROWS[:4] and t != [r + [1] for r in ROWS] and TokenRows(ROWS[::-1]) != t
    assert t + t[:2] == ROWS + ROWS[:2] and ROWS[:1] + t == ROWS[:1] + ROWS and isinstance(t + t, list)
    with pytest.raises(IndexError):
        t[5]
    assert t.nbytes == 4 * sum(map(len, ROWS)) + 8 * 6


def test_a_slice_is_a_view_and_pickles_alone():
    t = TokenRows([[i] * 100 for i in range(50)])
    view = t[10:12]
    assert np.shares_memory(view._flat, t._flat)                 # no copy of the dataset per chunk
    back = pickle.loads(pickle.dumps(view))
    assert back == [[10] * 100, [11] * 100] and back._flat.size == 200 and back._off.tolist() == [0, 100, 200]


def test_concat_and_bad_ids():
    assert TokenRows.concat([TokenRows(ROWS[:2]), TokenRows(ROWS[2:])[0:3]]) == ROWS
    assert TokenRows.concat([]) == [] and len(TokenRows()) == 0
    with pytest.raises(ValueError, match="token ids"):
        TokenRows([[1, -1]])
    with pytest.raises(ValueError, match="token ids"):
        TokenRows([[2 ** 31]])


def test_encoded_pairs_store_flat_with_the_same_digest():
    """The digest (what a run id covers) is unchanged by the storage: recomputed here by hand from lists."""
    chosen, rejected = [[1, 2, 3], [4, 5]], [[1, 9], [4, 5, 6, 7]]
    enc = EncodedPairs(pair_ids=["a", "b"], chosen=chosen, rejected=rejected, excluded={}, n_truncated=0,
                       bos_count=0, max_length=8, fmt="plain")
    assert isinstance(enc.chosen, TokenRows) and enc.chosen == chosen and enc.rejected == rejected
    h = hashlib.sha256(b"reward_lens_spec.encoded.v1")
    for pid, c, r in zip(["a", "b"], chosen, rejected):
        for part in (pid.encode(), np.asarray(c, "<i8").tobytes(), np.asarray(r, "<i8").tobytes()):
            h.update(struct.pack("<Q", len(part)) + part)
    assert enc.digest() == h.hexdigest()
    assert enc.lengths().tolist() == [[3, 2], [2, 4]]
    part = subset(enc, slice(1, 2))
    assert part.chosen == [[4, 5]] and part.rejected == [[4, 5, 6, 7]] and part.pair_ids == ["b"]


class _P:
    def __init__(self, i):
        self.id, self.prompt, self.chosen, self.rejected = f"p{i}", f"q{i % 13}", "x" * (i % 7 + 1), f"n{i}"
        self.prompt_rejected = None


def test_many_pairs_encode_in_slices_as_one_call_per_text(monkeypatch):
    """Across slice boundaries (slices of 3 pairs here), every side is what the tokenizer gives for its text
    alone, truncation included (max_length 6 cuts most sides: BOS kept, the end kept)."""
    import reward_lens_spec.models.formatting as fmt

    monkeypatch.setattr(fmt, "ENCODE_SLICE", 6)
    tok = build_tiny_tokenizer()
    pairs = [_P(i) for i in range(20)]
    enc = encode_pairs(tok, pairs, template="{prompt}|{response}", max_length=6, truncated_responses="keep")
    want = {p.id: [tok(f"{p.prompt}|{s}")["input_ids"] for s in (p.chosen, p.rejected)] for p in pairs}
    cut = {k: [ids if len(ids) <= 6 else ids[:1] + ids[len(ids) - 5:] for ids in v] for k, v in want.items()}
    assert enc.pair_ids == [p.id for p in pairs if cut[p.id][0] != cut[p.id][1] or want[p.id][0] == want[p.id][1]]
    for pid, c, r in zip(enc.pair_ids, enc.chosen, enc.rejected):
        assert [c, r] == cut[pid]


def test_spilled_rows_read_as_the_rows_in_memory():
    """``spilled()``: every access gives what the in-memory rows give; a chunk comes back in memory."""
    import reward_lens_spec.models.token_rows as tr

    rows = [[(7 * i + j) % 70001 for j in range(i % 5)] for i in range(40)]
    t = TokenRows(rows)
    s = t[3:].spilled()
    assert s == rows[3:] and list(s) == rows[3:] and len(s) == 37 and s.lengths().tolist() == t[3:].lengths().tolist()
    assert [s[i] for i in range(37)] == rows[3:] and s[-1] == rows[-1] and s[::3] == rows[3::3]
    chunk = s[5:9]
    assert chunk == rows[8:12] and isinstance(chunk._flat, np.ndarray) and chunk._off[0] == 0
    assert pickle.loads(pickle.dumps(s)) == rows[3:] and TokenRows.concat([s[:2], s[2:]]) == rows[3:]
    assert s.nbytes == 8 * 38 and s == t[3:] and t[3:] == s
    small = tr.READ_ROWS
    try:
        tr.READ_ROWS = 4                     # iteration across read blocks
        assert list(s) == rows[3:]
    finally:
        tr.READ_ROWS = small


def test_a_run_holds_its_token_ids_in_a_file_above_the_spill_size(monkeypatch):
    """``encode_pairs`` above ``SPILL_BYTES``: the same rows and digest, and the encoding's traced bytes (ids and
    offsets; tracemalloc) grow by no token bytes: at most ``PER_PAIR`` a pair (measured 35; in memory 184)."""
    import tracemalloc

    import reward_lens_spec.models.token_rows as tr

    tok = build_tiny_tokenizer()
    pairs = [_P(i) for i in range(3000)]
    template = "User: {prompt}\nAssistant: {response}"
    kept = encode_pairs(tok, pairs, template=template)
    assert isinstance(kept.chosen._flat, np.ndarray)                       # under the spill size: in memory
    monkeypatch.setattr(tr, "SPILL_BYTES", 0)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    enc = encode_pairs(tok, pairs, template=template)
    held = (tracemalloc.get_traced_memory()[0] - before) / len(pairs)
    tracemalloc.stop()
    assert enc.chosen == kept.chosen and enc.rejected == kept.rejected and enc.digest() == kept.digest()
    assert enc.chosen.nbytes + enc.rejected.nbytes == 16 * len(pairs) + 16
    assert kept.chosen.nbytes + kept.rejected.nbytes > 80 * len(pairs)       # the token bytes now in the file
    assert held <= PER_PAIR, held


PER_PAIR = 60


@pytest.mark.parametrize("spill", [None, 0, 20, 60])
def test_rows_built_part_by_part_are_the_joined_parts_and_a_wider_part_widens_the_file(spill):
    """``RowsBuilder``: the rows of every part in order, whether they stay in memory (no spill size reached) or
    go to the file part by part, where an ``int32`` part after ``uint16`` ones (ids past 65,535) rewrites the
    file wider and every earlier id keeps its value. Past the spill size no part is held in memory."""
    from reward_lens_spec.models.token_rows import RowsBuilder, _FileTokens

    parts = [[[(11 * i + j) % 300 for j in range(i % 4)] for i in range(k, k + 5)] for k in range(0, 30, 5)]
    parts[3] = [[70000 + i, 5] for i in range(5)]                       # the fourth part needs int32
    b = RowsBuilder(10 ** 9 if spill is None else spill)
    for p in parts:
        b.append(TokenRows(p))
    rows = b.rows()
    everything = [r for p in parts for r in p]
    assert rows == everything and list(rows) == everything and rows.lengths().tolist() == [len(r) for r in everything]
    assert isinstance(rows._flat, _FileTokens) == (spill is not None)
    if spill is not None:
        assert b._parts == [] and rows._flat.dtype == np.int32 and rows[15:20] == everything[15:20]
        assert rows.nbytes == 8 * (len(everything) + 1)                 # only the offsets in memory
