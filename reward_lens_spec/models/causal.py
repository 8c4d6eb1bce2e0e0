"""Load a causal language model named by a ``ModelSpec`` (a DPO policy or its reference): built-in tiny,
local folder, ``package:`` folder, GGUF — through the one guarded loader (``models.hub.load_causal_lm``).

``CausalLM`` bundles the HF ``*ForCausalLM`` (eval mode, on the spec's device and dtype), its tokenizer and
the family table (which module is a layer, attention, MLP, final norm: the same tables as the sequence
classifiers; the unembedding is the model's ``get_output_embeddings()``).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SpecError
from .families import Family, family_for
from .head import get_module
from ..admission import permissions
from .hub import load_causal_lm, load_tokenizer
from .loading import gguf_for, resolve_device, resolve_source
from .tiny import TINY_CONFIGS, build_tiny_causal

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class CausalLM:
    name: str
    model: torch.nn.Module
    tokenizer: object
    family: Family

    @property
    def layers(self):
        return get_module(self.model, self.family.layers)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def final_norm(self) -> torch.nn.Module:
        return get_module(self.model, self.family.final_norm)

    @property
    def unembed(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def logits_of(self, h: torch.Tensor) -> torch.Tensor:
        """The model's own next-token logits from final-norm outputs ``h`` (..., d_model): the unembedding,
        then the final logit soft-cap where the config has one (Gemma-2)."""
        z = self.unembed(h)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        return z if not cap else torch.tanh(z / cap) * cap


def load_causal(spec, base_dir: str | None = None) -> CausalLM:
    """The causal LM ``spec`` names (its ``source``, ``seed``, ``dtype``, ``device``, ``gguf_file`` …).

    Raises ``SpecError`` naming the config key at fault (``model.source``, ``model.gguf_file``, ``model.family``).
    """
    device = resolve_device(str(getattr(spec.device, "value", spec.device)))
    dtype = str(getattr(spec.dtype, "value", spec.dtype))
    padding_side = str(getattr(spec.padding_side, "value", spec.padding_side))
    trust, pickle = permissions(spec)               # every spec's flags through the model door, any source
    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "builtin":
        if loc not in TINY_CONFIGS:
            raise SpecError("model.source", f"unknown built-in model '{loc}'.", value=loc, options=TINY_CONFIGS)
        model, tok = build_tiny_causal(loc, seed=spec.seed, padding_side=padding_side)
    else:
        gguf = gguf_for(spec, kind, loc)
        if gguf:
            if kind == "folder" and not (Path(loc) / gguf).exists():
                raise SpecError("model.gguf_file", f"{gguf} not found in {loc}.",
                                fix=f"set model.gguf_file to a .gguf file in {loc}.")
            for need in ("gguf", "accelerate"):
                if importlib.util.find_spec(need) is None:
                    raise SpecError("model.gguf_file", f"loading GGUF needs the '{need}' package.",
                                    fix="pip install 'reward_lens_spec[real]'")
        common = dict(trust_remote_code=trust, source=spec.source, gguf_file=gguf,
                      revision=spec.revision or None)
        tok = load_tokenizer(loc, **common)
        model = load_causal_lm(loc, dtype=_DTYPES[dtype], allow_pickle=pickle,
                               attn_implementation=spec.attn_implementation or None, **common)
        tok.padding_side = padding_side
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token          # pads are masked out; any id serves
    model.to(device=device, dtype=_DTYPES[dtype]).eval()
    return CausalLM(name=spec.name, model=model, tokenizer=tok, family=family_for(model.config.model_type))
