"""Llama-shaped pre-norm decoders: Llama, Mistral, Qwen2, Qwen3 (RMSNorm, RoPE).

Each layer: ``x += self_attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x))``;
final norm ``model.norm``; head ``score``. Qwen3's q/k norms live inside the
attention and change nothing here.
"""
from . import FAMILIES, Family

_COMMON = dict(layers="model.layers", attn="self_attn", mlp="mlp", final_norm="model.norm")

for _family in (
    Family(name="llama", model_types=("llama",), **_COMMON),
    Family(name="mistral", model_types=("mistral",), **_COMMON),
    Family(name="qwen2", model_types=("qwen2",), **_COMMON),
    Family(name="qwen3", model_types=("qwen3",), **_COMMON),
):
    FAMILIES.register(_family)
