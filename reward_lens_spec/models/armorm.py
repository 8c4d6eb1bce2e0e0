"""ArmoRM (Wang et al. 2024, "Interpretable Preferences via Multi-Objective Reward Modeling and
Mixture-of-Experts"; RLHFlow/ArmoRM-Llama3-8B-v0.1), loaded natively, without its remote code.

A checkpoint folder whose ``config.json`` names ``LlamaForRewardModelWithGating`` holds, under
these exact names (the published modeling file's):

  model.*                  a Llama backbone (``LlamaModel``; its output is the final-norm state)
  regression_layer.weight  (objective, d_model), no bias: per-objective rewards ``r = W h``
  gating.layers.{i}        an MLP d_model → hidden (×``gating_n_hidden``, ReLU) → objective
  gating.logit_scale       (1,)
  reward_transform_matrix  (objective, objective), ``T``

with config keys ``num_objectives`` (19), ``gating_temperature`` (10), ``gating_hidden_dim``
(1024), ``gating_n_hidden`` (3) (the modeling file's defaults when absent). The score is

    g     = softmax(MLP(h_gate) / temperature) · logit_scale          (objective,)
    score = Σ_k g_k (r @ T)_k,     r = W h_readout

where ``h_readout`` is the final-norm state at the last attended token and ``h_gate`` the one at
the gating token: the start of the LAST occurrence of ``<|eot_id|><|start_header_id|>assistant
<|end_header_id|>\\n\\n`` (ids ``GATING_PATTERN``), the ``<|eot_id|>`` that ends the user's turn.
Under causal attention the gate depends on the prompt only.

``ArmoRM`` is an ``nn.Module`` with that state dict; its ``score`` submodule maps final-norm states
(batch, token, d_model) to the gated score per token (batch, token, 1) with the gate of the same
forward, detached (gradients see the gate frozen). A forward over a cached prefix (patching's
re-runs) has no gating token and returns NaN logits; readers there use the captured gate.
``read_armorm_head`` gives the ``ReadoutHead``: ``W`` the untransformed regression rows, ``T``, and
``context_gate=True`` (rewards need each row's captured gate weights). Objective names default
to ArmoRM's 19 published attributes. A folder missing any expected tensor, holding an unexpected
one (e.g. a ``score`` head), or with a shape that does not fit is refused (``SpecError``,
``model.source``) naming the tensors; there is no fallback to a generic head.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from ..errors import CaptureError, SpecError
from .hub import load_config, load_tokenizer
from .readout import ReadoutHead
from safetensors.torch import load_file
from transformers import LlamaModel

ARCHITECTURE = "LlamaForRewardModelWithGating"
GATING_PATTERN = (128009, 128006, 78191, 128007, 271)
OBJECTIVES = (
    "helpsteer-helpfulness", "helpsteer-correctness", "helpsteer-coherence", "helpsteer-complexity",
    "helpsteer-verbosity", "ultrafeedback-overall_score", "ultrafeedback-instruction_following",
    "ultrafeedback-truthfulness", "ultrafeedback-honesty", "ultrafeedback-helpfulness", "beavertails-is_safe",
    "prometheus-score", "argilla-overall_quality", "argilla-judge_lm", "code-complexity", "code-style",
    "code-explanation", "code-instruction-following", "code-readability",
)


def is_armorm_folder(loc) -> bool:
    """Whether ``loc/config.json`` names ArmoRM's architecture."""
    p = Path(loc) / "config.json"
    try:
        return ARCHITECTURE in (json.loads(p.read_text()).get("architectures") or [])
    except (OSError, ValueError):
        return False


