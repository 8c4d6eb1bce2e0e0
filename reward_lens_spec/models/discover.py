"""A family table for a decoder reward model nobody wrote one for: found by structure, kept only if exact.

``discover_family(model)`` reads the module tree of a HF ``*ForSequenceClassification``:

  layers      the outermost ``ModuleList`` with ``config.num_hidden_layers`` entries
  final norm  the last child of the layers' parent whose class name contains "norm"
  head        the top-level ``Linear`` with ``num_labels`` outputs (``score``, ``classifier`` …)
  attn, mlp   each layer's child whose name or class says attention / MLP (``self_attn``,
              ``attention``, ``attn``; ``mlp``, ``feed_forward``, ``ffn``)
  o_proj      the attention's output ``Linear`` (``o_proj``, ``dense``, ``out_proj``, ``c_proj``),
              else no ``attn_z`` site
  norm kind   decided numerically: the final norm applied to small random vectors must equal
              RMSNorm (gain g or 1 + g) or LayerNorm to 1e-5 for one eps (the module's, the config's,
              else 1e-5, 1e-6, 1e-8, 1e-12), else refused

``verify_family(model, tokenizer, family)`` then runs one probe batch (two left-padded texts) and
accepts the table only if, at the readout token of every row,
  (1) each layer's resid_post − resid_pre = attn_out + mlp_out (so embed + Σ components = the last
      residual; checked too),
  (2) the described final norm of the last residual = the final-norm output h, and
  (3) W·h + b = the head's output there = the model's pooled logits,
each within 1e-4 relative to the scale of the compared vectors (float32). Otherwise a
``SpecError`` (``model.family``) names what did not add up: which layer and by how much, and, when
an "attention output" (or MLP output) already contains the residual stream — its excess over the
layer's update equals the layer's input — says so, since reading that module would count the
residual twice. Tables of ``models.families`` are always preferred; this runs only when
``family_for`` has none. At plan time (no weights) the same walk runs on a meta-device copy built
from the config (``discover_from_config``), without the numeric checks.
"""
from __future__ import annotations

import re

import numpy as np
import torch
from torch import nn

from ..errors import SpecError
from .families import SITES, Family
from .families import FAMILIES, family_for
from .head import read_final_norm, read_head
from .padding import pad_batch
import transformers as tf

_ATTN = re.compile(r"attn|attention", re.I)
_MLP = re.compile(r"mlp|feed_?forward|ffn", re.I)
_OPROJ = ("o_proj", "dense", "out_proj", "c_proj", "o")
_EPS_ATTRS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon")
_TOL = 1e-4


def _refuse(model, what: str) -> SpecError:
    t = getattr(model.config, "model_type", type(model).__name__)
    return SpecError("model.family", f"no family table for model_type '{t}', and structure discovery refused it: "
                     f"{what}", fix="add a table under reward_lens_spec/models/families/.")


def _paths(model):
    n = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    lists = [(p, m) for p, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n and p]
    if not lists:
        raise _refuse(model, f"no ModuleList of {n} layers (config.num_hidden_layers).")
    layers_path, layers = min(lists, key=lambda pm: pm[0].count("."))
    parent_path = layers_path.rpartition(".")[0]
    parent = model.get_submodule(parent_path) if parent_path else model
    names = [c for c, _ in parent.named_children()]
    norms = [c for c in names[names.index(layers_path.rpartition(".")[2]) + 1:]
             if "norm" in type(getattr(parent, c)).__name__.lower()]
    if not norms:
        raise _refuse(model, f"no final norm after {layers_path} among {parent_path or 'the model'}'s children {names}.")
    final_norm = f"{parent_path}.{norms[-1]}" if parent_path else norms[-1]
    k = model.config.num_labels
    heads = [c for c, m in model.named_children() if isinstance(m, nn.Linear) and m.out_features == k]
    if len(heads) != 1:
        raise _refuse(model, f"expected one top-level Linear head with {k} output(s), found {heads or 'none'}.")
    layer = layers[0]
    kids = list(layer.named_children())

    def pick(rx, what):
        hits = [c for c, m in kids if rx.search(c) and not isinstance(m, (nn.Dropout, nn.Identity))
                and "norm" not in c.lower() and "norm" not in type(m).__name__.lower()]
        if len(hits) != 1:
            raise _refuse(model, f"cannot tell the {what} module of a layer among {[c for c, _ in kids]}.")
        return hits[0]
    attn, mlp = pick(_ATTN, "attention"), pick(_MLP, "MLP")
    o_proj = next((f"{attn}.{c}" for c in _OPROJ if isinstance(getattr(getattr(layer, attn), c, None), nn.Linear)), None)
    return layers_path, attn, mlp, final_norm, heads[0], o_proj


