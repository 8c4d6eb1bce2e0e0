"""Apply ``model.interventions`` (``models.artifacts``) to a loaded model, so every forward pass — the capture
pass, patching, steering, RewardBench — runs the erased, steered or re-headed reward model.

``steer`` and ``erase`` are forward hooks on the site's module (``resid_post.<l>``: decoder layer ``l``'s output;
``attn_out.<l>`` / ``mlp_out.<l>``: its attention / MLP block's output), registered when the model loads and so
before any hook an operator adds: every later hook (capture, patching) sees the intervened activation. Each maps
every position of the activation, computed in float64 and cast back to the model's dtype:

    steer   x ← x + alpha · v                         (activation addition, Turner et al. 2023)
    erase   x ← x − (x − μ) Eᵀ,  E = W⁺PW             (LEACE, Belrose et al. 2023, Thm. 4.3)

Both are position-wise, so cached prefixes and the readout copies of ``engine.interventions`` see the same map
as a full forward. ``head`` writes the artifact's W (and b, else 0) into the model's own reward head (so the
capture pass's self-check ``W·h + b`` = the model's logits still holds). Raises ``SpecError`` naming
``model.interventions.<i>`` for a width that is not the model's d_model, a layer out of range, a site the family
lacks, or a head on a gated (multi-objective) model.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import SpecError
from ..model_checks import parse_site
from .artifacts import read, record
from .head import first_output, get_module, module_for


def apply(lm, spec, base_dir: str | None = None, *, wrap=None):
    """``lm`` with every entry of ``spec.interventions`` applied in order (see the module doc); the records
    (``artifacts.record``: kind, site, alpha, sha256 of the bytes read) in ``lm.interventions``. Returns the
    ``LoadedModel`` (a new one when a head was replaced)."""
    items = getattr(spec, "interventions", None) or ()
    done = []
    for i, entry in enumerate(items):
        key = f"model.interventions.{i}"
        tensors, prov = read(entry, key, base_dir)
        if entry.kind == "head":
            lm = _set_head(lm, tensors, key, wrap)
        else:
            site, layer = parse_site(entry.site, entry.kind, key + ".site")
            if layer >= lm.n_layers:
                raise SpecError(key + ".site", f"layer {layer} out of range; this model has layers "
                                f"0..{lm.n_layers - 1}.", fix=f"e.g. site: {site}.{lm.n_layers - 1}.")
            try:
                module = module_for(lm, site, layer)
            except (AttributeError, KeyError, IndexError):
                raise SpecError(key + ".site", f"this model's family ({lm.family.name}) has no {site} module.",
                                options=["resid_post"]) from None
            module.register_forward_hook(_hook(entry, tensors, lm.d_model, key))
        done.append(record(entry, prov["sha256"]))
    lm.interventions = done
    return lm


def _width(t: np.ndarray, shape: tuple, key: str, name: str) -> torch.Tensor:
    if tuple(t.shape) != shape:
        raise SpecError(key + ".path", f"tensor {name} has shape {tuple(t.shape)}; this model needs {shape} "
                        f"(d_model {shape[-1]}).", fix="export the artifact from a run of a model of this width.")
    return torch.as_tensor(np.asarray(t, np.float64))


def _hook(entry, tensors: dict, d: int, key: str):
    if entry.kind == "steer":
        shift = float(entry.alpha) * _width(tensors["vector"], (d,), key, "vector")

        def f(x):
            return x + shift.to(x.device)
    else:
        mu = _width(tensors["mean"], (d,), key, "mean")
        proj = _width(tensors["projection"], (d, d), key, "projection")

        def f(x):
            return x - (x - mu.to(x.device)) @ proj.to(x.device).T

    def hook(mod, args, output):
        x = first_output(output)
        y = f(x.double()).to(x.dtype)
        return (y,) + tuple(output[1:]) if isinstance(output, tuple) else y
    return hook


def _set_head(lm, tensors: dict, key: str, wrap_model):
    """``wrap_model``: ``models.loading.wrap_model``, handed in by the loader (which imports this module)."""
    if lm.head.gated:
        raise SpecError(key + ".kind", "a gated (multi-objective) head cannot be replaced by a linear one.",
                        fix="use a model with a linear head.")
    lin = get_module(lm.model, lm.family.head)
    k, d = lin.weight.shape
    w = tensors["weight"]
    w = _width(w if w.ndim == 2 else w[None, :], (k, d), key, "weight")
    b = _width(tensors["bias"], (k,), key, "bias") if "bias" in tensors else torch.zeros(k, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(w.to(lin.weight.dtype))
        if getattr(lin, "bias", None) is not None:
            lin.bias.copy_(b.to(lin.bias.dtype))
        elif bool((b != 0).any()):
            raise SpecError(key + ".path", "the artifact has a nonzero bias; this model's head has none.",
                            fix="export the head without a bias.")
    return wrap_model(lm.name, lm.model, lm.tokenizer, dtype=lm.dtype, device=lm.device,
                      objectives=lm.head.objectives)