def gating_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Index of the gating token per row: start of the last ``GATING_PATTERN`` among attended tokens;
    −1 where a row has none. ``input_ids``: LongTensor[batch, token]."""
    B, T = input_ids.shape
    n = len(GATING_PATTERN)
    if T < n:
        return torch.full((B,), -1, dtype=torch.long, device=input_ids.device)
    pat = torch.tensor(GATING_PATTERN, device=input_ids.device)
    win = input_ids.unfold(1, n, 1)                                   # batch × (T − n + 1) × n
    hit = (win == pat).all(-1)
    if attention_mask is not None:
        hit &= attention_mask.bool().unfold(1, n, 1).all(-1)
    idx = torch.arange(hit.shape[1], device=input_ids.device).expand(B, -1)
    return torch.where(hit, idx, torch.full_like(idx, -1)).max(-1).values


class GatingNetwork(nn.Module):
    """``softmax(MLP(x) / temperature) · logit_scale``: x (…, d_model) → (…, objective)."""

    def __init__(self, d_model: int, n_objectives: int, temperature: float, hidden: int, n_hidden: int):
        super().__init__()
        self.temperature = float(temperature)
        self.logit_scale = nn.Parameter(torch.ones(1))
        dims = [d_model] + [hidden] * n_hidden + [n_objectives]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return torch.softmax(x / self.temperature, dim=-1) * self.logit_scale[0]


class GatedScore(nn.Module):
    """Per-token gated score (batch, token, d_model) → (batch, token, 1), the gate given per row."""

    def __init__(self, owner):
        super().__init__()
        self._owner = [owner]                                         # not a submodule: no duplicate weights

    def forward(self, hidden, gate):
        o = self._owner[0]
        adjusted = o.regression_layer(hidden) @ o.reward_transform_matrix.to(hidden.dtype)
        return (adjusted * gate[:, None, :].to(hidden.dtype)).sum(-1, keepdim=True)


class ArmoRM(nn.Module):
    """ArmoRM with the published module names (see the module docstring)."""

    is_armorm = True

    def __init__(self, config, attn_implementation: str | None = "eager"):
        super().__init__()
        if attn_implementation:
            config._attn_implementation = attn_implementation
        self.config = config
        d = config.hidden_size
        k = int(getattr(config, "num_objectives", 19))
        self.model = LlamaModel(config)
        self.regression_layer = nn.Linear(d, k, bias=False)
        self.reward_transform_matrix = nn.Parameter(torch.eye(k), requires_grad=False)
        self.gating = GatingNetwork(d, k, getattr(config, "gating_temperature", 10),
                                    int(getattr(config, "gating_hidden_dim", 1024)),
                                    int(getattr(config, "gating_n_hidden", 3)))
        self.score = GatedScore(self)

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs):
        cached = kwargs.get("cache", kwargs.get("past_key_values"))
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         inputs_embeds=inputs_embeds, **kwargs)
        hidden = out.last_hidden_state
        B, T = hidden.shape[:2]
        fresh = cached is None or cached.get_seq_length() == 0
        if fresh and input_ids is None:
            raise CaptureError("ArmoRM: the gating token is found in input_ids; this forward passed only "
                               "inputs_embeds (attribution patching is not supported for ArmoRM).")
        if fresh:
            pos = gating_positions(input_ids, attention_mask if attention_mask is not None and
                                   attention_mask.dim() == 2 else None)
            if bool((pos < 0).any()):
                raise CaptureError(f"ArmoRM: {int((pos < 0).sum())} sequence(s) lack the gating pattern "
                                   f"{list(GATING_PATTERN)} (<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
                                   "\\n\\n). Fix: use model.format=chat_template with the Llama-3 chat template.")
            gate = self.gating(hidden[torch.arange(B, device=hidden.device), pos]).detach()
        else:                                                          # no gating token in a cached re-run
            gate = torch.full((B, self.regression_layer.out_features), float("nan"), device=hidden.device,
                              dtype=hidden.dtype)
        per_token = self.score(hidden, gate)
        pad = self.config.pad_token_id
        if input_ids is not None and pad is not None:
            last = (torch.arange(T, device=hidden.device) * (input_ids != pad)).argmax(-1)
        else:
            last = torch.full((B,), T - 1, device=hidden.device)
        logits = per_token[torch.arange(B, device=hidden.device), last]
        kv = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        return SimpleNamespace(logits=logits, past_key_values=kv, cache=kv, gate=gate)


def _read_state(loc: Path) -> dict:
    single = loc / "model.safetensors"
    index = loc / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state = {}
        for f in files:
            state.update(load_file(loc / f))
        return state
    raise SpecError("model.source", f"{loc} has no model.safetensors (or sharded index) for its ArmoRM weights.",
                    fix="save the checkpoint as safetensors.")


def load_armorm(loc, *, dtype=torch.float32, attn_implementation: str | None = "eager",
                trust_remote_code: bool = False):
    """Build ``ArmoRM`` from the folder ``loc`` and load its tensors; return ``(model, tokenizer)``.

    Config and tokenizer are read by the guarded loader (``models.hub``) with ``trust_remote_code``
    (a bool; never stdin); the weights are read from safetensors here, into this module's own class.
    Raises ``SpecError`` (``model.source``) for missing, unexpected or misshapen tensors,
    (``model.trust_remote_code``) when the config or tokenizer needs the folder's own code.
    """
    loc = Path(loc)
    cfg = load_config(loc, trust_remote_code=trust_remote_code, source=str(loc))
    if cfg.model_type != "llama":
        raise SpecError("model.source", f"ArmoRM folder {loc} has model_type {cfg.model_type!r}; its backbone "
                        "must be Llama.", fix="check config.json.")
    model = ArmoRM(cfg, attn_implementation)
    state = _read_state(loc)
    want = model.state_dict()
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    bad = sorted(k for k in set(want) & set(state) if tuple(want[k].shape) != tuple(state[k].shape))
    if missing or extra or bad:
        parts = ([f"missing {missing[:8]}"] if missing else []) + ([f"unexpected {extra[:8]}"] if extra else []) + \
            [f"{k}: {tuple(state[k].shape)} in the file, {tuple(want[k].shape)} expected" for k in bad[:8]]
        raise SpecError("model.source", f"{loc} declares {ARCHITECTURE} but its tensors do not fit ArmoRM: "
                        f"{'; '.join(parts)}.", fix="point model.source at a complete ArmoRM checkpoint "
                        "(regression_layer, gating.layers.*, gating.logit_scale, reward_transform_matrix, model.*).")
    model.load_state_dict(state, strict=True)
    model.to(dtype).eval()
    tok = load_tokenizer(loc, trust_remote_code=trust_remote_code, source=str(loc))
    return model, tok


def read_armorm_head(model, objectives: tuple[str, ...] | None = None):
    """The ``ReadoutHead`` of an ``ArmoRM``: untransformed rows ``W``, transform ``T``, a context gate."""
    W = model.regression_layer.weight.detach().float().cpu().numpy().copy()
    T = model.reward_transform_matrix.detach().double().cpu().numpy().copy()
    k = W.shape[0]
    names = tuple(objectives) if objectives else (OBJECTIVES if k == len(OBJECTIVES) else
                                                  tuple(f"objective_{i}" for i in range(k)))
    if len(names) != k:
        raise SpecError("model.objectives", f"{len(names)} names given for ArmoRM's {k} objectives.",
                        fix=f"list exactly {k} names, or leave it empty.")
    return ReadoutHead(W=W, b=np.zeros(1, np.float32), objectives=names, T=T, context_gate=True)