def discover_family(model, *, numeric: bool = True) -> Family:
    """A ``Family`` for ``model`` from its module tree (see the module doc); ``numeric`` decides the norm kind."""
    layers, attn, mlp, final_norm, head, o_proj = _paths(model)
    eps_attr = next((a for a in _EPS_ATTRS if getattr(model.config, a, None) is not None), "rms_norm_eps")
    kind, offset, eps = ("rms", 0.0, None) if not numeric else _norm_kind(model, model.get_submodule(final_norm),
                                                                          eps_attr)
    sites = tuple(s for s in SITES if s != "attn_z" or o_proj)
    t = model.config.model_type
    return Family(name=f"discovered:{t}", model_types=(t,), layers=layers, attn=attn, mlp=mlp, final_norm=final_norm,
                  head=head, norm=kind, norm_offset=offset, norm_eps_attr=eps_attr, norm_eps=eps, o_proj=o_proj or "",
                  sites=sites)


def discover_from_config(cfg) -> Family:
    """Plan-time discovery on a weightless (meta-device) model built from ``cfg``."""
    with torch.device("meta"):
        try:
            model = tf.AutoModelForSequenceClassification.from_config(cfg, trust_remote_code=False)   # never stdin
        except ValueError as exc:
            raise SpecError("model.family", f"model_type '{cfg.model_type}' has no sequence-classification class in "
                            f"transformers ({str(exc).splitlines()[0]}).",
                            fix="use a checkpoint of a model type transformers can load "
                                "for sequence classification (e.g. llama, qwen2).") from None
    return discover_family(model, numeric=False)


@torch.no_grad()
def _norm_kind(model, mod, eps_attr) -> tuple[str, float, float]:
    p = next(mod.parameters(), None)
    d = model.config.hidden_size
    x = torch.from_numpy(np.random.Generator(np.random.PCG64(0)).normal(0, 2, (4, d)) + 0.5)
    g = mod.weight.double() if getattr(mod, "weight", None) is not None else torch.ones(d, dtype=torch.float64)
    beta = mod.bias.double() if getattr(mod, "bias", None) is not None else torch.zeros(d, dtype=torch.float64)
    own = [float(getattr(mod, a)) for a in ("eps", "variance_epsilon", "epsilon")
           if isinstance(getattr(mod, a, None), (int, float))]
    conf = [float(v) for a in _EPS_ATTRS if isinstance(v := getattr(model.config, a, None), (int, float))]
    x = x * 1e-3                                   # small inputs: the eps term decides between candidates
    y = mod(x.to(p.dtype if p is not None else torch.float32)).double()
    for eps in own + conf + [1e-5, 1e-6, 1e-8, 1e-12]:   # the module's, the config's, then common defaults
        rms = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)
        ln = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
        for kind, offset, ref in (("rms", 0.0, rms * g), ("rms", 1.0, rms * (1 + g)), ("layer", 0.0, ln * g + beta)):
            if float((y - ref).abs().max()) <= 1e-5 * (1 + float(ref.abs().max())):
                return kind, offset, eps
    raise _refuse(model, f"its final norm ({type(mod).__name__}) matches neither RMSNorm (gain g or 1 + g) nor "
                  "LayerNorm on random inputs.")


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / (1e-6 + max(np.abs(a).max(), np.abs(b).max())))


