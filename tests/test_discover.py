"""Decoder reward models without a family table (Phi-3, StableLM, OLMo): structure found, verified, run.

Rewards are checked against the model's own HF forward on the same ids (no capture involved);
Σ dla = margin, the normed lens ends at the margin and denoising the last residual restores it.
A model whose attention output already holds the residual, or whose final norm is neither RMS nor
LayerNorm, is refused with the reason.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from torch import nn

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.discover import discover_family, verify_family
from reward_lens_spec.models.families import FAMILIES
from reward_lens_spec.models.tiny import init_weights
from reward_lens_spec.models.tiny_tokenizer import VOCAB_SIZE, build_tiny_tokenizer

COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, num_labels=1,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
CONFIGS = {"phi3": lambda: tf.Phi3Config(**COMMON),
           "stablelm": lambda: tf.StableLmConfig(**COMMON, use_parallel_residual=True, partial_rotary_factor=0.5),
           "olmo": lambda: tf.OlmoConfig(**COMMON)}


def build(kind, seed=0):
    cfg = CONFIGS[kind]()
    model = tf.AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")
    init_weights(model, seed)
    return model.eval(), build_tiny_tokenizer()


def test_the_tiny_configs_are_not_in_the_tables():
    types = {t for f in FAMILIES.values() for t in f.model_types}
    assert not types & set(CONFIGS)


@pytest.mark.parametrize("kind,norm", [("phi3", "rms"), ("stablelm", "layer"), ("olmo", "layer")])
def test_structure_is_found(kind, norm):
    model, tok = build(kind)
    fam = discover_family(model)
    assert (fam.layers, fam.attn, fam.mlp, fam.final_norm, fam.head) == ("model.layers", "self_attn", "mlp",
                                                                          "model.norm", "score")
    assert fam.norm == norm and fam.o_proj == "self_attn.o_proj"
    verify_family(model, tok, fam)


def run_cfg(tmp_path, folder, *overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.run import execute
    from reward_lens_spec.spec import register_configs, validate
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model.source={folder}", "model.name=unlisted",
                                                       "dataset.limit=6", *overrides])
    return execute(validate(cfg), resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=str(tmp_path),
                   store_url=str(tmp_path / "s.zarr"), progress=False)


@pytest.mark.parametrize("kind", ["phi3", "stablelm"])
def test_an_unlisted_architecture_runs_from_config_with_exact_identities(tmp_path, kind):
    from reward_lens_spec.data import load_pairs
    from reward_lens_spec.models.formatting import encode_pairs
    model, tok = build(kind)
    folder = tmp_path / kind
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    out = run_cfg(tmp_path, folder, "observable=battery", "observable.name=unlisted_battery",
                  "observable.include=[score,lens,dla,patch]", "observable.layers=[2]")
    res = out.result
    from reward_lens_spec import open_store
    assert open_store(str(tmp_path / "s.zarr")).provenance(out.run_id)["model_family"] == f"discovered:{kind}"
    pairs = load_pairs("diagnostic", limit=6)
    enc = encode_pairs(tok, list(pairs))
    with torch.no_grad():                                  # the model's own forward, one sequence at a time
        for i, pid in enumerate(enc.pair_ids):
            for side, ids in (("chosen", enc.chosen[i]), ("rejected", enc.rejected[i])):
                ref = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
                assert res["reward"].sel(pair=pid, side=side).item() == pytest.approx(ref, rel=1e-4, abs=1e-5)
    margin = res["margin"].values
    np.testing.assert_allclose(res["dla"].sum(["layer", "component"]).values, margin, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res["lens"].isel(layer=-1).values, margin, rtol=1e-4, atol=1e-6)
    restored = res["patch_restored"].sel(layer=2, component="resid").values
    np.testing.assert_allclose(restored[np.abs(margin) > 1e-6], 1.0, atol=1e-4)


class ResidualAttention(nn.Module):
    """An attention block that returns residual + attention(norm(residual)) (the layer adds nothing)."""

    def __init__(self, norm, attn):
        super().__init__()
        self.norm, self.attn = norm, attn

    def forward(self, hidden_states, **kw):
        return hidden_states + self.attn(self.norm(hidden_states), **kw)[0]


class ResidualAttentionLayer(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.self_attn = ResidualAttention(layer.input_layernorm, layer.self_attn)
        self.post_attention_layernorm, self.mlp = layer.post_attention_layernorm, layer.mlp

    def forward(self, hidden_states, **kw):
        x = self.self_attn(hidden_states, **kw)
        return x + self.mlp(self.post_attention_layernorm(x))


def test_an_attention_output_that_holds_the_residual_is_refused_not_double_counted():
    model, tok = build("phi3")
    model.model.layers = nn.ModuleList(ResidualAttentionLayer(l) for l in model.model.layers)
    fam = discover_family(model)
    with pytest.raises(SpecError, match="already contains the residual"):
        verify_family(model, tok, fam)


class DoubledNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return 2 * x * self.weight


def test_a_final_norm_of_unknown_form_is_refused():
    model, tok = build("phi3")
    model.model.norm = DoubledNorm(32)
    with pytest.raises(SpecError, match="neither RMSNorm"):
        discover_family(model)
