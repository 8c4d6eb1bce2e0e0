"""The independent reference a scorecard grades against: plain HF forwards, batch of one, no padding.

``planted_margins``: each organism pair's margin from the model's own forward, side by side.
``reference_dataset``: the cells of ``dla``, ``lens``, ``lens_raw``, ``patch_effect`` and ``patch_restored``
an observable keeps, recomputed with forward hooks only — none of the capture, operator or executor
code — on Llama-shaped models (every organism base); ``reference_identities`` compares them with what
the observable produced (one identity record per variable, at 1e-3 of the margin scale).
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from ..organisms.organisms import Organism
from ..models.placement import input_device
import torch
from .identities import identity_record
from ..inputs import encode


def planted_margins(org: Organism) -> np.ndarray:
    """Margin per pair by a plain HF forward pass, one side at a time (batch of one, no padding), float64.

    Independent of the capture and operator path: the planted truth a card compares against.
    """
    enc = encode(org.lm, org.pairs)
    dev = input_device(org.lm.model)
    out = []
    with torch.no_grad():
        for c, r in zip(enc.chosen, enc.rejected):
            rc, rr = (org.lm.model(input_ids=torch.tensor([ids], device=dev)).logits[0, 0].double().item()
                      for ids in (c, r))
            out.append(rc - rr)
    return np.asarray(out)


# -- independent reference: the same cells from a plain HF forward, batch of one -----------------------

REFERENCED = ("dla", "lens", "lens_raw", "patch_effect", "patch_restored")   # cell grids checked cell by cell


def plain_modules(model):
    """(embed, layers, norm, head) of a Llama-style HF classifier, by attribute name — no family table."""
    body = getattr(model, "model", None)
    need = ("embed_tokens", "layers", "norm")
    if body is None or not all(hasattr(body, a) for a in need) or not hasattr(model, "score"):
        return None
    if not all(hasattr(b, "self_attn") and hasattr(b, "mlp") for b in body.layers):
        return None
    return body.embed_tokens, list(body.layers), body.norm, model.score


def _last(o):
    return (o[0] if isinstance(o, tuple) else o)


def plain_forward(model, ids, mods, patch=None):
    """One sequence: (embed, attn, mlp, resid, o_proj input ``z``) at its last token (float64) and the
    head output. ``patch``: ``(site, layer, vector)`` replaces that site's output at the last token;
    site ``("z", h, hd)`` replaces head ``h``'s slice of the o_proj input.
    """
    embed, layers, _, _ = mods
    got: dict = {"attn": {}, "mlp": {}, "resid": {}, "z": {}}
    hooks = []

    def keep(kind, l, module):
        def hook(mod, inp, out):
            t = _last(out)
            if patch is not None and patch[0] == kind and patch[1] == l:
                t[0, -1] = torch.as_tensor(patch[2], dtype=t.dtype, device=t.device)
            v = t[0, -1].detach().double().cpu().numpy().copy()
            if kind == "embed":
                got["embed"] = v
            else:
                got[kind][l] = v
        hooks.append(module.register_forward_hook(hook))

    def keep_z(l, module):
        def pre(mod, args):
            t = args[0]
            if patch is not None and isinstance(patch[0], tuple) and patch[1] == l:
                _, h, hd = patch[0]
                t = t.clone()
                t[0, -1, h * hd:(h + 1) * hd] = torch.as_tensor(patch[2], dtype=t.dtype, device=t.device)
            got["z"][l] = t[0, -1].detach().double().cpu().numpy().copy()
            return (t,) + tuple(args[1:])
        hooks.append(module.register_forward_pre_hook(pre))

    keep("embed", -1, embed)
    for l, b in enumerate(layers):
        keep("attn", l, b.self_attn)
        keep("mlp", l, b.mlp)
        keep("resid", l, b)
        if hasattr(b.self_attn, "o_proj"):
            keep_z(l, b.self_attn.o_proj)
    try:
        dev = next(model.parameters()).device
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], device=dev)).logits[0].double().cpu().numpy()
    finally:
        for h in hooks:
            h.remove()
    L = len(layers)
    return {"embed": got["embed"], "attn": np.stack([got["attn"][l] for l in range(L)]),
            "mlp": np.stack([got["mlp"][l] for l in range(L)]),
            "resid": np.stack([got["resid"][l] for l in range(L)]),
            "z": np.stack([got["z"][l] for l in range(L)]) if len(got["z"]) == L else None, "logits": logits}


def reference_dataset(org: Organism, like: xr.Dataset) -> xr.Dataset:
    """The cells of ``like``'s ``REFERENCED`` variables (and ``margin``) recomputed by plain HF forwards.

    Independent of the capture, plan and operator path: per side one forward (batch of one, no
    padding) with forward hooks reading the embedding, each attention and MLP output and each block
    output at the last token (the readout token). ``dla`` = w_r · (g ⊙ c / rms(x_L)) per component
    with the final RMSNorm's scale frozen at the last residual x_L; ``lens`` = w_r · N(x_l) with the
    model's own norm module; ``lens_raw`` = w_r · x_l; ``patch_effect`` = head output of the base
    side re-run with the site's last-token output replaced by the source side's, minus the base's
    (``denoise``: base rejected; ``noise``: base chosen; both computed, each variable compared with
    the mode it matches best), ``patch_restored`` = that / (r_source − r_base). Only variables of
    the known grid shapes are built; an organism that is not Llama-shaped (``model.model.layers``,
    ``self_attn``, ``mlp``, ``norm``, ``score``) gets an empty Dataset.
    """
    model = org.lm.model
    mods = plain_modules(model)
    wanted = [v for v in REFERENCED if v in like.data_vars]
    if mods is None or not wanted:
        return xr.Dataset()
    _, layers, norm, head = mods
    W = head.weight.detach().double().cpu().numpy()                      # objectives × d
    enc = encode(org.lm, org.pairs)
    ids = list(enc.pair_ids)
    L = len(layers)
    sides = [[plain_forward(model, seq, mods) for seq in (c, r)] for c, r in zip(enc.chosen, enc.rejected)]
    first = lambda a: a[..., 0] if a.shape[-1] == 1 else a  # noqa: E731  (one objective: no axis)
    odims = () if W.shape[0] == 1 else ("objective",)
    ocoords = {} if not odims else {"objective": list(org.lm.head.objectives)}
    out = {}
    modes = _patch_modes(like, wanted)

    def proj(x):
        return x @ W.T

    grid = lambda v: v in wanted and "component" in like[v].dims  # noqa: E731
    if grid("dla") and "RMSNorm" in type(norm).__name__:
        g = norm.weight.detach().double().cpu().numpy()
        eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
        cells = np.full((len(ids), L + 1, 3, W.shape[0]), np.nan)
        for p, pair in enumerate(sides):
            for k, sd in enumerate(pair):
                rms = np.sqrt(np.mean(sd["resid"][-1] ** 2) + eps)
                sign = 1.0 if k == 0 else -1.0
                f = lambda x: sign * proj(g * x / rms)  # noqa: E731
                cells[p, 0, 0] = np.nan_to_num(cells[p, 0, 0]) + f(sd["embed"])
                for l in range(L):
                    cells[p, l + 1, 1] = np.nan_to_num(cells[p, l + 1, 1]) + f(sd["attn"][l])
                    cells[p, l + 1, 2] = np.nan_to_num(cells[p, l + 1, 2]) + f(sd["mlp"][l])
        out["dla"] = xr.DataArray(first(cells), dims=("pair", "layer", "component") + odims,
                                  coords={"pair": ids, "layer": np.arange(-1, L),
                                          "component": ["embed", "attn", "mlp"], **ocoords})
    if "lens" in wanted or "lens_raw" in wanted:
        normed = np.zeros((len(ids), L + 1, W.shape[0]))
        raw = np.zeros_like(normed)
        for p, pair in enumerate(sides):
            for k, sd in enumerate(pair):
                sign = 1.0 if k == 0 else -1.0
                xs = np.concatenate([sd["embed"][None], sd["resid"]])
                with torch.no_grad():
                    t = torch.as_tensor(xs[:, None, :], dtype=norm.weight.dtype, device=norm.weight.device)
                    nx = norm(t)[:, 0].double().cpu().numpy()
                normed[p] += sign * proj(nx)
                raw[p] += sign * proj(xs)
        for name, arr in (("lens", normed), ("lens_raw", raw)):
            out[name] = xr.DataArray(first(arr), dims=("pair", "layer") + odims,
                                     coords={"pair": ids, "layer": np.arange(-1, L), **ocoords})
    if grid("patch_effect") or grid("patch_restored"):
        comps = ("resid", "attn", "mlp")
        for mode, (base, src) in modes:
            eff = np.zeros((len(ids), L, 3, W.shape[0]))
            rest = np.zeros_like(eff)
            for p, pair in enumerate(sides):
                seqs = (enc.chosen[p], enc.rejected[p])
                r_base, r_src = pair[base]["logits"], pair[src]["logits"]
                for l in range(L):
                    for ci, comp in enumerate(comps):
                        vec = pair[src][comp][l]
                        r = plain_forward(model, seqs[base], mods, patch=(comp, l, vec))["logits"]
                        eff[p, l, ci] = r - r_base
                        with np.errstate(divide="ignore", invalid="ignore"):
                            rest[p, l, ci] = (r - r_base) / (r_src - r_base)
            for name, arr in (("patch_effect", eff), ("patch_restored", rest)):
                out[f"{name}@{mode}"] = xr.DataArray(first(arr), dims=("pair", "layer", "component") + odims,
                                                     coords={"pair": ids, "layer": np.arange(L),
                                                             "component": list(comps), **ocoords})
    heads = [v for v in wanted if "head" in like[v].dims]
    if heads and sides[0][0]["z"] is not None:
        cfg = model.config
        H = int(cfg.num_attention_heads)
        hd = sides[0][0]["z"].shape[-1] // H
        hl = [int(x) for x in like[heads[0]].layer.values if 0 <= int(x) < L]
        hcoords = {"pair": ids, "layer": hl, "head": np.arange(H), **ocoords}
        if "dla" in heads and "RMSNorm" in type(norm).__name__:
            g = norm.weight.detach().double().cpu().numpy()
            eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
            cells = np.zeros((len(ids), len(hl), H, W.shape[0]))
            for p, pair in enumerate(sides):
                for k, sd in enumerate(pair):
                    rms = np.sqrt(np.mean(sd["resid"][-1] ** 2) + eps)
                    for i, l in enumerate(hl):
                        Wo = layers[l].self_attn.o_proj.weight.detach().double().cpu().numpy()
                        for h in range(H):
                            c = Wo[:, h * hd:(h + 1) * hd] @ sd["z"][l][h * hd:(h + 1) * hd]
                            cells[p, i, h] += (1.0 if k == 0 else -1.0) * proj(g * c / rms)
            out["dla@heads"] = xr.DataArray(first(cells), dims=("pair", "layer", "head") + odims, coords=hcoords)
        if "patch_effect" in heads or "patch_restored" in heads:
            for mode, (base, src) in modes:
                eff = np.zeros((len(ids), len(hl), H, W.shape[0]))
                rest = np.zeros_like(eff)
                for p, pair in enumerate(sides):
                    seqs = (enc.chosen[p], enc.rejected[p])
                    r_base, r_src = pair[base]["logits"], pair[src]["logits"]
                    for i, l in enumerate(hl):
                        for h in range(H):
                            vec = pair[src]["z"][l][h * hd:(h + 1) * hd]
                            r = plain_forward(model, seqs[base], mods, patch=(("z", h, hd), l, vec))["logits"]
                            eff[p, i, h] = r - r_base
                            with np.errstate(divide="ignore", invalid="ignore"):
                                rest[p, i, h] = (r - r_base) / (r_src - r_base)
                for name, arr in (("patch_effect", eff), ("patch_restored", rest)):
                    out[f"{name}@{mode}_heads"] = xr.DataArray(first(arr), dims=("pair", "layer", "head") + odims,
                                                               coords=hcoords)
    margins = np.array([pr[0]["logits"] - pr[1]["logits"] for pr in sides])
    out["margin"] = xr.DataArray(first(margins), dims=("pair",) + odims, coords={"pair": ids, **ocoords})
    return xr.Dataset(out)


def _patch_modes(like: xr.Dataset, wanted) -> list:
    """``[(mode, (base side, source side))]`` to recompute: the mode the patch variables' description
    names (``denoise …``/``noise …``), both when it names neither (each variable then matches the
    closer; a wrong description only makes a mismatch, never a pass)."""
    both = {"denoise": (1, 0), "noise": (0, 1)}
    named = {str(like[v].attrs.get("description", "")).split(" ")[0] for v in wanted if v.startswith("patch_")}
    return [(m, both[m]) for m in both if m in named] if named and named <= set(both) else list(both.items())


def _cell_error(da: xr.DataArray, ref: xr.DataArray) -> xr.DataArray | None:
    """``da − ref`` on every finite cell of ``da`` (a cell ``ref`` lacks: infinite error); None if the
    shapes cannot be matched (another grid)."""
    if set(da.dims) != set(ref.dims):
        return None
    for d in da.dims:
        if d == "pair":
            continue
        missing = [x for x in da[d].values if x not in set(ref[d].values.tolist())]
        if missing:
            return xr.DataArray([np.inf])
    r = ref.reindex({d: da[d].values for d in da.dims})
    err = (da.astype(np.float64) - r).where(np.isfinite(da))
    return err.where(~(np.isfinite(da) & ~np.isfinite(r)), np.inf)


def reference_identities(ds: xr.Dataset, ref: xr.Dataset, org: Organism) -> tuple[list[dict], xr.Dataset]:
    """Identity records "kept cells = plain forward" for each referenced variable of ``ds``, and the
    reference Dataset with the patch mode each patch variable matched (for the magnitude truth)."""
    recs, chosen = [], {}
    margin = ref["margin"] if "margin" in ref else None
    if margin is None:
        return recs, xr.Dataset()
    lg = np.asarray(margin.values, np.float64)
    rms = float(np.sqrt(np.mean(lg ** 2))) if lg.size else 0.0
    for v in REFERENCED:
        if v not in ds.data_vars:
            continue
        cands = [k for k in ref.data_vars if str(k).split("@")[0] == v]
        best = None
        for k in cands:
            err = _cell_error(ds[v], ref[k])
            if err is None:
                continue
            rec = identity_record(v, "kept cells = the same cells from a plain HF forward", err.fillna(0.0)
                          if v != "patch_restored" else err, margin, rms, str(org.lm.dtype))
            if rec is None:
                continue
            if best is None or rec["max_abs_err"] < best[0]["max_abs_err"]:
                best = (rec, k)
        if best is not None:
            recs.append(best[0])
            chosen[v] = ref[best[1]]
    chosen["margin"] = margin
    return recs, xr.Dataset(chosen)
