"""``PairIds``: a run's pair ids held as bytes read exactly as the list of ``str`` they replace (issue 40 item 5)."""
from __future__ import annotations

import gc
import hashlib
import pickle
import struct

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.arrays import str_index
from reward_lens_spec.data import Pair
from reward_lens_spec.models import pair_ids as pair_ids_module
from reward_lens_spec.models.formatting import EncodedPairs, encode_pairs
from reward_lens_spec.models.pair_ids import PairIds
from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer

IDS = ["q0", "bé", "", "\ud800x", "a\x00", "日本語", "z" * 300, "q0", "tail"]   # repeats, NUL-ended, lone surrogate


def test_reads_as_the_list_of_str(monkeypatch):
    monkeypatch.setattr(pair_ids_module, "READ_IDS", 3)         # iteration crosses its block boundary
    p = PairIds(IDS)
    assert len(p) == len(IDS) and list(p) == IDS and p == IDS and p == tuple(IDS) and IDS == list(p)
    assert [p[i] for i in range(len(IDS))] == IDS and p[-1] == "tail" and p[-len(IDS)] == "q0"
    for sl in (slice(1, 5), slice(None, None, 2), slice(5, 1), slice(-3, None), slice(None, None, -1), slice(0, 0)):
        assert list(p[sl]) == IDS[sl] and isinstance(p[sl], PairIds)
    assert p[2:7][1:3] == IDS[3:5]
    assert "日本語" in p and "nope" not in p and p.index("\ud800x") == 3 and p.count("q0") == 2
    assert bool(PairIds()) is False and bool(p) and list(PairIds()) == []
    with pytest.raises(IndexError):
        p[len(IDS)]
    for other in (IDS[:-1], IDS[:-1] + ["tai"], ["ab", "c"], IDS[::-1]):
        assert p != other
    assert PairIds(["ab", "c"]) != PairIds(["a", "bc"])          # the same bytes cut elsewhere
    assert p != "q0" and p != b"q0"


def test_join_and_pickle_keep_every_id():
    p = PairIds(IDS)
    for cut in range(len(IDS) + 1):
        assert PairIds.join([p[:cut], p[cut:]]) == p
    assert PairIds.join([]) == [] and PairIds.join([p[:2], ["x"]]) == IDS[:2] + ["x"]
    back = pickle.loads(pickle.dumps(p[1:4]))
    assert back == IDS[1:4] and back.raw()[1].tolist() == [0, 3, 3, 7]     # b"b\xc3\xa9", b"", b"\xed\xa0\x80x"


def test_holds_bytes_not_strings():
    p = PairIds(f"q{i}" for i in range(10_000))
    held = gc.get_referents(p)
    assert not any(isinstance(o, str) for o in held)
    data, off = p.raw()
    assert data == "".join(f"q{i}" for i in range(10_000)).encode() and off.dtype == np.int64
    assert len(data) + off.nbytes < 14 * 10_000                      # a list of str: ~60 bytes an id
    with pytest.raises(TypeError, match="pair id 1 is int"):
        PairIds(["a", 7])


def test_encoded_pairs_hold_them_and_the_digest_is_unchanged():
    ids = ["a", "bé", "c\x00"]
    enc = EncodedPairs(pair_ids=list(ids), chosen=[[1, 2], [3], [4]], rejected=[[5], [6, 7], [8]], excluded={},
                       n_truncated=0, bos_count=0, max_length=8, fmt="plain")
    assert isinstance(enc.pair_ids, PairIds) and enc.pair_ids == ids
    h = hashlib.sha256(b"reward_lens_spec.encoded.v1")               # the digest's definition, written out
    for pid, c, r in zip(ids, [[1, 2], [3], [4]], [[5], [6, 7], [8]]):
        for part in (pid.encode(), np.asarray(c, "<i8").tobytes(), np.asarray(r, "<i8").tobytes()):
            h.update(struct.pack("<Q", len(part)) + part)
    assert enc.digest() == h.hexdigest()


def test_encode_pairs_keeps_the_ids_in_order_slice_by_slice(monkeypatch):
    from reward_lens_spec.models import formatting
    monkeypatch.setattr(formatting, "ENCODE_SLICE", 6)               # slices of 3 pairs: ids joined across them
    pairs = [Pair(id=f"p{i}é" if i % 3 else f"p{i}", prompt=f"Q{i}", chosen=f"yes {i}", rejected=f"no {i}")
             for i in range(11)]
    enc = encode_pairs(build_tiny_tokenizer(), pairs, template="{prompt} {response}", max_length=64)
    assert isinstance(enc.pair_ids, PairIds) and list(enc.pair_ids) == [p.id for p in pairs]


def test_str_index_of_pair_ids_is_the_index_of_the_list():
    for ids in (IDS[:3] + IDS[5:7], ["x"], [], IDS):                   # IDS: a lone surrogate, then the list
        got = str_index(PairIds(ids))
        ref = xr.DataArray(np.arange(len(ids)), dims="pair", coords={"pair": list(ids)})
        new = xr.DataArray(np.arange(len(ids)), dims="pair", coords={"pair": got})
        assert list(new.indexes["pair"]) == list(ref.indexes["pair"])   # (a list's "a\x00" loses its NUL in numpy)
        assert list(new.indexes["pair"]) == list(ids) or "a\x00" in ids
        if len(set(ids)) == len(ids) and ids:
            xr.testing.assert_equal(new.sel(pair=ids[-1]), ref.sel(pair=ids[-1]))