@torch.no_grad()
def verify_family(model, tokenizer, family: Family) -> None:
    """Run one probe batch and check the identities of the module doc; raise ``SpecError`` if any fails."""
    texts = ["The quick brown fox jumps over the lazy dog.", "Reward models read the last token."]
    seqs = [list(tokenizer(t)["input_ids"]) for t in texts]
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids, mask, pos, readout = pad_batch(seqs, pad, "left")
    dev = next(model.parameters()).device
    layers = model.get_submodule(family.layers)
    got: dict = {}
    rows = torch.arange(len(seqs))

    def keep(key, pre=False):
        def hook(mod, args, kwargs_or_out, out=None):
            x = (args[0] if args else next(iter(kwargs_or_out.values()))) if pre else \
                (kwargs_or_out[0] if isinstance(kwargs_or_out, tuple) else kwargs_or_out)
            got[key] = x[rows, readout].double().cpu().numpy()
        return hook
    hs = []
    for l, layer in enumerate(layers):
        hs.append(layer.register_forward_pre_hook(keep(("pre", l), pre=True), with_kwargs=True))
        hs.append(layer.register_forward_hook(keep(("post", l))))
        hs.append(layer.get_submodule(family.attn).register_forward_hook(keep(("attn", l))))
        hs.append(layer.get_submodule(family.mlp).register_forward_hook(keep(("mlp", l))))
    hs.append(model.get_submodule(family.final_norm).register_forward_hook(keep("h")))
    hs.append(model.get_submodule(family.head).register_forward_hook(keep("head")))
    try:
        res = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
    finally:
        for h in hs:
            h.remove()
    total = got[("pre", 0)].copy()
    for l in range(len(layers)):
        pre, post, a, m = got[("pre", l)], got[("post", l)], got[("attn", l)], got[("mlp", l)]
        err = _rel(post - pre, a + m)
        if err > _TOL:
            excess = a + m - (post - pre)
            if _rel(excess, pre) <= _TOL:
                raise _refuse(model, f"layer {l}'s '{family.attn}' or '{family.mlp}' output already contains the "
                              "residual stream (its excess over the layer's update equals the layer's input), so "
                              "embed + Σ components would count the residual twice.")
            if _rel(excess, pre + a) <= _TOL:
                raise _refuse(model, f"layer {l}'s '{family.mlp}' output already contains the residual stream "
                              "(attn is added, then the MLP returns residual + update).")
            raise _refuse(model, f"layer {l}: resid_post − resid_pre differs from {family.attn} + {family.mlp} "
                          f"output at the readout token (relative error {err:.3g} > {_TOL}).")
        total += a + m
    last = got[("post", len(layers) - 1)]
    if _rel(total, last) > _TOL:
        raise _refuse(model, f"embed + Σ attn + Σ mlp differs from the last residual (relative error "
                      f"{_rel(total, last):.3g}).")
    norm = read_final_norm(model, family)
    s, mu = norm.frozen(last)
    h_ref = (last - mu[:, None]) * s[:, None] * norm.gain + norm.beta
    if _rel(h_ref, got["h"]) > _TOL:
        raise _refuse(model, f"the final norm '{family.final_norm}' described as {norm.kind} does not reproduce its "
                      f"output on the last residual (relative error {_rel(h_ref, got['h']):.3g}).")
    head = read_head(model, family)
    ours = got["h"] @ head.W.T.astype(np.float64) + head.b
    for what, ref in (("the head's output", got["head"]), ("the pooled logits", res.logits.double().cpu().numpy())):
        if _rel(ours, ref) > _TOL:
            raise _refuse(model, f"W·h + b from '{family.head}' differs from {what} (relative error "
                          f"{_rel(ours, ref):.3g}).")


def family_or_discovered(model, tokenizer) -> Family:
    """The table for ``model.config.model_type``, else a discovered and verified ``Family``."""
    t = getattr(model.config, "model_type", None)
    if any(t in f.model_types for f in FAMILIES.values()):
        return family_for(t)
    fam = discover_family(model)
    verify_family(model, tokenizer, fam)
    return fam


def family_or_discovered_config(cfg) -> Family:
    """Plan time: the table for ``cfg.model_type``, else the structure found on a meta-device copy."""
    if any(cfg.model_type in f.model_types for f in FAMILIES.values()):
        return family_for(cfg.model_type)
    return discover_from_config(cfg)
