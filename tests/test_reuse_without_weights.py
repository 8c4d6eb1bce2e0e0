"""Reuse decided without weights (issue 27 item 4): a complete run is found from the config, the pairs, the
tokenizer and the fingerprint a previous load of the same checkpoint bytes remembered."""
from __future__ import annotations

import pytest

from reward_lens_spec.run import compose_run, execute
from reward_lens_spec.models import loading


def _go(tmp_path, *over):
    run, y = compose_run(["observable=score", "dataset.limit=4", *over])
    return execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"), progress=False)


def _no_weights(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("weights were loaded")
    monkeypatch.setattr(loading, "load_model", refuse)       # the one guarded loader (kinds' classifier)


def test_builtin_rerun_loads_no_weights(tmp_path, monkeypatch):
    first = _go(tmp_path)
    assert not first.reused
    _no_weights(monkeypatch)
    again = _go(tmp_path)
    assert again.reused and again.run_id == first.run_id
    with pytest.raises(AssertionError, match="weights were loaded"):      # force recomputes: it must load
        _go(tmp_path, "store.force=true")
    with pytest.raises(AssertionError, match="weights were loaded"):      # another seed: other weights
        _go(tmp_path, "model.seed=1")


def test_folder_rerun_loads_no_weights_until_its_bytes_change(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    from reward_lens_spec.models.tiny import build_tiny

    model, tok = build_tiny("tiny_llama", seed=0)
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    first = _go(tmp_path, f"model.source={folder}")
    assert not first.reused
    with monkeypatch.context() as mp:
        _no_weights(mp)
        again = _go(tmp_path, f"model.source={folder}")
        assert again.reused and again.run_id == first.run_id
    (weights,) = folder.glob("*.safetensors")
    state = load_file(weights)
    name = sorted(k for k in state if k.endswith("score.weight"))[0]
    state[name] = state[name] * 2.0                                       # same size, other bytes
    save_file(state, weights, metadata={"format": "pt"})
    with monkeypatch.context() as mp:
        _no_weights(mp)
        with pytest.raises(AssertionError, match="weights were loaded"):
            _go(tmp_path, f"model.source={folder}")
    changed = _go(tmp_path, f"model.source={folder}")
    assert not changed.reused and changed.run_id != first.run_id


def test_a_corrupt_cache_is_ignored(tmp_path, monkeypatch):
    from reward_lens_spec.signed_cache import _folder

    first = _go(tmp_path)
    for f in (_folder() / "fingerprints").glob("*.json"):
        f.write_text("{not json", encoding="utf-8")
    again = _go(tmp_path)                                 # loads the weights, finds the run, remembers again
    assert again.reused and again.run_id == first.run_id
