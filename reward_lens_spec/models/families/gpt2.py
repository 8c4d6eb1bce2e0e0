"""GPT-2: LayerNorm, learned absolute positions (``wte + wpe``).

Each block: ``x += attn(ln_1(x)); x += mlp(ln_2(x))``; final norm ``transformer.ln_f``.
Learned positions make ``position_ids`` matter under left padding: the runtime
always passes positions counted from the first attended token.
"""
from . import FAMILIES, Family

for _family in (
    Family(name="gpt2", model_types=("gpt2",), layers="transformer.h", attn="attn", mlp="mlp",
           final_norm="transformer.ln_f", norm="layer", norm_eps_attr="layer_norm_epsilon",
           o_proj="attn.c_proj", o_proj_conv1d=True),
):
    FAMILIES.register(_family)
