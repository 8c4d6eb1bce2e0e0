"""A model's description from its config alone (no weights): transformers config, family, depth.

The description is remembered per checkpoint bytes in the per-user signed cache (``signed_cache``, kind
``describe``): an entry another user planted or edited is not taken. The config is read through the guarded loader ``models.hub`` with ``trust_remote_code=model.trust_remote_code``
(default false, so a checkpoint's own Python never runs and transformers never asks on stdin); ``validate``
loads no model and runs no code.
"""
from __future__ import annotations

from ..errors import SpecError
from ..signed_cache import read_signed, write_signed
from ..admission import permissions
from .families import FAMILIES, family_for
from .fingerprint_cache import weights_key
from .head_init import check_head_init
from .hub import load_config


def model_config(spec, base_dir=None):
    """The transformers config of ``spec`` (a ``ModelSpec``), read without weights."""
    from .loading import gguf_for, resolve_source
    from .tiny import TINY_CONFIGS, tiny_config

    trust, _ = permissions(spec)                    # every spec's flags through the model door, any source
    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "builtin":
        if loc not in TINY_CONFIGS:
            raise SpecError("model.source", f"unknown built-in model '{loc}'.", value=loc, options=TINY_CONFIGS)
        cfg = tiny_config(loc)
    else:
        cfg = load_config(loc, trust_remote_code=trust, source=spec.source,
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


def check_max_length(spec, limit: tuple[int, str] | None) -> None:
    """``model.max_length`` must fit the model's positions (``limit``: ``position_limit`` of its config; beyond
    them GPT-2's position lookup fails with an ``IndexError`` and rotary models run outside their trained range).
    Raises ``SpecError`` naming both numbers."""
    max_length = getattr(spec, "max_length", None)
    if limit is not None and isinstance(max_length, int) and max_length > limit[0]:
        raise SpecError("model.max_length", f"{max_length} is beyond the position limit of '{spec.name}' "
                        f"({limit[1]}={limit[0]} in its config).", value=max_length,
                        fix=f"set model.max_length to at most {limit[0]}.")


def _remembered(key: str | None):
    """``(family, n_layers, position limit)`` a previous read of the same checkpoint bytes remembered, or ``None``
    (no key, no entry, or an entry that does not name a tabled family and a positive depth)."""
    doc = read_signed("describe", key) if key else None
    if not isinstance(doc, dict):
        return None
    mt, n, lim = doc.get("model_type"), doc.get("n_layers"), doc.get("position_limit")
    if not any(mt in f.model_types for f in FAMILIES.values()) or not isinstance(n, int) or n < 1:
        return None
    ok_lim = lim is None or (isinstance(lim, list) and len(lim) == 2 and isinstance(lim[0], int))
    return (family_for(mt), n, tuple(lim) if lim else None) if ok_lim else None


def describe_model(spec, base_dir=None) -> tuple:
    """``(family, n_layers, n_objectives)`` from the model config alone (no weights).

    The config's model type, depth and position limit are remembered under the checkpoint's weights key
    (``models.fingerprint_cache.weights_key``: its files' digests, or a built-in model's code), so describing
    the same bytes again imports neither transformers nor torch; a discovered (untabled) family is always read.
    Raises ``SpecError`` (``model.max_length``) when ``model.max_length`` exceeds the model's position limit,
    (``model.head_init``) for an unknown ``model.head_init``.
    """
    check_head_init(getattr(spec, "head_init", None))
    key = weights_key(spec, base_dir)
    found = _remembered(key)
    if found is None:
        from .discover import family_or_discovered_config

        cfg = model_config(spec, base_dir)
        n_layers = int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer"))
        found = (family_or_discovered_config(cfg), n_layers, position_limit(cfg))
        if key and not found[0].name.startswith("discovered:"):
            write_signed("describe", key, {"model_type": cfg.model_type, "n_layers": n_layers,
                                           "position_limit": found[2]})
    family, n_layers, limit = found
    check_max_length(spec, limit)
    return family, n_layers, int(spec.num_labels)
