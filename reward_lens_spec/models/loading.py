"""Load a reward model named by a ``ModelSpec``: built-in tiny, local folder, hub id, GGUF.

Safety: every checkpoint read (config, tokenizer, model) goes through the one guarded loader
``models.hub``: ``trust_remote_code`` as a bool from ``model.trust_remote_code`` (default false),
never ``None``, so transformers never asks on stdin and a checkpoint's own Python (``auto_map``)
never runs unless asked for: a checkpoint of a model type transformers ships loads with
transformers' class, any other is refused with a ``SpecError`` naming ``model.trust_remote_code``.
Weights load from safetensors only unless ``model.allow_pickle=true``. A checkpoint without a
reward head (causal LM, base model, GGUF) is refused unless ``model.head_init`` says how to make
one deterministically (``models.head_init``). ``model.interventions`` (exported erasers, steering vectors,
heads) are applied last (``models.apply_artifacts``). The returned
``LoadedModel`` bundles the HF model (eval mode), its tokenizer, the family
table, the float32 reward head and the final-norm description.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SpecError
from .placement import input_device, meta_skeleton, offload_dir, place_built, plan_map, record, resolve_device
from .armorm import is_armorm_folder, load_armorm
from .discover import family_or_discovered
from .families import Family
from .head import FinalNorm, ReadoutHead, read_final_norm, read_head
from .head_init import init_missing_head
from ..admission import permissions
from .hub import load_classifier, load_tokenizer, remote_code_error, trust_remote_code  # noqa: F401  (public here too)
from .sources import gguf_for, resolve_source  # noqa: F401  (public here too)
from .tiny import TINY_CONFIGS, build_tiny
from .head import get_module
from .gated_head import attach_gated_head
from .hub import load_config
from .apply_artifacts import apply

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    family: Family
    head: ReadoutHead
    norm: FinalNorm
    dtype: str
    device: str
    signal: object = None      # the kind of reward signal's own record (kinds.judge / kinds.prm), else None
    interventions: list | None = None   # model.interventions applied (models.apply_artifacts): their records
    placement: dict | None = None   # model.device_map's record (models.placement.record), else None

    @property
    def n_layers(self) -> int:
        return len(get_module(self.model, self.family.layers))

    @property
    def d_model(self) -> int:
        return int(self.head.W.shape[1])


def load_model(spec, base_dir: str | None = None) -> LoadedModel:
    """Load the model described by ``spec`` (a ``ModelSpec``).

    Every checkpoint read goes through ``models.hub`` (``trust_remote_code`` from the spec, never stdin);
    a checkpoint without a reward head is refused or given one per ``model.head_init``
    (``models.head_init``). Raises ``SpecError`` naming the config key at fault.
    """
    device = resolve_device(str(getattr(spec.device, "value", spec.device)))
    dtype = str(getattr(spec.dtype, "value", spec.dtype))
    padding_side = str(getattr(spec.padding_side, "value", spec.padding_side))
    trust, pickle = permissions(spec)               # every spec's flags through the model door, any source
    kind, loc = resolve_source(spec.source, base_dir)
    placed, placement = getattr(spec, "device_map", None) is not None, None
    if kind == "builtin":
        if loc not in TINY_CONFIGS:
            raise SpecError("model.source", f"unknown built-in model '{loc}'.", value=loc, options=TINY_CONFIGS)
        gated = str(getattr(spec.head, "value", spec.head)) == "gated"
        model, tok = build_tiny(loc, seed=spec.seed, num_labels=1 if gated else spec.num_labels,
                                padding_side=padding_side)
        if gated:
            attach_gated_head(model, spec.num_labels, seed=spec.seed)
        if placed:
            model.to(dtype=DTYPES[dtype])
            placement = place_built(model, spec, DTYPES[dtype], base_dir)
    elif kind == "folder" and is_armorm_folder(loc):                 # ArmoRM natively (models.armorm)
        if placed:
            raise SpecError("model.device_map", f"{loc} is an ArmoRM checkpoint, which loads on one device.",
                            fix="drop model.device_map (and model.max_memory, model.offload_folder).")
        if str(getattr(spec.head, "value", spec.head)) != "gated":
            raise SpecError("model.head", f"{loc} is an ArmoRM checkpoint (a gated multi-objective head).",
                            fix="set model.head=gated.")
        model, tok = load_armorm(loc, dtype=DTYPES[dtype], attn_implementation=spec.attn_implementation,
                                 trust_remote_code=trust)
        tok.padding_side = padding_side
    else:
        gguf = gguf_for(spec, kind, loc)
        if gguf:
            if not (kind != "folder" or (Path(loc) / gguf).exists()):
                raise SpecError("model.gguf_file", f"{gguf} not found in {loc}.",
                                fix=f"set model.gguf_file to a .gguf file in {loc}.")
            for need in ("gguf", "accelerate"):
                if importlib.util.find_spec(need) is None:
                    raise SpecError("model.gguf_file", f"loading GGUF needs the '{need}' package.",
                                    fix="pip install 'reward_lens_spec[real]'")
        common = dict(trust_remote_code=trust, source=spec.source, gguf_file=gguf, revision=spec.revision or None)
        tok = load_tokenizer(loc, **common)
        plan = folder = None
        if placed:                                   # the map is planned from the config, before any weight
            plan = plan_map(spec, meta_skeleton(load_config(loc, **common), spec.num_labels), DTYPES[dtype])
            if gguf and "disk" in plan.values():         # transformers' GGUF loader refuses disk offload
                raise SpecError("model.max_memory", f"{sum(v == 'disk' for v in plan.values())} modules would go to "
                                f"disk, and a GGUF checkpoint ({gguf}) cannot be offloaded to disk.",
                                fix="raise model.max_memory so it fits on the CPU and GPUs, or load a de-quantized "
                                "safetensors folder (e.g. what `fit` writes: model.source=FOLDER model.gguf_file=null).")
            folder = offload_dir(spec, base_dir)
        model, missing = load_classifier(loc, num_labels=spec.num_labels, dtype=DTYPES[dtype],
                                         allow_pickle=pickle, device_map=plan, offload_folder=folder,
                                         attn_implementation=spec.attn_implementation or None, **common)
        if placed:
            placement = record(spec, plan, folder, model)
        init_missing_head(model, missing, head_init=getattr(spec, "head_init", None), seed=spec.seed,
                          source=spec.source)
        tok.padding_side = padding_side
    lm = wrap_model(spec.name, model, tok, dtype=dtype, device=device, objectives=tuple(spec.objectives) or None,
                    placement=placement)
    want_gated = str(getattr(spec.head, "value", spec.head)) == "gated"
    if want_gated != lm.head.gated:
        raise SpecError("model.head", f"model.head={'gated' if want_gated else 'linear'} but the loaded head is "
                        f"{'gated' if lm.head.gated else 'linear'}.", fix="set model.head to match the checkpoint.")
    if getattr(spec, "interventions", None):          # exported artifacts: erase, steer, head (models.artifacts)
        lm = apply(lm, spec, base_dir, wrap=wrap_model)
    return lm


def wrap_model(name: str, model, tokenizer, *, dtype: str = "float32", device: str = "cpu",
               objectives: tuple[str, ...] | None = None, placement: dict | None = None) -> LoadedModel:
    """Bundle an in-memory HF sequence classifier (tests, organisms, fitted heads) as a ``LoadedModel``.

    ``placement``: a model Accelerate placed over devices (``models.placement.record``): it stays where it
    is, and ``device`` becomes the device input ids go to."""
    if model.config.pad_token_id is None:
        # HF's pooling needs some pad id for batches > 1; our readout comes from the mask.
        model.config.pad_token_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                     else tokenizer.eos_token_id)
    if placement is None:
        model.to(device=device, dtype=DTYPES[dtype])
    else:
        device = str(input_device(model))
    model.eval()
    family = family_or_discovered(model, tokenizer)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, family=family,
                       head=read_head(model, family, objectives), norm=read_final_norm(model, family),
                       dtype=dtype, device=device, placement=placement)
