"""Formatting, padding, batching and fingerprint rules (fast, no downloads)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
import transformers

from reward_lens_spec.errors import CaptureError, SpecError
from reward_lens_spec.models.fingerprint import model_fingerprint
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.models.padding import batches_by_length, pad_batch
from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer


@dataclass
class P:
    id: str
    prompt: str
    chosen: str
    rejected: str
    prompt_rejected: str | None = None


def byte_ids(text: str) -> list[int]:
    return [4 + b for b in text.encode("utf-8")]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


# ---------------------------------------------------------------- formatting

def test_plain_text_exactly_as_template_and_braces_safe(tok):
    pairs = [P("a", "say {response} {x}", "yes {prompt}", "no")]
    enc = encode_pairs(tok, pairs, fmt="plain", template="Q: {prompt}\nA: {response}")
    assert enc.bos_count == 1
    assert enc.chosen[0] == [1] + byte_ids("Q: say {response} {x}\nA: yes {prompt}")
    assert enc.rejected[0] == [1] + byte_ids("Q: say {response} {x}\nA: no")
    assert enc.lengths().shape == (1, 2)
    assert enc.lengths()[0, 0] == len(enc.chosen[0])


def test_batched_tokenization_equals_one_call_per_text(tok):
    pairs = [P(f"p{i}", "q" * (3 * i + 1), "a" * (i + 2), "b" * (7 - i)) for i in range(5)]
    enc = encode_pairs(tok, iter(pairs), template="{prompt}|{response}")      # any iterable of pairs
    for p, c, r in zip(pairs, enc.chosen, enc.rejected):
        assert c == tok(f"{p.prompt}|{p.chosen}")["input_ids"]                 # no padding leaks in
        assert r == tok(f"{p.prompt}|{p.rejected}")["input_ids"]


def test_tokenizer_slices_join_to_one_call_per_text(tok, monkeypatch):
    import reward_lens_spec.models.formatting as fmt_mod

    monkeypatch.setattr(fmt_mod, "ENCODE_SLICE", 3)                  # 9 texts: slices of 3, 3, 3 (+ order)
    pairs = [P(f"p{i}", "q" * (i + 1), "a" * (2 * i + 1), "b" * (9 - i)) for i in range(9)]
    enc = encode_pairs(tok, pairs, template="{prompt}|{response}")
    assert [c for c in enc.chosen] == [tok(f"{p.prompt}|{p.chosen}")["input_ids"] for p in pairs]
    assert [r for r in enc.rejected] == [tok(f"{p.prompt}|{p.rejected}")["input_ids"] for p in pairs]


def test_prompt_rejected_used_for_rejected_side(tok):
    enc = encode_pairs(tok, [P("a", "p1", "c", "r", prompt_rejected="p2")], template="{prompt}|{response}")
    assert enc.chosen[0] == [1] + byte_ids("p1|c")
    assert enc.rejected[0] == [1] + byte_ids("p2|r")


def test_chat_template_gives_exactly_one_bos(tok):
    enc = encode_pairs(tok, [P("a", "hi", "ok", "no")], fmt="chat_template")
    for seq in (enc.chosen[0], enc.rejected[0]):
        assert seq[0] == 1 and seq[1] != 1
        assert seq.count(1) == 1
    assert enc.bos_count == 1
    expected = tok.apply_chat_template([{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "ok"}],
                                       tokenize=False, add_generation_prompt=False)
    assert enc.chosen[0] == [1] + byte_ids(expected[len("<s>"):])


def test_double_bos_raises(tok):
    with pytest.raises(CaptureError, match="BOS") as info:
        encode_pairs(tok, [P("a", "hi", "ok", "no")], template="<s>User: {prompt}\nAssistant: {response}",
                     model_name="tiny-rm")
    assert "tiny-rm" in str(info.value) and "Fix" in str(info.value)


def test_no_bos_tokenizer(tok):
    t = build_tiny_tokenizer(add_bos=False)
    enc = encode_pairs(t, [P("a", "hi", "ok", "no")], template="{prompt}{response}")
    assert enc.bos_count == 0 and enc.chosen[0] == byte_ids("hiok")


def test_bad_arguments(tok):
    with pytest.raises(SpecError, match="model.format"):
        encode_pairs(tok, [], fmt="chat")
    with pytest.raises(SpecError, match="model.template"):
        encode_pairs(tok, [], template="{prompt}")
    with pytest.raises(SpecError, match="model.max_length"):
        encode_pairs(tok, [], max_length=1)
    with pytest.raises(SpecError, match="model.chat_template"):
        encode_pairs(build_tiny_tokenizer(chat_template=False), [], fmt="chat_template")


def test_truncation_keeps_end_and_bos(tok):
    pairs = [P("long", "x" * 100, "the good end", "the bad end")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc = encode_pairs(tok, pairs, template="{prompt}|{response}", max_length=20)
    assert enc.n_truncated == 1 and enc.response_truncated == []
    for seq, resp in ((enc.chosen[0], "the good end"), (enc.rejected[0], "the bad end")):
        assert len(seq) == 20
        assert seq[0] == 1 and seq[1] != 1
        assert seq[-len(resp) - 1:] == byte_ids("|" + resp)
        assert seq[1:] == ([1] + byte_ids("x" * 100 + "|" + resp))[-19:]


def test_identical_after_truncation_excluded(tok):
    pairs = [P("dup", "p", "A" + "z" * 50, "B" + "z" * 50),   # differ only far left
             P("same", "p", "same", "same"),                    # identical before: kept
             P("ok", "p", "yes", "no")]
    with pytest.warns(UserWarning, match="1 pair"):
        enc = encode_pairs(tok, pairs, template="{prompt}{response}", max_length=10)
    assert enc.excluded["identical_after_truncation"] == ["dup"]
    assert enc.pair_ids == ["same", "ok"]
    assert enc.chosen[0] == enc.rejected[0]
    assert "dup" in enc.response_truncated
    assert enc.n_truncated == 1


# ---------------------------------------------------------------- padding

@pytest.mark.parametrize("side", ["left", "right"])
def test_pad_batch_readout_and_positions(side):
    seqs = [[1, 5, 6, 7], [1, 8]]
    ids, mask, pos, ro = pad_batch(seqs, 0, side=side)
    assert ids.shape == mask.shape == pos.shape == (2, 4) and ro.shape == (2,)
    assert ids.dtype == mask.dtype == pos.dtype == ro.dtype == torch.long
    for b, s in enumerate(seqs):
        assert ids[b, ro[b]].item() == s[-1]
        assert mask[b, ro[b]].item() == 1 and mask[b, ro[b] + 1:].sum() == 0
        att = mask[b].bool()
        assert pos[b][att].tolist() == list(range(len(s)))
        assert ids[b][att].tolist() == s
    if side == "left":
        assert ro.tolist() == [3, 3] and pos[1].tolist() == [0, 0, 0, 1]
    else:
        assert ro.tolist() == [3, 1] and pos[1].tolist() == [0, 1, 1, 1]


@pytest.mark.parametrize("side", ["left", "right"])
def test_pad_equal_eos_with_eos_inside_prompt(side):
    eos = 2
    seqs = [[1, 9, eos, 10, 11], [1, 12, eos, 13]]
    ids, mask, pos, ro = pad_batch(seqs, eos, side=side)
    for b, s in enumerate(seqs):
        assert ids[b, ro[b]].item() == s[-1]
        assert pos[b, ro[b]].item() == len(s) - 1


def test_pad_batch_without_pad_token():
    t = build_tiny_tokenizer(pad_token=None)
    assert t.pad_token_id is None
    ids, mask, pos, ro = pad_batch([[1, 4, 5], [1]], t.pad_token_id, side="left")
    assert ids[1].tolist() == [0, 0, 1] and mask[1].tolist() == [0, 0, 1] and ro.tolist() == [2, 2]


def test_pad_batch_errors():
    with pytest.raises(SpecError, match="model.padding_side"):
        pad_batch([[1]], 0, side="middle")
    with pytest.raises(SpecError):
        pad_batch([[1], []], 0)


def test_batches_by_length():
    lengths = [5, 1, 9, 3, 3, 7, 2, 100, 4, 6]
    batches = batches_by_length(lengths, batch_size=3, max_tokens=20)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 20
    assert [7] in batches  # the over-budget row alone
    assert batches == batches_by_length(list(lengths), batch_size=3, max_tokens=20)
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert batches_by_length(lengths, batch_size=4, max_tokens=None)[0] == [1, 6, 3, 4]
    assert batches_by_length([], 2, None) == []
    with pytest.raises(SpecError, match="model.batch_size"):
        batches_by_length(lengths, 0, None)
    with pytest.raises(SpecError, match="model.max_tokens"):
        batches_by_length(lengths, 2, -1)


# ---------------------------------------------------------------- fingerprint

def _tiny_model(seed: int = 0):
    cfg = transformers.LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, pad_token_id=0)
    torch.manual_seed(seed)
    return transformers.LlamaForSequenceClassification(cfg).eval()


def test_fingerprint_stable_across_folders(tmp_path, tok):
    model = _tiny_model()
    fps = []
    for sub in ("one", "two/deeper"):
        folder = tmp_path / sub
        model.save_pretrained(folder)
        fps.append(model_fingerprint(transformers.LlamaForSequenceClassification.from_pretrained(folder), tok))
    assert fps[0] == fps[1] == model_fingerprint(model, tok)
    assert len(fps[0]) == 64
    assert model_fingerprint(_tiny_model(), tok) == fps[0]


def test_fingerprint_changes_with_weights_tokenizer(tok):
    model = _tiny_model()
    base = model_fingerprint(model, tok)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] += 1e-3
    assert model_fingerprint(model, tok) != base
    assert model_fingerprint(_tiny_model(), build_tiny_tokenizer(add_bos=False)) != base
    assert model_fingerprint(_tiny_model(seed=1), tok) != base


def test_fingerprint_ignores_config_dtype_key(tok):
    model = _tiny_model()
    base = model_fingerprint(model, tok)
    model.config.dtype = torch.bfloat16
    model.config._name_or_path = "/somewhere/else"
    assert model_fingerprint(model, tok) == base
    model.config.rms_norm_eps = 1e-5
    assert model_fingerprint(model, tok) != base


def test_fingerprint_tied_weights_hashed_once(tok):
    cfg = transformers.LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    a = model_fingerprint(model, tok)
    with torch.no_grad():
        model.model.embed_tokens.weight[0, 0] += 1.0
    assert model_fingerprint(model, tok) != a
