"""Tests of the data layer: schema, loaders, checksums, the diagnostic set, the shared real files."""
from __future__ import annotations

import gzip
import hashlib
import json
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from reward_lens_spec.data import (Pair, PairSet, dataset_checksum, effective_sample_size,
                                   load_pairs)
from reward_lens_spec.data.checksum import pair_hash
from reward_lens_spec.errors import SpecError

# The three real-pair files of the project's shared data, shipped gzipped in tests/data so that a clone has
# them; each is checked against the sha256 its source README gives for the uncompressed file.
SHIPPED = Path(__file__).resolve().parent / "data"
SHA256 = {"harmless": ("hh_rlhf_harmless_base_test.jsonl",
                       "5c43fe7aebde81c068af9250b42fdc343118a9b7df5814b5264834f6a76a4027"),
          "helpful": ("hh_rlhf_helpful_rewardbench_subset.jsonl",
                      "1f3b5caaef06d681b47d42fa5650680c03a3bc98bec4371263c35ca1472adc2e"),
          "llmbar": ("llmbar_rewardbench_subsets.jsonl",
                     "08ff8a3ca7fec0fac20e3909fa5e517f84a39347bc6144a06aecdb16ab08c407")}


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Path]:
    """The shipped files unpacked into a temporary folder, each one's sha256 checked: key -> path."""
    folder = tmp_path_factory.mktemp("shared_data")
    out = {}
    for key, (name, sha) in SHA256.items():
        raw = gzip.decompress((SHIPPED / f"{name}.gz").read_bytes())
        assert hashlib.sha256(raw).hexdigest() == sha, f"tests/data/{name}.gz is not the source file"
        (out_path := folder / name).write_bytes(raw)
        out[key] = out_path
    return out

DIMENSIONS = {"helpfulness", "harmlessness", "verbosity", "sycophancy", "formatting", "confidence",
              "factual_correctness", "refusal_quality", "instruction_following", "code_correctness",
              "math_correctness", "evidence_use", "contested"}


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def row(i, **kw):
    base = {"id": f"p{i}", "prompt": f"prompt {i}", "chosen": f"good {i}", "rejected": f"bad {i}"}
    base.update(kw)
    return base


# ----------------------------------------------------------------------------- diagnostic

def test_diagnostic_loads_complete():
    ps = load_pairs("diagnostic")
    assert isinstance(ps, PairSet) and ps.name == "diagnostic"
    counts = Counter(p.dimension for p in ps)
    assert set(counts) >= DIMENSIONS and len(counts) >= 13
    assert all(n >= 6 for n in counts.values()), counts
    assert len(ps) == 91
    for p in ps:
        for name in ("id", "prompt", "chosen", "rejected", "dimension", "rubric", "source"):
            assert getattr(p, name).strip(), (p.id, name)
        assert p.chosen != p.rejected
        assert p.id == p.id.strip() and p.id.startswith(f"diag-{p.dimension}-")
        assert len(p.prompt) <= 300 and len(p.chosen) <= 400 and len(p.rejected) <= 400
        assert p.prompt_rejected is None
    assert len(set(ps.ids)) == len(ps)
    assert ps.flags["identical_sides"] == [] and ps.flags["empty_response"] == []
    assert ps.n_unique == 91 and ps.checksum == dataset_checksum(ps.pairs)


def test_diagnostic_dimensions_and_limit():
    ps = load_pairs("diagnostic", dimensions=["sycophancy", "evidence_use"], limit=9)
    assert len(ps) == 9
    assert [p.dimension for p in ps] == ["sycophancy"] * 7 + ["evidence_use"] * 2
    assert load_pairs("diagnostic", dimensions="contested").dimensions == ("contested",)
    with pytest.raises(SpecError, match=r"dataset\.dimensions.*Did you mean 'sycophancy'"):
        load_pairs("diagnostic", dimensions=["sycophantic"])


def test_diagnostic_refuses_path_and_fields(tmp_path):
    with pytest.raises(SpecError, match=r"dataset\.path"):
        load_pairs("diagnostic", path=str(tmp_path / "x.jsonl"))
    with pytest.raises(SpecError, match=r"dataset\.fields"):
        load_pairs("diagnostic", fields={"prompt": "input"})


# ----------------------------------------------------------------------------- checksum

