"""Gemma-2: sandwich norms and a scaled embedding.

Each layer: ``x += post_attention_layernorm(self_attn(input_layernorm(x)))`` and
``x += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))``, so what
reaches the residual stream is the *post-norm* output. The embedding is scaled
by sqrt(d_model) inside the embedding module; ``embed`` (= ``resid_pre`` of
layer 0) already includes it. The final RMSNorm multiplies by ``1 + g``.
Logit soft-capping applies to the LM head only, not to the reward head.
"""
from . import FAMILIES, Family

for _family in (
    Family(name="gemma2", model_types=("gemma2",), layers="model.layers",
           attn="post_attention_layernorm", mlp="post_feedforward_layernorm",
           final_norm="model.norm", norm_offset=1.0, attn_post_norm="post_attention_layernorm"),
):
    FAMILIES.register(_family)
