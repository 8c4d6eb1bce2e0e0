"""Reference tests: DLA, the reward lens and activation patching against a naive, independent path.

The reference runs each side ALONE (batch of one, no padding, full sequence, no KV cache),
reads the residual stream with plain ``register_forward_hook``s on the decoder layers, reads
the reward from the HF model's own ``logits``, and does every post-processing step in float64
with the final norm applied through the model's own norm module. It shares no code with the
capture, operator or patching path; only module lookup (which module is a layer, the final
norm, the head row) comes from the family tables. Tolerance: 1e-4 of the margin scale
(float32 forward passes; measured agreement is ~1e-6).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FAMILIES, make_pairs, tiny_lm
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.models.head import get_module
from reward_lens_spec.organisms.organisms import Organism, _pairset
from reward_lens_spec.observables import load_observable
from reward_lens_spec.trust.scorecard import evaluate

RTOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_thread")


def _out(o):
    return o[0] if isinstance(o, tuple) else o


@torch.no_grad()
def naive_side(lm, ids, patch=None):
    """(reward, resid_pre of layer 0 at the last token, resid_post per layer at the last token), float64.

    ``patch``: (module, vector) — replace that module's output at the last position.
    """
    layers = get_module(lm.model, lm.family.layers)
    got, handles = {}, []
    handles.append(layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: got.__setitem__("embed", args[0][0, -1] if args else kwargs["hidden_states"][0, -1]),
        with_kwargs=True))
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(i, _out(o)[0, -1].clone())))
    if patch is not None:
        module, vec = patch

        def replace(m, a, o):
            t = _out(o).clone()
            t[0, -1] = vec
            return (t,) + tuple(o[1:]) if isinstance(o, tuple) else t
        handles.insert(0, module.register_forward_hook(replace))
    try:
        logits = lm.model(input_ids=torch.tensor([ids])).logits
    finally:
        for h in handles:
            h.remove()
    resid = np.stack([got[i].double().numpy() for i in range(len(layers))])
    return float(logits[0, 0].double()), got["embed"].double().numpy(), resid


def _norm(lm, x: np.ndarray) -> np.ndarray:
    """The model's own final norm applied to rows ``x`` (float32 module, result in float64)."""
    with torch.no_grad():
        return lm.norm.module(torch.as_tensor(np.atleast_2d(x), dtype=torch.float32)).double().numpy()


def _frozen(lm, x_final: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Linear part of the final norm at ``x_final`` applied to contributions ``c`` (rows), float64.

    N(c) − N(0) rescaled by s(c)/s(x_final), s = sqrt(var + eps) (layer norm) or sqrt(mean square + eps)
    (RMS norm): exactly the norm with its scale frozen at the final residual.
    """
    mod = lm.norm.module
    eps = float(getattr(mod, "eps", getattr(mod, "variance_epsilon", 1e-6)))
    c = np.atleast_2d(c)
    layer_norm = np.allclose(_norm(lm, c[:1] + 3.0), _norm(lm, c[:1]), atol=1e-4)    # shift-invariant
    stat = (lambda v: v.var(-1)) if layer_norm else (lambda v: (v ** 2).mean(-1))
    s = np.sqrt(stat(c) + eps)[:, None]
    return (_norm(lm, c) - _norm(lm, np.zeros_like(c[:1]))) * s / np.sqrt(stat(x_final[None]) + eps)


def _w(lm) -> np.ndarray:
    return np.asarray(lm.head.W[0], np.float64)


def _org(lm, n=3):
    pairs = _pairset("ref", make_pairs(n))
    return Organism("reference", 1.0, lm, pairs), encode_pairs(lm.tokenizer, list(pairs), model_name=lm.name)


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return tiny_lm(request.param)


def test_dla_and_lens_match_the_naive_reference(lm):
    org, enc = _org(lm)
    dla = evaluate(load_observable("dla"), org)["dla"]
    lens = evaluate(load_observable("lens"), org)["lens"]
    w = _w(lm)
    for p, (c_ids, r_ids) in enumerate(zip(enc.chosen, enc.rejected)):
        sides = [naive_side(lm, ids) for ids in (c_ids, r_ids)]
        margin = sides[0][0] - sides[1][0]
        scale = max(abs(margin), 1e-3)
        per_layer, lens_ref = [], []
        for reward, embed, resid in sides:
            x_final = resid[-1]
            steps = np.vstack([embed, resid[0] - embed, np.diff(resid, axis=0)])     # what each layer adds
            per_layer.append(_frozen(lm, x_final, steps) @ w)
            lens_ref.append(_norm(lm, np.vstack([embed, resid])) @ w)
        ref_dla = per_layer[0] - per_layer[1]                                           # (embed, L0, ..., L_last)
        got = dla.isel(pair=p).sum("component", skipna=True).values
        np.testing.assert_allclose(got, ref_dla, rtol=0, atol=RTOL * scale)
        np.testing.assert_allclose(ref_dla.sum(), margin, rtol=0, atol=RTOL * scale)  # the reference is exact too
        np.testing.assert_allclose(lens.isel(pair=p).values, lens_ref[0] - lens_ref[1], rtol=0, atol=RTOL * scale)
        assert lens.isel(pair=p).values[-1] == pytest.approx(margin, abs=RTOL * scale)


def test_patching_matches_the_naive_reference(lm):
    org, enc = _org(lm, n=2)
    eff = evaluate(load_observable("patch"), org)["patch_effect"]
    layers = get_module(lm.model, lm.family.layers)
    for p, (c_ids, r_ids) in enumerate(zip(enc.chosen, enc.rejected)):
        r_base = naive_side(lm, r_ids)[0]
        got_src = {}
        hooks = []
        for i, layer in enumerate(layers):
            for comp, module in (("resid", layer), ("attn", get_module(layer, lm.family.attn)),
                                 ("mlp", get_module(layer, lm.family.mlp))):
                hooks.append(module.register_forward_hook(
                    lambda m, a, o, k=(i, comp): got_src.__setitem__(k, _out(o)[0, -1].clone())))
        with torch.no_grad():
            lm.model(input_ids=torch.tensor([c_ids]))
        for h in hooks:
            h.remove()
        scale = max(abs(naive_side(lm, c_ids)[0] - r_base), 1e-3)
        for (i, comp), vec in got_src.items():
            module = layers[i] if comp == "resid" else get_module(layers[i], getattr(lm.family, comp))
            ref = naive_side(lm, r_ids, patch=(module, vec))[0] - r_base
            assert float(eff.isel(pair=p).sel(layer=i, component=comp)) == pytest.approx(ref, abs=RTOL * scale), \
                (lm.name, p, i, comp)
