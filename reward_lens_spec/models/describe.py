"""A model's description from its config alone (no weights): transformers config, family, depth."""
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
        try:
            gguf = gguf_for(spec, kind, loc)
            cfg = tf.AutoConfig.from_pretrained(loc, **({"gguf_file": gguf} if gguf else {}))
        except (OSError, ValueError) as exc:
            raise SpecError("model.source", f"cannot read the model config at '{spec.source}': "
                            f"{str(exc).splitlines()[0]}") from None
    return cfg


def describe_model(spec, base_dir=None) -> tuple:
    """``(family, n_layers, n_objectives)`` from the model config alone (no weights)."""
    from .discover import family_or_discovered_config

    cfg = model_config(spec, base_dir)
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    return family_or_discovered_config(cfg), int(n_layers), int(spec.num_labels)
