"""Checks remembered under a digest of what they read (issue 27 item 4: a rerun and ``validate`` again cost
little), never at the price of safety: a command line whose safety checks passed skips them only while every
input is the same bytes (a tampered config file is checked again and still refused), entries are signed with
a per-user key (a planted or copied entry, or a key others can read, is not taken), ``validate`` prints what
it printed for the same bytes, and a reused run's line read from the store's JSON documents is the reader's."""
from __future__ import annotations

import json
import os

import pytest

from reward_lens_spec import signed_cache
from reward_lens_spec.errors import SpecError
from reward_lens_spec.run import compose


def _count_checks(monkeypatch) -> list:
    calls: list = []
    real = compose.check_argv
    monkeypatch.setattr(compose, "check_argv", lambda argv: calls.append(list(argv)) or real(argv))
    return calls


def test_signed_entries_roundtrip_and_refuse_planted_copied_or_unprotected(tmp_path):
    signed_cache.write_signed("argv", "d1", {"checked": True})
    assert signed_cache.read_signed("argv", "d1") == {"checked": True}
    assert signed_cache.read_signed("argv", "d2") is None                      # another digest: nothing
    folder = signed_cache._folder() / "argv"
    (entry,) = folder.glob("*.json")
    doc = json.loads(entry.read_text())
    doc["doc"] = {"checked": "edited"}                                         # edited content: signature fails
    entry.write_text(json.dumps(doc))
    assert signed_cache.read_signed("argv", "d1") is None
    signed_cache.write_signed("argv", "d1", {"checked": True})
    key = signed_cache._folder() / "key"
    os.chmod(key, 0o644)                                                       # a key others can read: unused
    assert signed_cache.read_signed("argv", "d1") is None
    os.chmod(key, 0o600)
    assert signed_cache.read_signed("argv", "d1") == {"checked": True}
    key.write_bytes(os.urandom(32))                                            # another key (a copied cache)
    os.chmod(key, 0o600)
    assert signed_cache.read_signed("argv", "d1") is None


def test_a_passed_command_line_is_not_checked_again_until_a_config_file_changes(tmp_path, monkeypatch):
    user = tmp_path / "mine"
    (user / "observable").mkdir(parents=True)
    obs = user / "observable" / "my_score.yaml"
    obs.write_text("name: my_score\nsteps:\n  - {name: h, op: capture, site: readout}\n"
                   "  - {name: reward, op: project, input: h, direction: head, bias: true}\noutputs: [reward]\n")
    argv = ["--config-dir", str(user), "observable=my_score", "mode=validate"]
    calls = _count_checks(monkeypatch)
    compose.prepare(list(argv))
    compose.prepare(list(argv))
    assert len(calls) == 1                                                     # the second: remembered
    compose.prepare(list(argv) + ["seed=1"])
    assert len(calls) == 2                                                     # another command line: checked
    obs.write_text(obs.read_text().replace("name: my_score", "name: ${oc.env:HOME}"))   # tampered: a resolver
    for _ in range(2):                                                         # checked again, refused, and a
        with pytest.raises(SpecError, match="oc.env"):                         # refusal is never remembered
            compose.prepare(list(argv))
    assert len(calls) == 4
    obs.write_text(obs.read_text().replace("name: ${oc.env:HOME}", "name: my_score"))
    compose.prepare(list(argv))                                                # the old bytes: remembered
    assert len(calls) == 4


def test_the_digest_covers_the_package_code_and_a_planted_entry_is_not_taken(tmp_path, monkeypatch):
    argv = compose.prepare_overrides(["observable=score", "mode=validate"])
    d1 = compose.checked_inputs(argv)
    with monkeypatch.context() as mp:
        mp.setitem(signed_cache._PACKAGE_DIGEST, "d", "0" * 64)                # as if config_safety had changed
        assert compose.checked_inputs(argv) not in (None, d1)
    calls = _count_checks(monkeypatch)
    folder = signed_cache._folder() / "argv"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{d1}.json").write_text(json.dumps({"doc": {"checked": True}, "mac": "0" * 64}))   # planted
    compose.prepare(["observable=score", "mode=validate"])
    assert len(calls) == 1


def _validate(capsys, *over) -> str:
    from reward_lens_spec.cli import main

    main(["validate", "observable=score", "dataset.limit=4", *over])
    return capsys.readouterr().out


def test_validate_again_prints_the_same_without_planning_until_the_data_change(tmp_path, monkeypatch, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "chosen": "yes", "rejected": "no"}) + "\n"
                            for i in range(3)))
    monkeypatch.chdir(tmp_path)
    over = ("dataset.kind=jsonl", f"dataset.path={data}")
    first = _validate(capsys, *over)
    assert "data OK: 3 pairs" in first and "plan OK" in first

    planned = []

    def refuse(*a, **k):
        planned.append(a)
        raise AssertionError("planned again")
    with monkeypatch.context() as mp:
        mp.setattr("reward_lens_spec.planning.plan_for", refuse)
        assert _validate(capsys, *over) == first and not planned
        data.write_text(data.read_text() + json.dumps({"prompt": "q3", "chosen": "yes", "rejected": "no"}) + "\n")
        # other data bytes: planned. Hydra's run_and_report exits 1, or re-raises where a trace function is set
        # (it takes coverage, as `pytest --cov` runs, for a debugger)
        with pytest.raises((SystemExit, AssertionError)):
            _validate(capsys, *over)
        assert len(planned) == 1
    assert "data OK: 4 pairs" in _validate(capsys, *over)
    data.write_text(data.read_text() + "{not json\n")                          # a refusal is printed every time
    for _ in range(2):
        with pytest.raises(SystemExit):
            _validate(capsys, *over)


def test_a_reused_runs_block_from_json_documents_is_the_readers(tmp_path, capsys):
    from test_reuse_without_weights import _go

    from reward_lens_spec.cli import _print_summary
    from reward_lens_spec.report.summary import print_summary
    from reward_lens_spec.store import open_store
    from reward_lens_spec.store.run_doc import complete_provenance

    first = _go(tmp_path)
    again = _go(tmp_path)
    assert again.reused and again.provenance is not None
    url = str(tmp_path / "s.zarr")
    assert complete_provenance(url, first.run_id) == open_store(url).provenance(first.run_id)
    assert complete_provenance(url, "../" + first.run_id) is None and complete_provenance(url, "nope") is None
    capsys.readouterr()
    _print_summary(again)
    light = capsys.readouterr().out
    print_summary(again)
    assert light == capsys.readouterr().out and "reused, not recomputed" in light
