"""Reuse decided from bytes (issue 27 item 4, ``run.reuse``): a rerun of a complete run is found from the
resolved config and the digests of its data, weights and code — no tokenizer, no plan, no torch — and a
cache entry that points elsewhere, or inputs whose bytes changed, are never taken for the stored run."""
from __future__ import annotations

import json

import pytest

from test_reuse_without_weights import _go

from reward_lens_spec import signed_cache
from reward_lens_spec.models import fingerprint_cache
from reward_lens_spec.run import compose_run, execute
from reward_lens_spec.run import executor


def _nothing_heavy(mp):
    """The rerun may neither tokenize nor plan (the slow path starts with ``plan_for``)."""
    def refuse(*a, **k):
        raise AssertionError("the slow path ran")
    mp.setattr(fingerprint_cache, "load_tokenizer_only", refuse)
    mp.setattr("reward_lens_spec.planning.plan_for", refuse)


def _entries():
    return sorted((signed_cache._folder() / "runs").glob("*.json"))


def test_rerun_is_found_from_bytes_and_prints_the_stored_counts(tmp_path, monkeypatch, capsys):
    first = _go(tmp_path)
    assert not first.reused and len(_entries()) == 1
    with monkeypatch.context() as mp:
        _nothing_heavy(mp)
        run, y = compose_run(["observable=score", "dataset.limit=4"])
        again = execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"))
    assert again.reused and again.run_id == first.run_id
    assert "pairs: 4 of 4 scored; excluded 0; flagged 0" in capsys.readouterr().out
    with monkeypatch.context() as mp:                       # another config: another key, decided the slow way
        _nothing_heavy(mp)
        with pytest.raises(AssertionError, match="the slow path ran"):
            _go(tmp_path, "dataset.limit=3")
        with pytest.raises(AssertionError, match="the slow path ran"):
            _go(tmp_path, "store.force=true")


def test_an_entry_pointing_at_another_stored_run_is_not_taken(tmp_path):
    from reward_lens_spec.run import reuse

    a = _go(tmp_path)
    b = _go(tmp_path, "dataset.limit=3")
    assert a.run_id != b.run_id
    docs = {json.loads(p.read_text())["doc"]["run_id"]: p for p in _entries()}
    signed = json.loads(docs[a.run_id].read_text())
    signed["doc"]["run_id"] = b.run_id                                 # edited: a's key -> b, old signature
    docs[a.run_id].write_text(json.dumps(signed))
    again = _go(tmp_path)
    assert again.reused and again.run_id == a.run_id                  # decided by loading, not by the entry
    assert json.loads(docs[a.run_id].read_text())["doc"]["run_id"] == a.run_id   # and the entry is rewritten
    run, y = compose_run(["observable=score", "dataset.limit=4"])
    signed_cache.write_signed("runs", reuse.reuse_key(run, y, str(tmp_path), None), {"run_id": b.run_id})
    assert _go(tmp_path).run_id == a.run_id                            # signed, but b's sealed config differs
    docs[a.run_id].write_text("{not json")
    assert _go(tmp_path).run_id == a.run_id


def test_a_data_file_with_other_bytes_is_another_run(tmp_path, monkeypatch):
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"q{i}", "chosen": "yes indeed", "rejected": "no"} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    over = ("dataset.kind=jsonl", f"dataset.path={data}")
    first = _go(tmp_path, *over)
    with monkeypatch.context() as mp:
        _nothing_heavy(mp)
        assert _go(tmp_path, *over).run_id == first.run_id
    rows[0]["chosen"] = "yes indeeD"                                    # same size, other bytes
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with monkeypatch.context() as mp:
        _nothing_heavy(mp)
        with pytest.raises(AssertionError, match="the slow path ran"):
            _go(tmp_path, *over)
    changed = _go(tmp_path, *over)
    assert not changed.reused and changed.run_id != first.run_id


def test_a_run_lost_from_the_store_is_computed_again(tmp_path):
    import shutil

    first = _go(tmp_path)
    shutil.rmtree(tmp_path / "s.zarr")
    again = _go(tmp_path)
    assert not again.reused and again.run_id == first.run_id


def test_the_key_covers_the_package_code(tmp_path, monkeypatch):
    from reward_lens_spec.run import reuse

    run, y = compose_run(["observable=score", "dataset.limit=4"])
    k1 = reuse.reuse_key(run, y, str(tmp_path), None)
    monkeypatch.setitem(signed_cache._PACKAGE_DIGEST, "d", "0" * 64)         # as if one source file had changed
    k2 = reuse.reuse_key(run, y, str(tmp_path), None)
    assert k1 and k2 and k1 != k2
    assert reuse.reuse_key(run, y, str(tmp_path), "study-x") != k2   # and the study the run is registered under
    assert executor.reuse_key is reuse.reuse_key


def test_a_description_is_remembered_per_checkpoint_bytes(tmp_path, monkeypatch):
    from reward_lens_spec.models import describe

    run, _ = compose_run(["observable=score"])
    first = describe.describe_model(run.model, str(tmp_path))
    calls = []
    real = describe.model_config
    monkeypatch.setattr(describe, "model_config", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = describe.describe_model(run.model, str(tmp_path))
    assert again[1:] == first[1:] and again[0].name == first[0].name and not calls      # no config read
    signed_cache.write_signed("describe", fingerprint_cache.weights_key(run.model, str(tmp_path)),
                              {"model_type": "not_a_family", "n_layers": 99, "position_limit": None})
    assert describe.describe_model(run.model, str(tmp_path))[1] == first[1] and calls   # an untabled entry: read
    other, _ = compose_run(["observable=score", "model.seed=3"])
    calls.clear()
    describe.describe_model(other.model, str(tmp_path))
    assert calls                                                       # other weights, other key: read
    small, _ = compose_run(["observable=score", "model.max_length=100000"])
    with pytest.raises(Exception, match="model.max_length"):           # the limit is checked from the entry too
        describe.describe_model(small.model, str(tmp_path))


@pytest.mark.slow
def test_a_rerun_imports_neither_torch_nor_transformers(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "REWARD_LENS_SPEC_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "reward_lens_spec", "dataset.limit=4"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run([sys.executable, "-X", "importtime", *cmd[1:]], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "reused, not recomputed" in again.stdout, again.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time:")}
    assert "reward_lens_spec.cli" in imported and not imported & {"torch", "transformers", "tokenizers"}
    assert not imported & {"xarray", "pandas", "zarr"}           # the store read as JSON
    assert "reward_lens_spec.store.run_doc" in imported
    for _ in range(2):                                  # validate: planned once, then remembered (no ops imported)
        check = subprocess.run([sys.executable, "-X", "importtime", "-m", "reward_lens_spec", "validate",
                                "dataset.limit=4"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert check.returncode == 0 and "plan OK" in check.stdout, check.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in check.stderr.splitlines()
                    if line.startswith("import time:")}
        assert not imported & {"torch", "transformers", "tokenizers"}
    assert not imported & {"reward_lens_spec.registry", "xarray", "scipy"}