def test_joined_is_the_ids_joined_as_str_join_makes_them():
    from reward_lens_spec.models.pair_ids import joined_utf8
    for ids in (IDS[:3] + IDS[4:], [], ["one"], ["", ""], ["", "x", ""], ["日本", "q\n"]):
        p = PairIds(ids)
        for sep in ("\n", "::", ""):
            naive = sep.encode().join(i.encode("utf-8") for i in ids)
            assert p.joined(sep.encode()) == naive and joined_utf8(p, sep) == joined_utf8(ids, sep) == naive
    assert PairIds(IDS).joined(b"\n") == b"\n".join(i.encode("utf-8", "surrogatepass") for i in IDS)
    with pytest.raises(UnicodeEncodeError):                       # as "\n".join(ids).encode() refuses it
        joined_utf8(PairIds(IDS))


def _naive_positions(all_ids, ids):
    """Greedy in-order matching written out: where each of ``ids`` sits among ``all_ids``, or None."""
    out, k = [], 0
    for i in ids:
        while k < len(all_ids) and all_ids[k] != i:
            k += 1
        if k == len(all_ids):
            return None
        out.append(k)
        k += 1
    return out


def test_positions_labels_and_flags_read_pair_ids_as_they_read_the_list():
    from types import SimpleNamespace as NS

    from reward_lens_spec.context import pair_labels, pair_positions
    from reward_lens_spec.data.accounting import accounting, pair_flags
    all_ids = ["a", "bé", "c", "", "d", "a2"]
    pairs = [Pair(id=i, prompt=f"P {i}", chosen="x", rejected="y", dimension=f"dim{len(i)}") for i in all_ids]
    for ids in (all_ids, all_ids[1::2], ["c"], [], ["c", "a"], ["zz"], all_ids + ["a"]):
        got = pair_positions(pairs, PairIds(ids))
        want = _naive_positions(all_ids, ids)
        assert (got is None and want is None) or got.tolist() == want
        assert (got is None) == (pair_positions(pairs, list(ids)) is None)
    kept = PairIds(["bé", "", "a2"])
    enc = NS(pair_ids=kept, prompt_truncated=["a2", "c"], response_truncated=[], excluded={}, kind_flags={})
    data = NS(flags={"empty_response": [""], "identical_sides": ["bé", "d"]})
    flags = pair_flags(data, enc, kept)
    assert {k: v.tolist() for k, v in flags.items()} == {"empty_response": [False, True, False],
                                                         "identical_sides": [True, False, False],
                                                         "prompt_truncated": [False, False, True],
                                                         "response_truncated": [False, False, False]}
    assert accounting(data, enc)["pair_flags"] == {"empty_response": [""], "identical_sides": ["bé"],
                                                   "prompt_truncated": ["a2"], "response_truncated": []}
    a, b = pair_labels(pairs, enc, kept), pair_labels(pairs, enc, list(kept))
    assert all((a.raw(k) == b.raw(k)).all() for k in ("pair", "dimension", "prompt_id"))
    assert a.raw("pair").tolist() == [b"b\xc3\xa9", b"", b"a2"] and a.raw("dimension").tolist() == [b"dim2", b"dim0", b"dim2"]


def test_prefixed_puts_each_head_before_its_row():
    from reward_lens_spec.byte_rows import prefixed
    rows = [b"abc", b"", b"\xc3\xa9", b"xyz!"]
    data = np.frombuffer(b"zzz" + b"".join(rows), np.uint8)             # rows start past 0, as a slice's do
    off = 3 + np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    for a, b in ((0, 4), (1, 3), (2, 2)):
        heads = np.arange(2 * (b - a), dtype=np.uint8).reshape(-1, 2) + 200
        naive = b"".join(bytes(h) + r for h, r in zip(heads, rows[a:b]))
        assert prefixed(data, off[a:b + 1], heads).tobytes() == naive


def test_a_files_ids_read_as_the_tuple_of_its_pairs_ids(tmp_path):
    import json

    from reward_lens_spec.data import load_pairs
    from reward_lens_spec.data.file_pairs import FileIds
    rows = [{"id": i, "prompt": f"P{k}", "chosen": "a", "rejected": "b"} for k, i in enumerate(["a", "bé", "日本", "z"])]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ps = load_pairs("jsonl", path=str(tmp_path / "p.jsonl"))
    ids, listed = ps.ids, tuple(p.id for p in ps)
    assert isinstance(ids, FileIds) and ids == listed and listed == ids and tuple(ids) == listed
    assert ids[-1] == "z" and ids[1:3] == listed[1:3] and "日本" in ids and len(ids) == 4
    assert ids != listed[:3] and ids != listed[::-1]
    with pytest.raises(IndexError):
        ids[4]