def test_checksum_order_and_id_independent_and_sensitive():
    pairs = list(load_pairs("diagnostic", limit=20))
    ref = dataset_checksum(pairs)
    assert len(ref) == 64 and int(ref, 16) >= 0
    assert dataset_checksum(list(reversed(pairs))) == ref
    renamed = [replace(p, id=f"other-{i}", rubric="x", source="y") for i, p in enumerate(pairs)]
    assert dataset_checksum(renamed) == ref
    for field_name in ("prompt", "chosen", "rejected", "dimension"):
        changed = list(pairs)
        value = getattr(changed[3], field_name)
        changed[3] = replace(changed[3], **{field_name: value[:-1] + chr(ord(value[-1]) ^ 1)})
        assert dataset_checksum(changed) != ref, field_name
    changed = list(pairs)
    changed[0] = replace(changed[0], prompt_rejected=changed[0].prompt + "!")
    assert dataset_checksum(changed) != ref
    # prompt_rejected equal to prompt counts as absent
    changed[0] = replace(changed[0], prompt_rejected=changed[0].prompt)
    assert dataset_checksum(changed) == ref
    # multiset: a duplicate changes it
    assert dataset_checksum(pairs + pairs[:1]) != ref


def test_checksum_keeps_unicode_form_and_line_endings():
    # the model sees NFC and NFD, CRLF and LF as different tokens, so the checksum must differ
    nfc_crlf = Pair(id="a", prompt="caf\u00e9\r\nline", chosen="x", rejected="y")
    nfd_crlf = Pair(id="a", prompt="cafe\u0301\r\nline", chosen="x", rejected="y")
    nfc_lf = Pair(id="a", prompt="caf\u00e9\nline", chosen="x", rejected="y")
    sums = {dataset_checksum([p]) for p in (nfc_crlf, nfd_crlf, nfc_lf)}
    assert len(sums) == 3
    # counting independent comparisons still treats them as one text
    assert effective_sample_size([nfc_crlf, nfd_crlf, nfc_lf])["n_unique"] == 1


def test_effective_sample_size():
    ps = [Pair("1", "Hello  world", "a", "b"), Pair("2", "hello world", "a", "b"),
          Pair("3", "Hello  world", "a", "b"), Pair("4", "Other", "a", "c")]
    assert effective_sample_size(ps) == {"n": 4, "n_unique": 3, "n_prompt_clusters": 2}
    assert effective_sample_size([]) == {"n": 0, "n_unique": 0, "n_prompt_clusters": 0}


# ----------------------------------------------------------------------------- jsonl

def test_jsonl_field_mapping_and_meta(tmp_path):
    rows = [{"input": f"q{i}", "output_good": f"g{i}", "output_bad": f"b{i}", "subset": "s1" if i < 2 else "s2",
             "score": i, "tags": ["x", i]} for i in range(4)]
    f = write_jsonl(tmp_path / "mine.jsonl", rows)
    fields = {"prompt": "input", "chosen": "output_good", "rejected": "output_bad", "dimension": "subset"}
    ps = load_pairs("jsonl", path=str(f), fields=fields)
    assert ps.name == "mine" and len(ps) == 4
    content_ids = tuple("pair-" + pair_hash(p)[:16] for p in ps)   # no id key: ids from content
    assert ps.ids == content_ids and len(set(content_ids)) == 4
    p = ps[2]
    assert (p.prompt, p.chosen, p.rejected, p.dimension) == ("q2", "g2", "b2", "s2")
    assert p.source == "mine.jsonl"
    assert p.meta == (("score", 2), ("tags", '["x", 2]'))
    assert p.meta_dict()["score"] == 2
    hash(p)  # frozen and hashable, even with list-valued extra keys
    assert load_pairs("jsonl", path=str(f), fields=fields, dimensions=["s2"]).ids == content_ids[2:]


def test_json_list_file_and_relative_path(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    f = tmp_path / "sub" / "pairs.json"
    f.write_text(json.dumps([row(1), row(2), row(3)]), encoding="utf-8")
    ps = load_pairs("jsonl", path="sub/pairs.json", base_dir=str(tmp_path), limit=2)
    assert ps.ids == ("p1", "p2") and ps.name == "pairs"
    monkeypatch.chdir(tmp_path / "sub")
    assert len(load_pairs("jsonl", path="pairs.json")) == 3


def test_jsonl_line_separators_inside_strings(tmp_path):
    f = tmp_path / "u.jsonl"
    rows = [row(1, chosen="a\u2028b\x85c\u2029d"), row(2)]
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows), encoding="utf-8")
    ps = load_pairs("jsonl", path=str(f))
    assert ps.ids == ("p1", "p2") and ps[0].chosen == "a\u2028b\x85c\u2029d"


def test_flags_identical_and_empty_kept(tmp_path):
    rows = [row(1), row(2, rejected="good 2"), row(3, chosen="   "), row(4, rejected="")]
    ps = load_pairs("jsonl", path=str(write_jsonl(tmp_path / "f.jsonl", rows)))
    assert ps.ids == ("p1", "p2", "p3", "p4")
    assert ps.flags["identical_sides"] == ["p2"]
    assert ps.flags["empty_response"] == ["p3", "p4"]
    assert ps.flags["prompt_mismatch"] == []


