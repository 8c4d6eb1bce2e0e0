"""GPT-NeoX (Pythia): LayerNorm, partial RoPE, parallel or sequential residual.

Parallel (``use_parallel_residual=True``): ``x = x + attn(ln1(x)) + mlp(ln2(x))``.
Sequential: ``x = x + attn(ln1(x)); x = x + mlp(ln2(x))``. Either way the
attention and MLP outputs (after their identity-in-eval dropouts) are exactly
what is added, so one table serves both wirings.
"""
from . import FAMILIES, Family

for _family in (
    Family(name="gpt_neox", model_types=("gpt_neox",), layers="gpt_neox.layers", attn="attention",
           mlp="mlp", final_norm="gpt_neox.final_layer_norm", norm="layer", norm_eps_attr="layer_norm_eps",
           o_proj="attention.dense"),
):
    FAMILIES.register(_family)
