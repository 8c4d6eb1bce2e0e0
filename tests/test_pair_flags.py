"""Every pair accounted for: per-pair flag coords, excluded ids with reasons, the response-cut policy, one
console line, the position limit refused at plan time, the dataset file in provenance."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from reward_lens_spec.data import Pair
from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer
from reward_lens_spec.store import open_store

ROOT = Path(__file__).resolve().parents[1]
MAX = 64      # tokens; the tiny tokenizer is byte-level (one token per byte, plus BOS)
ROWS = [
    {"id": "long_prompt", "prompt": "why? " * 60, "chosen": "Because.", "rejected": "No idea."},
    {"id": "long_response", "prompt": "Explain.", "chosen": "a" * 200, "rejected": "b" * 200},
    {"id": "empty", "prompt": "Say something.", "chosen": "", "rejected": "Hello."},
    {"id": "same", "prompt": "Pick one.", "chosen": "This one.", "rejected": "This one."},
    {"id": "ok", "prompt": "2+2?", "chosen": "4", "rejected": "5"},
    {"id": "mismatch", "prompt": "A?", "prompt_rejected": "B?", "chosen": "x", "rejected": "y"},
]


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run import execute

    d = tmp_path_factory.mktemp("flags")
    path = d / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    run, text = compose_run(["model=tiny", "dataset=jsonl", f"dataset.path={path}", f"model.max_length={MAX}"])
    url = str(d / "s.zarr")
    import contextlib
    import io
    buf = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
        warnings.simplefilter("ignore")
        out = execute(run, resolved_yaml=text, base_dir=str(d), store_url=url, progress=True)
    store = open_store(url)
    return path, buf.getvalue(), store.load(out.run_id, "score", lazy=False), store.provenance(out.run_id)


def test_excluded_ids_with_reasons_and_flagged_ids_in_run_attrs(scored):
    _, _, _, prov = scored
    assert prov["excluded"] == {"prompt_mismatch": ["mismatch"], "identical_after_truncation": [],
                                "response_truncated": ["long_response"]}
    assert prov["pair_flags"] == {"empty_response": ["empty"], "identical_sides": ["same"],
                                  "prompt_truncated": ["long_prompt"], "response_truncated": []}


def test_every_result_carries_the_flags_as_pair_coords(scored):
    _, _, ds, _ = scored
    assert list(ds["pair"].values) == ["long_prompt", "empty", "same", "ok"]
    expect = {"empty_response": [0, 1, 0, 0], "identical_sides": [0, 0, 1, 0], "prompt_truncated": [1, 0, 0, 0],
              "response_truncated": [0, 0, 0, 0]}
    for name in ("reward", "margin", "p_chosen", "bt_loss"):
        for flag, want in expect.items():
            coord = ds[name][flag]
            assert coord.dims == ("pair",) and coord.dtype == bool
            assert list(coord.values) == [bool(w) for w in want], (name, flag)
    assert float(ds["margin"].sel(pair="same")) == 0.0          # identical sides: exactly 0


def test_one_console_line_with_the_counts_and_where_the_ids_are(scored):
    _, text, _, _ = scored
    lines = [ln for ln in text.splitlines() if ln.startswith("pairs: ")]
    assert lines == ["pairs: 4 of 6 scored; excluded 2 (prompt_mismatch 1, response_truncated 1); "
                     "flagged 3 (empty_response 1, identical_sides 1, prompt_truncated 1); ids: run attrs "
                     "'excluded' and 'pair_flags', and each result's per-pair coords"]


def test_provenance_names_the_dataset_file_and_its_size(scored):
    path, _, _, prov = scored
    assert prov["dataset_file"] == {"name": "mixed.jsonl", "bytes": os.path.getsize(path),
                                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_response_cut_policy_exclude_by_default_keep_on_request():
    tok = build_tiny_tokenizer()
    pairs = [Pair(id=r["id"], prompt=r["prompt"], chosen=r["chosen"], rejected=r["rejected"]) for r in ROWS[:2]]
    with pytest.warns(UserWarning, match="1 were excluded .*raise model.max_length"):
        enc = encode_pairs(tok, pairs, max_length=MAX)
    assert enc.pair_ids == ["long_prompt"] and enc.excluded["response_truncated"] == ["long_response"]
    assert enc.prompt_truncated == ["long_prompt", "long_response"] and enc.response_truncated == ["long_response"]
    with pytest.warns(UserWarning, match="kept and flagged response_truncated"):
        kept = encode_pairs(tok, pairs, max_length=MAX, truncated_responses="keep")
    assert kept.pair_ids == ["long_prompt", "long_response"] and kept.excluded["response_truncated"] == []
    # kept: BOS + the last MAX-1 tokens, i.e. the end of the response and the readout token
    assert kept.chosen[1] == [1] + [4 + ord("a")] * (MAX - 1)
    with pytest.raises(SpecError, match="truncated_responses"):
        encode_pairs(tok, pairs, truncated_responses="drop")


def test_prompt_cut_but_response_whole_is_kept_and_flagged():
    tok = build_tiny_tokenizer()
    p = Pair(id="p", prompt="q" * 100, chosen="yes", rejected="no")
    enc = encode_pairs(tok, [p], template="{prompt}|{response}", max_length=10)
    assert enc.pair_ids == ["p"] and enc.prompt_truncated == ["p"] and enc.response_truncated == []
    assert enc.chosen[0] == [1] + [4 + b for b in b"qqqqq|yes"]


def test_max_length_beyond_the_position_limit_is_refused_at_plan_time(tmp_path):
    res = subprocess.run([sys.executable, "-m", "reward_lens_spec", "validate", "model=tiny_gpt2",
                          "model.max_length=2048"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model.max_length:")
    assert "2048" in lines[0] and "n_positions=1024" in lines[0]
    from reward_lens_spec.models.describe import describe_model
    from reward_lens_spec.spec import ModelSpec
    assert describe_model(ModelSpec(name="g", source="builtin:tiny_gpt2", max_length=1024))[1] > 0
    with pytest.raises(SpecError, match="model.max_length.*1025.*1024"):
        describe_model(ModelSpec(name="g", source="builtin:tiny_gpt2", max_length=1025))


def test_the_limit_is_what_gpt2_can_actually_run():
    """The refused length really is the model's limit: 1024 positions run, 1025 fail inside the model."""
    import torch

    from reward_lens_spec.models.tiny import build_tiny
    model, _ = build_tiny("tiny_gpt2")
    with torch.no_grad():
        assert np.isfinite(model(input_ids=torch.ones(1, 1024, dtype=torch.long)).logits.numpy()).all()
        with pytest.raises(IndexError):
            model(input_ids=torch.ones(1, 1025, dtype=torch.long))
