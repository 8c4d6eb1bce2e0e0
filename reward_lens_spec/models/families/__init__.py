"""Family adapters as data: one small table per model family.

A ``Family`` maps the standard site vocabulary (TransformerLens's names:
``embed``, ``resid_pre``, ``resid_post``, ``attn_out``, ``mlp_out``) to module
paths inside a HF ``*ForSequenceClassification`` model. Adding a family is
adding a table module here that registers its ``Family`` rows (``FAMILIES.register(Family(...))``);
``FAMILIES`` (``registries.FAMILIES``) imports every module of this folder on first use.

Conventions
-----------
- Paths are dotted attribute paths from the top-level model; ``layers`` is a
  ``ModuleList``; ``attn`` and ``mlp`` are relative to one layer and name the
  module whose *output* is exactly what that component adds to the residual
  stream (for Gemma-2 that is the post-norm, not the attention itself).
- ``embed`` is read as ``resid_pre`` of layer 0 (the residual stream after any
  embedding scale and learned positions), so it is what the first layer sees.
- ``o_proj`` is the attention output projection; ``attn_z`` (its input at the
  readout token) splits the attention output into per-head contributions.
- ``norm`` describes the final norm: ``"rms"`` (``x / rms(x) * (offset + g)``)
  or ``"layer"`` (``(x - mean) / std * g + beta``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import SpecError
from ...registries import FAMILIES

SITES = ("embed", "resid_pre", "resid_post", "attn_out", "mlp_out", "attn_z", "final_norm", "readout")


@dataclass(frozen=True)
class Family:
    """One model family's site table (see the module docstring)."""

    name: str
    model_types: tuple[str, ...]
    layers: str
    attn: str
    mlp: str
    final_norm: str
    head: str = "score"
    norm: str = "rms"              # "rms" | "layer"
    norm_offset: float = 0.0       # Gemma-2 RMSNorm scales by (1 + g)
    norm_eps_attr: str = "rms_norm_eps"
    norm_eps: float | None = None          # set by structure discovery (models.discover) when found numerically
    o_proj: str = "self_attn.o_proj"       # relative to a layer; its input z is the per-head concat
    o_proj_conv1d: bool = False            # GPT-2's Conv1D stores W as (in, out)
    attn_post_norm: str | None = None      # Gemma-2: RMSNorm between o_proj and the residual
    sites: tuple[str, ...] = SITES

    def has_site(self, site: str) -> bool:
        return site in self.sites




def family_for(model_type: str) -> Family:
    """Return the family whose table covers HF ``config.model_type``.

    Raises ``SpecError`` (field ``model.family``) for an unsupported type.
    """
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    types = [t for f in FAMILIES.values() for t in f.model_types]
    raise SpecError("model.family", f"no family adapter for model_type '{model_type}'.", value=model_type,
                    options=types, fix="add a table under reward_lens_spec/models/families/.")
