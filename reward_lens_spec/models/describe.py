"""A model's description from its config alone (no weights): transformers config, family, depth.

The config is read with ``trust_remote_code=model.trust_remote_code`` (default false, so a checkpoint's
own Python never runs and transformers never asks on stdin); ``validate`` loads no model and runs no code.
"""
from __future__ import annotations

from ..errors import SpecError


def model_config(spec, base_dir=None):
    """The transformers config of ``spec`` (a ``ModelSpec``), read without weights."""
    import transformers as tf

    from .loading import gguf_for, resolve_source
    from .tiny import TINY_CONFIGS, tiny_config

    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "builtin":
        if loc not in TINY_CONFIGS:
            raise SpecError("model.source", f"unknown built-in model '{loc}'.", value=loc, options=TINY_CONFIGS)
        cfg = tiny_config(loc)
    else:
        from .loading import remote_code_error, trust_remote_code
        try:
            gguf = gguf_for(spec, kind, loc)
            cfg = tf.AutoConfig.from_pretrained(loc, trust_remote_code=trust_remote_code(spec),
                                                **({"gguf_file": gguf} if gguf else {}))
        except (OSError, ValueError) as exc:
            raise remote_code_error(spec, exc) or SpecError(
                "model.source", f"cannot read the model config at '{spec.source}': {str(exc).splitlines()[0]}") from None
    return cfg


def describe_model(spec, base_dir=None) -> tuple:
    """``(family, n_layers, n_objectives)`` from the model config alone (no weights)."""
    from .families import family_for

    cfg = model_config(spec, base_dir)
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    return family_for(cfg.model_type), int(n_layers), int(spec.num_labels)
