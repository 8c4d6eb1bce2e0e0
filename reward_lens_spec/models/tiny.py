"""Tiny random reward models of every supported family, built offline.

Each is a HF ``*ForSequenceClassification`` built from its transformers config
class. Weights are drawn from NumPy's PCG64 generator (stable across NumPy,
torch and machine versions) in sorted parameter-name order: matrices and
embeddings and biases ~ N(0, 0.02²), norm gains 1 + N(0, 0.1²) — so ``model=tiny`` gives the
same numbers everywhere. The tokenizer is the byte-level one in
``tiny_tokenizer`` (260 ids).
"""
from __future__ import annotations

import numpy as np
import torch
import transformers as tf

from ..errors import SpecError
from .tiny_tokenizer import VOCAB_SIZE, build_tiny_tokenizer

_D, _FF, _L, _H = 64, 128, 4, 4
_RMS = dict(vocab_size=VOCAB_SIZE, hidden_size=_D, intermediate_size=_FF, num_hidden_layers=_L,
            num_attention_heads=_H, num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6)

TINY_CONFIGS: dict[str, tuple[str, dict]] = {
    "tiny": ("LlamaConfig", _RMS),
    "tiny_llama": ("LlamaConfig", _RMS),
    "tiny_mistral": ("MistralConfig", dict(_RMS, sliding_window=None)),
    "tiny_qwen2": ("Qwen2Config", dict(_RMS, use_sliding_window=False)),
    "tiny_qwen3": ("Qwen3Config", dict(_RMS, head_dim=16, use_sliding_window=False)),
    "tiny_gemma2": ("Gemma2Config", dict(_RMS, head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
                                          attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "tiny_gpt_neox": ("GPTNeoXConfig", dict(vocab_size=VOCAB_SIZE, hidden_size=_D, intermediate_size=_FF,
                                             num_hidden_layers=_L, num_attention_heads=_H, rotary_pct=0.5,
                                             use_parallel_residual=True, max_position_embeddings=1024)),
    "tiny_gpt_neox_sequential": ("GPTNeoXConfig", dict(vocab_size=VOCAB_SIZE, hidden_size=_D,
                                                        intermediate_size=_FF, num_hidden_layers=_L,
                                                        num_attention_heads=_H, rotary_pct=0.5,
                                                        use_parallel_residual=False, max_position_embeddings=1024)),
    "tiny_gpt2": ("GPT2Config", dict(vocab_size=VOCAB_SIZE, n_embd=_D, n_inner=_FF, n_layer=_L, n_head=_H,
                                      n_positions=1024)),
}


def build_tiny(name: str, *, seed: int = 0, num_labels: int = 1, pad_token: str | None = "<pad>",
               padding_side: str = "left"):
    """Return ``(model, tokenizer)`` for a built-in tiny model.

    Raises ``SpecError`` (field ``model.source``) for an unknown name.
    """
    if name not in TINY_CONFIGS:
        raise SpecError("model.source", f"unknown built-in model 'builtin:{name}'.", value=name,
                        options=TINY_CONFIGS)
    tok = build_tiny_tokenizer(pad_token=pad_token, padding_side=padding_side)
    cfg = tiny_config(name, num_labels=num_labels, pad_token_id=tok.pad_token_id)
    model = tf.AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")
    init_weights(model, seed)
    model.eval()
    return model, tok


def build_tiny_causal(name: str, *, seed: int = 0, pad_token: str | None = "<pad>", padding_side: str = "left"):
    """``(model, tokenizer)``: the built-in tiny ``name`` as a ``*ForCausalLM`` (an untied unembedding
    ``lm_head``), weights from PCG64(seed) as ``build_tiny``. Raises ``SpecError`` (``model.source``)."""
    if name not in TINY_CONFIGS:
        raise SpecError("model.source", f"unknown built-in model 'builtin:{name}'.", value=name,
                        options=TINY_CONFIGS)
    tok = build_tiny_tokenizer(pad_token=pad_token, padding_side=padding_side)
    model = tf.AutoModelForCausalLM.from_config(tiny_config(name, pad_token_id=tok.pad_token_id),
                                                attn_implementation="eager")
    init_weights(model, seed)
    model.eval()
    return model, tok


def tiny_config(name: str, *, num_labels: int = 1, pad_token_id: int | None = 0):
    """The transformers config of a built-in tiny model (ids: pad 0, BOS 1, EOS 2)."""
    cls_name, kwargs = TINY_CONFIGS[name]
    cfg = getattr(tf, cls_name)(**kwargs, num_labels=num_labels, pad_token_id=pad_token_id, bos_token_id=1,
                                eos_token_id=2, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    return cfg


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter from PCG64(seed), in sorted name order (see module doc)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    gemma = "gemma" in type(model).__name__.lower()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.ndim == 1 and name.endswith("weight"):   # norm gain; Gemma norms scale by (1 + g)
            value = (0.0 if gemma else 1.0) + rng.normal(0.0, 0.1, size=p.shape)
        else:                                          # matrices, embeddings, biases
            value = rng.normal(0.0, 0.02, size=p.shape)
        p.copy_(torch.from_numpy(value).to(p.dtype))
