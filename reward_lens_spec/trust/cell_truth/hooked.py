"""Cells recomputed by hooking or differentiating the organism's plain forward (``trust.cell_truth``): steering
slopes, the dense Hessian's top eigenvalues (curvature), attribution patching's gradient × activation difference."""
from __future__ import annotations

import numpy as np

from .common import encoded, hooked_forward, obs_step, finite_rows


# -- steering ------------------------------------------------------------------------------------------

def steer_cells(ds, org, obs):
    """Every pair's ``steer_slope`` and ``steer_slope_head`` beside the plain forward's (module table)."""
    enc = encoded(org)
    model, t = org.lm.model, org.truth
    out = {}
    for var in ("steer_slope", "steer_slope_head"):
        got, want = [], []
        st = obs_step(obs, var)
        layer, alphas, side = int(st["layer"]), [float(a) for a in st["alphas"]], st.get("side", "both")
        if st.get("positions", "readout") != "readout":
            raise ValueError(f"{var}: only readout-token steering is recomputed")
        plain = [[hooked_forward(model, s, keep=[(layer, "resid"), (t["layer"], t["component"])])
                  for s in (enc.chosen[i], enc.rejected[i])] for i in range(len(enc.pair_ids))]
        x = np.asarray([[p[1][(layer, "resid")] for p in sides] for sides in plain])
        rho = float(np.sqrt((x ** 2).sum(-1).mean()))
        if "input" in st:                        # the planted unit's mean chosen − rejected write
            w = np.asarray([sides[0][1][(t["layer"], t["component"])] - sides[1][1][(t["layer"], t["component"])]
                            for sides in plain]).mean(0)
        elif st.get("direction", "mean_difference") == "head":
            w = org.lm.model.score.weight.detach().double().numpy()[0]
        else:
            raise ValueError(f"{var}: direction {st.get('direction')!r} is not recomputed")
        u = w / np.linalg.norm(w)
        rows, vals = finite_rows(ds, var, enc)
        steered = {"both": (0, 1), "chosen": (0,), "rejected": (1,)}[side]
        for i, v in zip(rows, vals):
            seqs = (enc.chosen[i], enc.rejected[i])
            m = []
            for a in alphas:
                r = [hooked_forward(model, seqs[s], layer, a * rho * u if s in steered else None)[0][0]
                     for s in (0, 1)]
                m.append(r[0] - r[1])
            got.append(v)
            want.append(np.polyfit(alphas, m, 1)[0])
        out[var] = (got, want)
    return out


# -- curvature -----------------------------------------------------------------------------------------

def curvature_cells(ds, org, obs):
    """Every pair's (and side's) top-k ``margin_eigenvalues`` beside the dense Hessian's k of largest |λ|."""
    import torch
    from torch.autograd.functional import hessian
    da = ds["margin_eigenvalues"]
    st = obs_step(obs, "margin_eigenvalues")
    layer, of = int(st["layer"]), st.get("of", "margin")
    enc = encoded(org)
    model = org.lm.model
    block = model.model.layers[layer]
    k = da.sizes["rank"]

    def dense(ids):
        def f(delta):
            def hook(mod, inp, out):
                h = out[0] if isinstance(out, tuple) else out
                h = torch.cat([h[:, :-1], h[:, -1:] + delta], 1)
                return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h
            hk = block.register_forward_hook(hook)
            try:
                return model(input_ids=torch.tensor([ids])).logits[0, 0]
            finally:
                hk.remove()
        return hessian(f, torch.zeros(model.config.hidden_size)).double().numpy()

    def top(H):
        ev = np.linalg.eigvalsh((H + H.T) / 2)
        return ev[np.argsort(-np.abs(ev), kind="stable")][:k]
    rows, vals = finite_rows(ds, "margin_eigenvalues", enc)
    got, want = [], []
    for i, v in zip(rows, vals):
        Hc, Hr = dense(enc.chosen[i]), dense(enc.rejected[i])
        want.append(top(Hc - Hr) if of == "margin" else np.stack([top(Hc), top(Hr)]))
        got.append(v)
    return {"margin_eigenvalues": (got, want)}


# -- attribution patching ------------------------------------------------------------------------------

def attribution_cells(ds, org, obs):
    """Every (pair, layer, component) cell of ``attribution_patch_effect`` beside gradient × activation
    difference written out: ∂r/∂a of the base side's head output w.r.t. the component's output a at the readout
    (last) token (``torch.autograd.grad`` through a plain forward, batch of one) · (a_source − a_base), the
    source's a from its own plain forward (Nanda 2023, "Attribution patching"; Syed et al. 2023)."""
    import torch
    st = obs_step(obs, "attribution_patch_effect")
    mode = st.get("mode", "denoise")
    da = ds["attribution_patch_effect"]
    if "objective" in da.dims:
        raise ValueError("attribution_patch_effect: only a one-objective grid is recomputed")
    heads = "head" in da.dims           # a head grid: the o_proj input's slice of each head (z_h)
    enc = encoded(org)
    model = org.lm.model
    blocks = model.model.layers
    mod = {"resid": lambda l: blocks[l], "attn": lambda l: blocks[l].self_attn, "mlp": lambda l: blocks[l].mlp}
    cells = [(int(l), str(c)) for l in da.layer.values for c in (da["head"].values if heads else da.component.values)]
    hd = model.config.hidden_size // model.config.num_attention_heads

    def outputs(ids, grad):
        kept, hooks = {}, []
        for l, c in cells:
            if heads:
                if (l, "z") not in kept:
                    def pre(m, a, l=l):
                        kept[(l, "z")] = a[0]
                    hooks.append(blocks[l].self_attn.o_proj.register_forward_pre_hook(pre))
                    kept[(l, "z")] = None
                continue

            def hook(m, a, o, key=(l, c)):
                kept[key] = o[0] if isinstance(o, tuple) else o
            hooks.append(mod[c](l).register_forward_hook(hook))
        try:
            with torch.set_grad_enabled(grad):
                r = model(input_ids=torch.tensor([ids])).logits[0, 0]
                keys = list(dict.fromkeys((l, "z") if heads else (l, c) for l, c in cells))
                g = dict(zip(keys, torch.autograd.grad(r, [kept[k] for k in keys]) if grad else [None] * len(keys)))
        finally:
            for h in hooks:
                h.remove()
        last = lambda x, l, c: (x[0, -1, int(c) * hd:(int(c) + 1) * hd] if heads else x[0, -1]).detach().double().numpy()  # noqa: E731
        src = {(l, c): (l, "z") if heads else (l, c) for l, c in cells}
        act = {k: last(kept[src[k]], *k) for k in cells}
        return act, {k: (None if g[src[k]] is None else last(g[src[k]], *k)) for k in cells}
    rows, vals = finite_rows(ds, "attribution_patch_effect", enc)
    got, want = [], []
    for i, v in zip(rows, vals):
        base, src = (enc.rejected[i], enc.chosen[i]) if mode == "denoise" else (enc.chosen[i], enc.rejected[i])
        a_b, g_b = outputs(base, True)
        a_s, _ = outputs(src, False)
        want.append(np.asarray([g_b[k] @ (a_s[k] - a_b[k]) for k in cells]).reshape(v.shape))
        got.append(v)
    return {"attribution_patch_effect": (got, want)}
