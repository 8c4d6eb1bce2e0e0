"""A checkpoint without a reward head: refused, or given one deterministically (``model.head_init``).

transformers fills every tensor a checkpoint lacks with fresh random numbers on each load. For the
reward head of a causal-LM or base checkpoint (``score.weight MISSING``, also every GGUF file) that
would make every load a different model. So ``load_model`` calls ``init_missing_head`` with the
names transformers reports missing:

* ``model.head_init: null`` (default): a missing head is refused (``SpecError`` naming
  ``model.head_init``);
* ``seeded``: each missing head weight is drawn as ``0.02 · N(0, 1)`` from
  ``torch.Generator().manual_seed(model.seed)`` (float32, then cast to the model's dtype); a missing
  bias is zero;
* ``zeros``: every missing head tensor is zero (all rewards 0; a start for fitting).

Only the tensors the checkpoint lacks are made; a head it has is never touched. The choice is
recorded in the model config as ``reward_lens_head_init`` (``"seeded:seed=<s>"`` or ``"zeros"``), so
the model fingerprint covers it (the head tensors themselves are hashed anyway). A checkpoint that
lacks tensors outside the head is refused (``model.source``): those would be random too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SpecError
from .families import FAMILIES

HEAD_INIT = ("seeded", "zeros")
CONFIG_KEY = "reward_lens_head_init"
SCALE = 0.02

if TYPE_CHECKING:                  # torch is imported where a head is made: validating a config needs none
    import torch


def check_head_init(value) -> str | None:
    """``value`` if it is ``None`` or one of ``HEAD_INIT``; else a ``SpecError`` naming ``model.head_init``."""
    if value is None or value in HEAD_INIT:
        return value
    raise SpecError("model.head_init", f"unknown head_init {value!r}.", value=value, options=HEAD_INIT,
                    fix="use model.head_init=seeded, model.head_init=zeros, or leave it null to refuse a missing head.")


def head_modules(model) -> set[str]:
    """Names of the top-level modules that are the reward head: the family table's ``head`` where the
    model type has one, and every top-level ``Linear`` with ``num_labels`` outputs."""
    from torch import nn

    names = {f.head for f in FAMILIES.values() if getattr(model.config, "model_type", None) in f.model_types}
    k = getattr(model.config, "num_labels", None)
    names |= {n for n, m in model.named_children() if isinstance(m, nn.Linear) and m.out_features == k}
    return names


def draw_head(shape, seed: int) -> "torch.Tensor":
    """The ``seeded`` head weight: ``0.02 · N(0, 1)`` of ``shape`` from ``torch.Generator().manual_seed(seed)``."""
    import torch

    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32) * SCALE


def init_missing_head(model, missing_keys, *, head_init: str | None, seed: int, source: str = "") -> str | None:
    """Make the head tensors in ``missing_keys`` deterministically (see module doc); return what was recorded
    in the config (``None`` when nothing was missing).

    Raises ``SpecError``: ``model.source`` when tensors outside the head are missing, ``model.head_init`` when
    the head is missing and ``head_init`` is null (or unknown).
    """
    head_init = check_head_init(head_init)
    missing = sorted(str(k) for k in missing_keys or ())
    if not missing:
        return None
    heads = head_modules(model)
    head_keys = [k for k in missing if k.split(".", 1)[0] in heads]
    other = [k for k in missing if k not in head_keys]
    if other:
        shown = ", ".join(other[:8]) + (", ..." if len(other) > 8 else "")
        raise SpecError("model.source", f"'{source}' lacks {len(other)} tensor(s) outside the reward head ({shown}); "
                        "transformers would fill them with random numbers on every load.",
                        fix="point model.source at a complete checkpoint of this architecture.")
    if head_init is None:
        raise SpecError("model.head_init", f"'{source}' has no reward head ({', '.join(head_keys)} missing): "
                        "transformers would draw a new random one on every load.",
                        fix="set model.head_init=seeded (drawn from model.seed) or model.head_init=zeros, or point "
                            "model.source at a checkpoint with a fitted head (reward-lens-spec fit).")
    import torch

    with torch.no_grad():
        for key in head_keys:
            param = model.get_parameter(key)
            if head_init == "zeros" or key.endswith("bias"):
                param.zero_()
            else:
                param.copy_(draw_head(param.shape, seed).to(dtype=param.dtype, device=param.device))
    record = f"seeded:seed={int(seed)}" if head_init == "seeded" else "zeros"
    setattr(model.config, CONFIG_KEY, record)
    return record