def test_prompt_mismatch_excluded_with_warning(tmp_path):
    rows = [row(1), row(2, prompt_rejected="other prompt"), row(3, prompt_rejected="prompt 3"),
            row(4, prompt_rejected=None)]
    f = write_jsonl(tmp_path / "f.jsonl", rows)
    with pytest.warns(UserWarning, match="excluded 1 pair"):
        ps = load_pairs("jsonl", path=str(f))
    assert ps.ids == ("p1", "p3", "p4")
    assert ps.flags["prompt_mismatch"] == ["p2"]
    assert all(p.prompt_rejected is None for p in ps)
    # limit applies after the exclusion
    with pytest.warns(UserWarning):
        assert load_pairs("jsonl", path=str(f), limit=2).ids == ("p1", "p3")


# ----------------------------------------------------------------------------- bad input

def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match=r"dataset\.path.*does not exist") as e:
        load_pairs("jsonl", path="nope.jsonl", base_dir=str(tmp_path))
    assert str(tmp_path / "nope.jsonl") in str(e.value) and e.value.field == "dataset.path"
    with pytest.raises(SpecError, match=r"dataset\.path.*needs a file path"):
        load_pairs("hh_rlhf")


def test_missing_mapped_field_names_key_line_and_fix(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [row(1), {"id": "p2", "input": "q", "chosen": "a", "rejected": "b"}])
    with pytest.raises(SpecError) as e:
        load_pairs("jsonl", path=str(f))
    msg = str(e.value)
    assert e.value.field == "dataset.fields.prompt"
    assert "'prompt'" in msg and "line 2" in msg and "dataset.fields.prompt=<key>" in msg
    # an optional field that the user mapped explicitly is required
    with pytest.raises(SpecError, match=r"dataset\.fields\.dimension.*line 1.*'subset'"):
        load_pairs("jsonl", path=str(f), fields={"dimension": "subset"})


def test_malformed_json_names_line(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [row(1), "", '{"id": "p2", "prompt": "x",', row(3)])
    with pytest.raises(SpecError, match=r"dataset\.path.*line 3: malformed JSON"):
        load_pairs("jsonl", path=str(f))
    g = tmp_path / "g.json"
    g.write_text('[\n{"id": "a"},\n{oops}\n]', encoding="utf-8")
    with pytest.raises(SpecError, match=r"line 3: malformed JSON"):
        load_pairs("jsonl", path=str(g))


def test_non_string_values(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [row(1), row(2, chosen=["a", "b"])])
    with pytest.raises(SpecError, match=r"dataset\.fields\.chosen.*line 2.*must be a string"):
        load_pairs("jsonl", path=str(f))
    f = write_jsonl(tmp_path / "g.jsonl", [row(1, id=7)])
    with pytest.raises(SpecError, match=r"dataset\.fields\.id.*line 1"):
        load_pairs("jsonl", path=str(f))
    f = write_jsonl(tmp_path / "h.jsonl", [row(1), "[1, 2]"])
    with pytest.raises(SpecError, match=r"line 2: expected a JSON object"):
        load_pairs("jsonl", path=str(f))


def test_unknown_kind_did_you_mean():
    with pytest.raises(SpecError, match=r"dataset\.kind.*Did you mean 'hh_rlhf'") as e:
        load_pairs("hh-rlhf")
    assert e.value.field == "dataset.kind"
    from reward_lens_spec.spec import DatasetKind  # the config enum is accepted as is
    assert len(load_pairs(DatasetKind.diagnostic, limit=3)) == 3


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_bad_limit(limit):
    with pytest.raises(SpecError, match=r"dataset\.limit"):
        load_pairs("diagnostic", limit=limit)


