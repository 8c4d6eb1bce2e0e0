"""Pairs left in their file (issue 40 item 5, ``data.file_pairs``): a plain JSON-Lines file is read once for
everything the run records, its pairs re-read (and checked against their bytes) where they are needed.

- The streamed read gives what the in-memory read of the same bytes gives (a ``.jsonl.gz`` of them is read in
  memory): ids, checksum, flags, sizes, warnings, pairs; the checksum and sizes also against a naive recomputation.
- A line edited after the first pass is refused on re-read, in one line naming the file — also mid-run, on the
  command line.
- The per-pair state a run holds grows by at most ``GROWTH_BYTES`` Python-traced bytes per added pair from
  N to 4N pairs (``tracemalloc``; bytes, never time). main before this change held ~790 B per added pair.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
import warnings
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from reward_lens_spec.data import dataset_checksum, effective_sample_size, load_pairs
from reward_lens_spec.data.checksum import checksum_of_digests
from reward_lens_spec.data.file_pairs import FilePairs
from reward_lens_spec.errors import SpecError
from tests.numbered_pairs import held_by_a_run

GROWTH_BYTES = 400     # measured 2026-12-04: ~290 B per added pair (token ids ~170, ids ~60, file index ~37, labels ~22)


def _rows(n, seed=0):
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        r = {"prompt": rnd.choice(["Q1", "q1 ", "Q2", "caf\u00e9", "cafe\u0301"]), "chosen": rnd.choice(["a", "b", "", " "]),
             "rejected": rnd.choice(["a", "c"]), "dimension": rnd.choice(["x", "y", ""]), "extra": [1, i % 3]}
        if rnd.random() < 0.3:
            r["id"] = f"id{i}"
        if rnd.random() < 0.05:
            r["prompt_rejected"] = "other"
        rows.append(r)
    return rows


def _text(rows):
    return "\ufeff" + "\n".join(json.dumps(r, ensure_ascii=bool(i % 2)) for i, r in enumerate(rows)) + "\n\n"


def _load(path, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ps = load_pairs("jsonl", path=str(path), **kw)
    return ps, [str(x.message) for x in w]


@pytest.mark.parametrize("kw", [{}, {"limit": 100}, {"dimensions": ["x"]}])
def test_a_file_read_once_gives_what_reading_it_whole_gives(tmp_path, kw):
    text = _text(_rows(600))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "d.jsonl").write_text(text, encoding="utf-8")
    (tmp_path / "b" / "d.jsonl.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    a, wa = _load(tmp_path / "a" / "d.jsonl", **kw)
    b, wb = _load(tmp_path / "b" / "d.jsonl.gz", **kw)
    assert isinstance(a.pairs, FilePairs) and isinstance(b.pairs, tuple)
    assert (a.checksum, a.flags, a.n_unique, a.n_prompt_clusters, a.ids, a.shape) == \
        (b.checksum, b.flags, b.n_unique, b.n_prompt_clusters, b.ids, b.shape)
    assert [w.replace(".jsonl.gz", ".jsonl") for w in wb] == wa
    assert [replace(p, source="") for p in a] == [replace(p, source="") for p in b]      # source: the file name
    assert a.source_file == {"name": "d.jsonl", "bytes": len(text.encode()), **{"sha256": a.source_file["sha256"]}}
    listed = list(a)                                   # naive recomputation from the pairs re-read
    assert a.checksum == dataset_checksum(listed)
    ess = effective_sample_size(listed)
    assert (a.n_unique, a.n_prompt_clusters) == (ess["n_unique"], ess["n_prompt_clusters"])
    assert a.pairs[3:7] == tuple(listed[3:7]) and a.pairs[-1] == listed[-1] and a.ids == tuple(p.id for p in listed)
    assert len({p.id for p in listed}) == len(listed)


def test_repeated_content_gets_numbered_ids_and_a_duplicate_id_names_both_lines(tmp_path):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}] * 3 + [{"prompt": "q", "chosen": "a", "rejected": "b"}]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ids = load_pairs("jsonl", path=str(path)).ids
    assert ids[1] == ids[0] + "-2" and ids[2] == ids[0] + "-3" and not ids[3].endswith(("-2", "-3"))
    path.write_text("\n".join(json.dumps({"id": i, "prompt": "p", "chosen": "a", "rejected": "b"})
                              for i in ("u", "v", "w", "v", "u")) + "\n")
    with pytest.raises(SpecError, match=r"duplicate id 'v' .*\(line 2 and line 4\)"):
        load_pairs("jsonl", path=str(path))


def test_a_line_edited_after_the_first_pass_is_refused_on_reread(tmp_path):
    from reward_lens_spec.inputs import encode
    from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer

    path = tmp_path / "e.jsonl"
    path.write_text(_text(_rows(50)), encoding="utf-8")
    ps = load_pairs("jsonl", path=str(path))
    first = ps.pairs[10]
    record = int(ps.pairs.index[19])                         # the file's record (line) of the 20th kept pair
    lines = path.read_text(encoding="utf-8").split("\n")
    head, _, tail = lines[record].rpartition('"extra": [1, ')
    lines[record] = head + '"extra": [1, 9' + tail[1:]        # meta only, same length: only the digest can tell
    path.write_text("\n".join(lines), encoding="utf-8")
    assert ps.pairs[10] == first                             # untouched lines still read
    with pytest.raises(SpecError, match=rf"changed while the run read it: record {record + 1} "):
        ps.pairs[19]
    with pytest.raises(SpecError, match="changed while the run read it"):
        encode(SimpleNamespace(tokenizer=build_tiny_tokenizer(), name="tiny"), ps)


def test_a_file_edited_mid_run_stops_the_command_line_in_one_line(tmp_path, monkeypatch, capsys):
    from reward_lens_spec import inputs
    from reward_lens_spec.cli import main

    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": f"Q{i}", "chosen": "yes", "rejected": "no"})
                              for i in range(6)) + "\n")
    load_lm = inputs.load_lm

    def edit_then_load(*a, **k):                # after the identity pass, before the token ids are read
        path.write_text(path.read_text().replace('"Q3"', '"Q9"'))
        return load_lm(*a, **k)
    monkeypatch.setattr(inputs, "load_lm", edit_then_load)
    with pytest.raises(SystemExit):
        main(["observable=score", "model=tiny", "model.threads=1", "dataset=jsonl", f"dataset.path={path}",
              f"store.url={tmp_path / 's.zarr'}"])
    err = capsys.readouterr().err
    assert "dataset.path" in err and "changed while the run read it: record 4 " in err
    assert not list((tmp_path / "s.zarr").glob("runs/*/*")) if (tmp_path / "s.zarr").exists() else True




@pytest.mark.parametrize("n", [0, 1, 6, 7, 8, 23])
def test_the_checksum_hashed_a_block_at_a_time_is_the_one_of_the_whole_text(n):
    """``checksum_of_digests`` in blocks of 7 lines against the definition written out: sha256 of the sorted
    lowercase hex digests joined by newlines. Digests ending in zero bytes (which ``S32`` elements drop on
    access) and repeats included; block edges at 0, 1, 7, 8 and more lines."""
    rnd = random.Random(n)
    digests = [bytes(rnd.randrange(256) for _ in range(32)) for _ in range(n)]
    if n > 2:
        digests[1] = digests[1][:29] + b"\0\0\0"
        digests[2] = digests[0]
    naive = hashlib.sha256("\n".join(sorted(d.hex() for d in digests)).encode("ascii")).hexdigest()
    assert checksum_of_digests(np.array(digests, dtype="S32") if digests else np.zeros(0, "S32"), block=7) == naive


def test_the_state_a_run_holds_grows_by_a_bounded_number_of_bytes_per_pair(tmp_path):
    def held(n):
        return held_by_a_run(tmp_path, n)

    n = 512
    small = held(n)
    large = held(4 * n)
    per_pair = (large - small) / (3 * n)
    assert per_pair <= GROWTH_BYTES, f"{per_pair:.0f} B per added pair, over {GROWTH_BYTES}"
