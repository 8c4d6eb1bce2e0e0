"""Issue 30: what a new user hits first (compare on DLA runs, mistyped commands, bad input, validate)."""
from __future__ import annotations

import pytest

from reward_lens_spec.run import compose_run, execute


@pytest.fixture(scope="module")
def dla_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("dla")
    url = str(base / "lab.zarr")
    ids = []
    for model in ("tiny_llama", "tiny_qwen2"):
        run, y = compose_run(["observable=dla", f"model={model}", "dataset.limit=12"])
        out = execute(run, resolved_yaml=y, base_dir=str(base), store_url=url, progress=False)
        ids.append(out.run_id if hasattr(out, "run_id") else out["run_id"])
    return url, ids


@pytest.mark.parametrize("extra", [[], ["vars=dla"]])
def test_compare_two_dla_runs_skips_cells_that_do_not_exist(dla_store, capsys, monkeypatch, tmp_path, extra):
    from reward_lens_spec.compare.cli import main

    monkeypatch.chdir(tmp_path)
    url, (a, b) = dla_store
    rc = main([f"url={url}", f"a={a}", f"b={b}", "n_boot=50", "n_perm=50", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "embed" in out and "attn" in out and "mlp" in out
    assert "compared" in out and "skipped" in out
    again = main([f"url={url}", f"a={a}", f"b={b}", "n_boot=50", "n_perm=50", *extra])   # reused from the store
    out2 = capsys.readouterr().out
    assert again == 0 and "already stored" in out2 and "compared" in out2


@pytest.mark.parametrize("argv, word, suggestion", [
    (["validte"], "validte", "validate"),
    (["stor", "ls", "url=x"], "stor", "store"),
    (["validte", "--help"], "validte", "validate"),
    (["help", "validte"], "validte", "validate"),
])
def test_mistyped_command_is_one_line(argv, word, suggestion, capsys, monkeypatch, tmp_path):
    from reward_lens_spec.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().count("\n") == 0
    assert f"unknown command '{word}'. Did you mean '{suggestion}'?" in err
    assert "EQUAL" not in err and "unknown key" not in err


@pytest.mark.parametrize("kind", ["jsonl", "rewardbench"])
def test_lone_surrogate_is_refused_naming_file_line_and_field(kind, monkeypatch, tmp_path):
    from reward_lens_spec.data.loaders import load_pairs
    from reward_lens_spec.errors import SpecError

    monkeypatch.chdir(tmp_path)
    good = '{"id": "x1", "prompt": "p", "chosen": "c", "rejected": "r"}\n'
    (tmp_path / "sur.jsonl").write_text(good + '{"id": "x2", "prompt": "p", "chosen": "a\\ud800b", "rejected": "r"}\n',
                                        encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        load_pairs(kind, path="sur.jsonl", base_dir=str(tmp_path))
    msg = str(exc.value)
    assert "sur.jsonl" in msg and "2" in msg and "chosen" in msg and "surrogate" in msg and "\n" not in msg


def test_override_value_with_colon_space_is_one_line(capsys, monkeypatch, tmp_path):
    from reward_lens_spec.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["validate", "model.template=Q: {prompt} A: {response}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert err.startswith("error: model.template:")
    assert "\"model.template='Q: {prompt} A: {response}'\"" in err


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_rewardbench_null_chosen_says_null_in_row(fmt, monkeypatch, tmp_path):
    from reward_lens_spec.data.loaders import load_pairs
    from reward_lens_spec.errors import SpecError
    from tests.test_rewardbench import v1_rows, write

    monkeypatch.chdir(tmp_path)
    rows = v1_rows(1)
    rows[2]["chosen"] = None
    p = write(tmp_path / f"rb.{fmt}", rows, fmt)
    with pytest.raises(SpecError) as exc:
        load_pairs("rewardbench", path=str(p))
    msg = str(exc.value)
    assert "is null" in msg and "chosen" in msg and "has no key" not in msg and "Did you mean" not in msg
    assert ("line 3" if fmt == "jsonl" else "row 2") in msg          # the third row (Parquet rows count from 0)


@pytest.mark.parametrize("extra, expect", [
    (["dataset.path=missing.jsonl"], "dataset.path:"),
    (["dataset.path=q.jsonl", "dataset.fields.promt=question"], "dataset.fields.promt:"),
])
def test_validate_checks_the_data(extra, expect, capsys, monkeypatch, tmp_path):
    from reward_lens_spec.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.jsonl").write_text('{"question": "q", "chosen": "c", "rejected": "r"}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["validate", "dataset=jsonl", *extra])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert "plan OK" not in out and expect in err
    if "promt" in expect:
        assert "Did you mean 'prompt'?" in err and "dataset.fields.prompt_rejected" in err


def test_validate_passes_good_data_and_help_lists_field_names(capsys, monkeypatch, tmp_path):
    from reward_lens_spec.cli import help_text, main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.jsonl").write_text('{"question": "q", "chosen": "c", "rejected": "r"}\n', encoding="utf-8")
    main(["validate", "dataset=jsonl", "dataset.path=q.jsonl", "dataset.fields.prompt=question"])
    out = capsys.readouterr().out
    assert "data OK: 1 pairs" in out and "plan OK" in out
    text = help_text()
    assert "dataset.fields.<name>" in text
    for name in ("prompt", "chosen", "rejected", "prompt_rejected", "dimension", "votes"):
        assert name in text.split("dataset.fields.<name>", 1)[1]