def test_duplicate_ids_and_bad_fields(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [row(1), row(2), row(1)])
    with pytest.raises(SpecError, match=r"dataset\.fields\.id.*duplicate id 'p1'.*line 1 and line 3"):
        load_pairs("jsonl", path=str(f))
    f = write_jsonl(tmp_path / "g.jsonl", [row(1)])
    with pytest.raises(SpecError, match=r"dataset\.fields\.promt.*Did you mean 'prompt'"):
        load_pairs("jsonl", path=str(f), fields={"promt": "input"})
    with pytest.raises(SpecError, match=r"dataset\.dimensions"):
        load_pairs("jsonl", path=str(f), dimensions=["nope"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"dataset\.path.*no pairs"):
        load_pairs("jsonl", path=str(empty))


# ----------------------------------------------------------------------------- hh_rlhf raw

def test_raw_anthropic_transcripts_split(tmp_path):
    t_prompt = "\n\nHuman: Hi there.\n\nAssistant: Hello!\n\nHuman: What is 2+2?\n\nAssistant:"
    rows = [{"chosen": t_prompt + " It is 4.", "rejected": t_prompt + " It is 5."},
            {"chosen": "\n\nHuman: A\n\nAssistant: B", "rejected": "\n\nHuman: A\n\nAssistant: B"},
            {"chosen": "\n\nHuman: X\n\nAssistant: Y Human: Z\n\nAssistant: W",
             "rejected": "\n\nHuman: X\n\nAssistant: V"}]
    f = tmp_path / "test.jsonl.gz"
    f.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")))
    with pytest.warns(UserWarning, match="excluded 1"):
        ps = load_pairs("hh_rlhf", path=str(f))
    assert ps.ids == tuple("pair-" + pair_hash(p)[:16] for p in ps)
    p = ps[0]
    assert p.prompt.endswith("\n\nAssistant:") and p.chosen == " It is 4." and p.rejected == " It is 5."
    for pair, r in zip(ps, rows):
        assert pair.prompt + pair.chosen == r["chosen"]
        assert pair.prompt + pair.rejected == r["rejected"]
    assert ps.flags["identical_sides"] == [ps.ids[1]]
    assert len(ps.flags["prompt_mismatch"]) == 1 and ps.flags["prompt_mismatch"][0].startswith("pair-")
    assert ps[1].meta_dict()["source_line"] == 1
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"chosen": "no tags here", "rejected": "x"}])
    with pytest.raises(SpecError, match=r"dataset\.fields\.chosen.*line 1"):
        load_pairs("hh_rlhf", path=str(bad))


# ----------------------------------------------------------------------------- shared real files

def test_shared_harmless(shared):
    with pytest.warns(UserWarning, match="excluded 5 pair"):
        ps = load_pairs("hh_rlhf", path=str(shared["harmless"]))
    excluded = ["hh-harmless-test-01254", "hh-harmless-test-01688", "hh-harmless-test-01950",
                "hh-harmless-test-01952", "hh-harmless-test-02036"]
    assert len(ps) == 2312 - 5
    assert ps.flags["prompt_mismatch"] == excluded
    assert not set(excluded) & set(ps.ids)
    assert ps.flags["empty_response"] == ["hh-harmless-test-00086", "hh-harmless-test-00516",
                                          "hh-harmless-test-00925", "hh-harmless-test-01103"]
    assert ps.flags["identical_sides"] == []
    assert ps.dimensions == ("harmless",)
    assert ps[0].meta_dict()["attribute"] == "harmless" and "source_line" in ps[0].meta_dict()
    assert ps.n_prompt_clusters <= ps.n_unique <= len(ps)


def test_shared_helpful_identical_flagged(shared):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ps = load_pairs("hh_rlhf", path=str(shared["helpful"]))
    assert len(ps) == 1137 and ps.dimensions == ("helpful",)
    ident = [f"hh-helpful-rb-{i:05d}" for i in (45, 87, 184, 185, 259, 326, 668, 771, 1054, 1061,
                                                1070, 1072, 1103)]
    assert ps.flags["identical_sides"] == ident
    for pid in ident:
        p = ps.by_id(pid)
        assert p.chosen == p.rejected
    assert ps.flags["prompt_mismatch"] == []


def test_shared_llmbar(shared):
    ps = load_pairs("jsonl", path=str(shared["llmbar"]), fields={"dimension": "subset"})
    assert len(ps) == 885
    assert ps.flags["identical_sides"] == ["llmbar-Processed-LLMEval2-057"]
    assert ps.flags["empty_response"] == ["llmbar-Processed-LLMEval2-169"]
    assert Counter(p.dimension for p in ps)["LLMBar/Natural"] == 100
    assert load_pairs("jsonl", path=str(shared["llmbar"]), fields={"dimension": "subset"},
                      dimensions=["Processed/MT-Bench"]).__len__() == 200


def test_shared_raw_format_matches_converted(shared, tmp_path):
    """Rebuild raw Anthropic transcripts from the converted harmless file and split them back."""
    rows = [json.loads(line) for line in shared["harmless"].read_text(encoding="utf-8").splitlines()[:300]]
    raw = [{"chosen": r["prompt"] + r["chosen"], "attribute": "harmless",
            "rejected": (r["prompt_rejected"] or r["prompt"]) + r["rejected"]} for r in rows]
    f = write_jsonl(tmp_path / "harmless_raw.jsonl", raw)
    ps = load_pairs("hh_rlhf", path=str(f))
    assert len(ps) == 300
    for pair, src, r in zip(ps, rows, raw):
        assert pair.prompt + pair.chosen == r["chosen"]
        assert (pair.prompt, pair.chosen, pair.rejected) == (src["prompt"], src["chosen"], src["rejected"])
    # content checksum ignores ids and provenance: same as the converted file's first 300 pairs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_pairs("hh_rlhf", path=str(shared["harmless"]), limit=300).checksum == ps.checksum
