"""What every cell recomputation shares (``trust.cell_truth``): the fit of read cells to recomputed ones, a step of
the observable, the organism's encoding, each graded variable's finite pair rows, and a plain forward with hooks."""
from __future__ import annotations

import numpy as np

from ...inputs import encode


def fit(got, want) -> float:
    """1 − max |got − want| / RMS(want) over every cell; NaN cells of ``got`` where ``want`` is finite count as
    infinitely wrong."""
    g = np.asarray(np.concatenate([np.ravel(x) for x in got]), np.float64)
    w = np.asarray(np.concatenate([np.ravel(x) for x in want]), np.float64)
    if g.shape != w.shape or not g.size:
        raise ValueError(f"{g.size} cell(s) read where the recomputation has {w.size}")
    if not np.isfinite(g).all():
        return float("-inf")
    return 1.0 - float(np.max(np.abs(g - w)) / max(np.sqrt(np.mean(w ** 2)), 1e-12))


def obs_step(obs, var) -> dict:
    for s in obs.steps:
        if s.get("name") == var:
            return dict(s)
    raise ValueError(f"the observable has no step named {var!r}")


def encoded(org):
    return encode(org.lm, org.pairs)


def finite_rows(ds, var, enc):
    """(indices into the encoding, values) of ``var``'s finite pair rows."""
    da = ds[var]
    idx = {str(p): i for i, p in enumerate(enc.pair_ids)}
    vals = np.asarray(da.transpose("pair", ...).values, np.float64)
    keep = [j for j in range(vals.shape[0]) if np.isfinite(vals[j]).any()]
    return [idx[str(da.pair.values[j])] for j in keep], vals[keep]


def hooked_forward(model, ids, layer=None, add=None, keep=()):
    """Head output of one sequence (float64), ``add`` added to block ``layer``'s output at the last token;
    ``keep``: (block index, 'resid' | 'mlp' | 'attn') outputs at the last token to return."""
    import torch
    blocks = model.model.layers
    got, hooks = {}, []

    def on(l, kind, module):
        def hook(mod, inp, out):
            t = out[0] if isinstance(out, tuple) else out
            if kind == "resid" and l == layer and add is not None:
                t = t.clone()
                t[0, -1] += torch.as_tensor(add, dtype=t.dtype)
                out = (t,) + tuple(out[1:]) if isinstance(out, tuple) else t
            got[(l, kind)] = t[0, -1].detach().double().numpy().copy()
            return out
        hooks.append(module.register_forward_hook(hook))
    for l, b in enumerate(blocks):
        on(l, "resid", b)
        on(l, "mlp", b.mlp)
        on(l, "attn", b.self_attn)
    try:
        with torch.no_grad():
            r = model(input_ids=torch.tensor([ids])).logits[0].double().numpy()
    finally:
        for h in hooks:
            h.remove()
    return r, {k: got[k] for k in keep}
