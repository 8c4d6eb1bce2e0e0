"""A content hash of a model and its tokenizer: same numbers in, same fingerprint out.

``model_fingerprint(model, tokenizer)`` is the sha256 hex digest of, in order:

(a) every tensor of ``model.state_dict()`` (parameters and PERSISTENT buffers), sorted by name (a tensor a
    device map offloaded is read from its Accelerate weights map, ``models.placement``, so placement never
    changes the fingerprint),
    each as name + dtype + shape + bytes. Floating tensors are hashed as fp32 bytes (exact for
    fp16/bf16; fp64 kept as is), streamed in chunks so no second full copy of the model is held.
    A tensor shared under several names (tied weights) is hashed once, under its first name;
    the other names are recorded as aliases.
(b) the config's ``to_diff_dict()`` minus volatile keys (versions, paths, dtype, attention
    implementation, cache and output switches), as sorted JSON. It includes
    ``reward_lens_head_init`` (how ``load_model`` made a head the checkpoint lacked, from
    ``model.head_init``; ``models.head_init``). ``architectures`` is kept; when
    the config has none (a model built in code) the model's class name stands in, as
    ``save_pretrained`` would write.
(c) the tokenizer: sorted vocabulary, special tokens map, chat template, and the ids of a fixed
    probe text (this captures the BOS/EOS post-processing).

It does not depend on the folder a model was loaded from, nor on the config's dtype key.
"""
from __future__ import annotations

import hashlib
import json
import struct

import torch
from .placement import offloaded_value

_CHUNK = 1 << 22  # elements per streamed chunk
_VOLATILE = {"transformers_version", "_name_or_path", "name_or_path", "torch_dtype", "dtype",
             "_commit_hash", "attn_implementation", "_attn_implementation",
             "_attn_implementation_autoset", "_attn_implementation_internal", "use_cache",
             "return_dict", "_experts_implementation"}
_PROBE = "Hello, world! {probe} <s> 123\n\u00e9\u4e2d"


def _put(h, data: bytes | str) -> None:
    """Length-prefixed update, so field boundaries are unambiguous."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _hash_tensor(h, name: str, t: torch.Tensor) -> None:
    t = t.detach()
    _put(h, f"tensor:{name}:{str(t.dtype)}:{tuple(t.shape)}")
    flat = t.reshape(-1)
    as_dtype = torch.float32 if (t.is_floating_point() and t.dtype != torch.float64) else None
    if t.dtype == torch.bool:
        as_dtype = torch.uint8
    for start in range(0, flat.numel(), _CHUNK):
        chunk = flat[start:start + _CHUNK].to(device="cpu", dtype=as_dtype or flat.dtype).contiguous()
        h.update(memoryview(chunk.numpy()).cast("B"))


def _storage_key(t: torch.Tensor):
    if t.numel() == 0 or t.device.type == "meta":
        return None
    return (t.device.type, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()
                if k not in _VOLATILE and not str(k).startswith("output_")}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, torch.dtype):
        return str(obj)
    return obj


def config_dict(model) -> dict:
    """The semantically relevant config fields of ``model`` (see module doc, part b)."""
    config = getattr(model, "config", None)
    if config is None:
        return {}
    d = config.to_diff_dict() if hasattr(config, "to_diff_dict") else dict(vars(config))
    d = _clean(d)
    if not d.get("architectures"):
        d["architectures"] = [type(model).__name__]
    return d


def tokenizer_dict(tokenizer) -> dict:
    """The vocabulary-relevant parts of ``tokenizer`` (see module doc, part c)."""
    if tokenizer is None:
        return {}
    vocab = sorted((str(k), int(v)) for k, v in tokenizer.get_vocab().items())
    specials = {str(k): (v if isinstance(v, str) else [str(x) for x in v]) if v is not None else None
                for k, v in dict(getattr(tokenizer, "special_tokens_map", {}) or {}).items()}
    probe = tokenizer(_PROBE, add_special_tokens=True)["input_ids"]
    return {"vocab": vocab, "special_tokens": specials,
            "chat_template": getattr(tokenizer, "chat_template", None),
            "probe_ids": [int(i) for i in probe]}


# the label config and how a missing head was made (``reward_lens_head_init``, models.head_init)
_HEAD_CONFIG = ("num_labels", "id2label", "label2id", "problem_type", "reward_lens_head_init")


def model_fingerprint(model, tokenizer, *, without_head: str | None = None) -> str:
    """sha256 hex digest (64 chars) of weights, config and tokenizer; see module doc.

    ``without_head``: the head module's name (e.g. ``score``): leave out its tensors and the
    label config, so a body with a new head keeps its fingerprint. Frames use this (activations,
    and so a frame, do not depend on the head); ``reward_lens_spec.frames.resolve``.
    """
    h = hashlib.sha256()
    _put(h, "reward_lens_spec.fingerprint.v1" + (".body" if without_head else ""))
    state = model.state_dict(keep_vars=True)
    if without_head:
        state = {k: v for k, v in state.items() if not (k == without_head or k.startswith(without_head + "."))}
    seen: dict = {}
    for name in sorted(state):
        t = state[name]
        key = _storage_key(t)
        if t.device.type == "meta":            # offloaded by a device map (models.placement): its real value, read
            t = offloaded_value(model, name, t)
        if key is not None and key in seen:
            _put(h, f"alias:{name}={seen[key]}")
            continue
        if key is not None:
            seen[key] = name
        _hash_tensor(h, name, t)
    cfg = config_dict(model)
    if without_head:
        cfg = {k: v for k, v in cfg.items() if k not in _HEAD_CONFIG}
    _put(h, "config:" + json.dumps(cfg, sort_keys=True, default=str))
    _put(h, "tokenizer:" + json.dumps(tokenizer_dict(tokenizer), sort_keys=True, default=str))
    return h.hexdigest()
