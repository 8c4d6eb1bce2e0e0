"""Data readers refuse what strict JSON has no meaning for (issue 36, finding 4 / Deliver 5): deeply nested JSON
(no RecursionError), non-finite numbers and duplicate keys, each with one line naming the file and the line
(JSON-Lines) or item (a JSON list) and the fix."""
from __future__ import annotations

import json

import pytest

from reward_lens_spec.data import load_pairs
from reward_lens_spec.data.files import MAX_DEPTH
from reward_lens_spec.errors import SpecError

GOOD = {"prompt": "q", "chosen": "yes", "rejected": "no"}


def _file(tmp_path, bad_line: str, name: str = "pairs.jsonl"):
    f = tmp_path / name
    f.write_text(json.dumps(GOOD) + "\n" + bad_line + "\n" + json.dumps({**GOOD, "prompt": "q2"}) + "\n")
    return f


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [100_000, 900, MAX_DEPTH + 1])
def test_deeply_nested_json_in_a_line_is_one_error_naming_the_file_and_line(tmp_path, depth):
    f = _file(tmp_path, '{"prompt": "q1", "chosen": "a", "rejected": "b", "extra": ' + _nested(depth - 1) + "}")
    with pytest.raises(SpecError, match=r"pairs\.jsonl line 2: nested deeper than") as e:
        load_pairs("jsonl", path=str(f))
    assert e.value.field == "dataset.path" and "\n" not in str(e.value)


def test_nesting_up_to_the_limit_is_read(tmp_path):
    f = _file(tmp_path, '{"prompt": "q1", "chosen": "a", "rejected": "b", "extra": ' + _nested(MAX_DEPTH - 1) + "}")
    pairs = load_pairs("jsonl", path=str(f))
    extra = json.loads(_nested(MAX_DEPTH - 1))                          # the independent reader's value
    assert len(pairs) == 3 and json.loads(pairs.pairs[1].meta_dict()["extra"]) == extra   # meta keeps it as JSON


def test_deeply_nested_json_in_a_json_list_is_one_error_naming_the_file(tmp_path):
    f = tmp_path / "pairs.json"
    f.write_text("[" + json.dumps(GOOD) + ", " + _nested(100_000) + "]")
    with pytest.raises(SpecError, match=r"pairs\.json: nested deeper than"):
        load_pairs("jsonl", path=str(f))
    f.write_text("[" + json.dumps(GOOD) + ', {"prompt": "q", "chosen": "a", "rejected": "b", "x": '
                 + _nested(MAX_DEPTH) + "}]")
    with pytest.raises(SpecError, match=r"pairs\.json item 1: nested deeper than"):
        load_pairs("jsonl", path=str(f))


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999", "-1E400"])
@pytest.mark.parametrize("where", ["agreement", "score"])
def test_non_finite_numbers_are_refused_with_the_line(tmp_path, literal, where):
    row = '{"prompt": "q1", "chosen": "a", "rejected": "b", "%s": %s}' % (where, literal)
    f = _file(tmp_path, row)
    with pytest.raises(SpecError, match=rf"pairs\.jsonl line 2: non-finite number {literal}") as e:
        load_pairs("jsonl", path=str(f))
    assert e.value.field == "dataset.path" and "Fix: write a finite number, or null" in str(e.value)
    f.write_text("[" + json.dumps(GOOD) + ", " + row + "]")
    json_file = f.rename(tmp_path / "pairs.json")
    with pytest.raises(SpecError, match=r"pairs\.json item 1: non-finite number"):
        load_pairs("jsonl", path=str(json_file))


def test_finite_numbers_are_read_as_the_standard_reader_reads_them(tmp_path):
    row = '{"prompt": "q1", "chosen": "a", "rejected": "b", "agreement": 0.75, "votes": [1, 0, 1], "w": -2.5e-3}'
    pairs = load_pairs("jsonl", path=str(_file(tmp_path, row)))
    meta = pairs.pairs[1].meta_dict()
    ref = json.loads(row)
    assert (meta["agreement"], json.loads(meta["votes"]), meta["w"]) == (ref["agreement"], ref["votes"], ref["w"])


@pytest.mark.parametrize("row", [
    '{"prompt": "q1", "chosen": "a", "chosen": "b", "rejected": "c"}',
    '{"prompt": "q1", "chosen": "a", "rejected": "c", "meta": {"group": 1, "group": 2}}',
])
def test_duplicate_keys_are_refused_with_the_line(tmp_path, row):
    with pytest.raises(SpecError, match=r"pairs\.jsonl line 2: key '(chosen|group)' appears twice") as e:
        load_pairs("jsonl", path=str(_file(tmp_path, row)))
    assert "Fix: give each key once" in str(e.value)


@pytest.mark.slow
def test_the_command_line_prints_one_line_for_a_hostile_data_line(tmp_path, monkeypatch, capsys):
    from reward_lens_spec.cli import main

    f = _file(tmp_path, '{"prompt": "q1", "chosen": "a", "rejected": "b", "x": ' + _nested(50_000) + "}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["validate", "observable=score", "dataset.kind=jsonl", f"dataset.path={f}"])
    err = capsys.readouterr().err
    assert "line 2: nested deeper than" in err and "Traceback" not in err and "RecursionError" not in err
