"""A model's description from its config alone (no weights): transformers config, family, depth.

The config is read through the guarded loader ``models.hub`` with ``trust_remote_code=model.trust_remote_code``
(default false, so a checkpoint's own Python never runs and transformers never asks on stdin); ``validate``
loads no model and runs no code.
"""
from __future__ import annotations

from ..errors import SpecError


def model_config(spec, base_dir=None):
    """The transformers config of ``spec`` (a ``ModelSpec``), read without weights."""
    from .hub import load_config, trust_remote_code
    from .loading import gguf_for, resolve_source
    from .tiny import TINY_CONFIGS, tiny_config

    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "builtin":
        if loc not in TINY_CONFIGS:
            raise SpecError("model.source", f"unknown built-in model '{loc}'.", value=loc, options=TINY_CONFIGS)
        cfg = tiny_config(loc)
    else:
        cfg = load_config(loc, trust_remote_code=trust_remote_code(spec), source=spec.source,
                          gguf_file=gguf_for(spec, kind, loc), revision=getattr(spec, "revision", None) or None)
    return cfg


POSITION_KEYS = ("n_positions", "max_position_embeddings")   # GPT-2 names it n_positions; the others, max_...


def position_limit(cfg) -> tuple[int, str] | None:
    """``(limit, config key)``: the most positions the model has embeddings / was trained for; ``None`` if unstated."""
    for key in POSITION_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value, key
    return None


def check_max_length(spec, cfg) -> None:
    """``model.max_length`` must fit the model's positions (beyond them GPT-2's position lookup fails with an
    ``IndexError`` and rotary models run outside their trained range). Raises ``SpecError`` naming both numbers."""
    limit = position_limit(cfg)
    max_length = getattr(spec, "max_length", None)
    if limit is not None and isinstance(max_length, int) and max_length > limit[0]:
        raise SpecError("model.max_length", f"{max_length} is beyond the position limit of '{spec.name}' "
                        f"({limit[1]}={limit[0]} in its config).", value=max_length,
                        fix=f"set model.max_length to at most {limit[0]}.")


def describe_model(spec, base_dir=None) -> tuple:
    """``(family, n_layers, n_objectives)`` from the model config alone (no weights).

    Raises ``SpecError`` (``model.max_length``) when ``model.max_length`` exceeds the model's position limit,
    (``model.head_init``) for an unknown ``model.head_init``.
    """
    from .discover import family_or_discovered_config
    from .head_init import check_head_init

    check_head_init(getattr(spec, "head_init", None))
    cfg = model_config(spec, base_dir)
    check_max_length(spec, cfg)
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    return family_or_discovered_config(cfg), int(n_layers), int(spec.num_labels)
