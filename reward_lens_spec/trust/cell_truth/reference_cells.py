"""Cells recomputed through ``trust.reference`` (planted margins, the Llama-shaped plain forward): group statistics,
path patching and HodgeRank (``trust.cell_truth``). ``trust.reference`` is a workflow module that loads torch, so it is
imported inside the functions that use it: the gate reads these criteria without loading torch."""
from __future__ import annotations

import json
import statistics

import numpy as np

from .common import encoded, obs_step, finite_rows


# -- group statistics --------------------------------------------------------------------------------------

def group_cells(ds, org, obs):
    """Every group's ``accuracy_by_dimension`` and ``effect_size_by_dimension`` estimates beside P(Δ>0) + ½P(Δ=0)
    and d_z = mean / sd (n − 1, ``statistics.stdev``) of the plain-forward margins of that group's pairs."""
    from ..reference import planted_margins
    enc = encoded(org)
    margin = dict(zip((str(i) for i in enc.pair_ids), planted_margins(org)))
    by_id = {p.id: p for p in org.pairs}
    out = {}
    for var, stat in (("accuracy_by_dimension", lambda m: float(np.mean([(x > 0) + 0.5 * (x == 0) for x in m]))),
                      ("effect_size_by_dimension", lambda m: statistics.mean(m) / statistics.stdev(m))):
        got, want = [], []
        by = obs_step(obs, var).get("by")
        if by not in (None, "dimension"):
            raise ValueError(f"{var}: only groups by dimension are recomputed, not {by!r}")
        est = ds[var].sel(bound="estimate")
        groups = [str(g) for g in est[by].values] if by else ["all"]
        if set(groups) != {by_id[i].dimension if by else "all" for i in margin}:
            raise ValueError(f"{var}: groups {sorted(groups)} are not the organism's")
        for g, v in zip(groups, np.atleast_1d(np.asarray(est.values, np.float64))):
            got.append(np.asarray([v]))
            want.append(np.asarray([stat([m for i, m in margin.items() if not by or by_id[i].dimension == g])]))
        out[var] = (got, want)
    return out


# -- path patching -------------------------------------------------------------------------------------

def path_cells(ds, org, obs):
    """Every (pair, layer, component, path) cell of ``path_patch_effect`` beside plain forwards: the base side,
    the source side, and the base side re-run with the sender's readout-token output replaced by the source's
    (``trust.reference``'s hooks); total = r(x') − r(x), direct = r(x + Δa) − r(x), indirect = r(x' − Δa) − r(x)
    with r(x) = the model's own final norm and score modules applied to a last residual x."""
    import torch

    from ..reference import plain_forward, plain_modules
    st = obs_step(obs, "path_patch_effect")
    mode = st.get("mode", "denoise")
    da = ds["path_patch_effect"]
    if "objective" in da.dims:
        raise ValueError("path_patch_effect: only a one-objective grid is recomputed")
    model = org.lm.model
    mods = plain_modules(model)
    if mods is None:
        raise ValueError("path_patch_effect: the organism is not Llama-shaped; no plain forward recomputes it")
    _, _, norm, head = mods

    def r(x):
        with torch.no_grad():
            t = torch.as_tensor(np.asarray(x), dtype=next(model.parameters()).dtype)[None, None]
            return float(head(norm(t))[0, 0, 0].double())
    enc = encoded(org)
    rows, vals = finite_rows(ds, "path_patch_effect", enc)
    da = da.transpose("pair", "layer", "component", "path")
    paths = [str(p) for p in da.path.values]
    got, want = [], []
    for i, v in zip(rows, vals):
        base, src = (enc.rejected[i], enc.chosen[i]) if mode == "denoise" else (enc.chosen[i], enc.rejected[i])
        fb, fs = plain_forward(model, base, mods), plain_forward(model, src, mods)
        x = fb["resid"][-1]
        w = np.full(v.shape, np.nan)
        for a, l in enumerate(da.layer.values):
            for b, c in enumerate(da.component.values):
                dlt = fs[str(c)][int(l)] - fb[str(c)][int(l)]
                xp = plain_forward(model, base, mods, patch=(str(c), int(l), fs[str(c)][int(l)]))["resid"][-1]
                val = {"total": r(xp) - r(x), "direct": r(x + dlt) - r(x), "indirect": r(xp - dlt) - r(x)}
                w[a, b] = [val[p] for p in paths]
        got.append(v)
        want.append(w)
    return {"path_patch_effect": (got, want)}


# -- HodgeRank -----------------------------------------------------------------------------------------

def _hodge_naive(comparisons):
    """(gradient, non-gradient energy, cycle rank, n nodes, n edges) of one group's flow, from comparisons
    (winner, loser, value): edge flow = mean value (oriented), weight = count; the gradient part by weighted
    least squares on the incidence matrix (``np.linalg.lstsq``), energies in ‖·‖²_w (Jiang et al. 2011)."""
    nodes = sorted({a for a, _, _ in comparisons} | {b for _, b, _ in comparisons})
    idx = {n: k for k, n in enumerate(nodes)}
    acc: dict = {}
    for a, b, v in comparisons:
        i, j = idx[a], idx[b]
        if i == j:
            continue
        acc.setdefault((min(i, j), max(i, j)), []).append(v if i < j else -v)
    edges = sorted(acc)
    y = np.asarray([np.mean(acc[e]) for e in edges])
    w = np.asarray([len(acc[e]) for e in edges], np.float64)
    G = np.zeros((len(edges), len(nodes)))
    for k, (i, j) in enumerate(edges):
        G[k, i], G[k, j] = 1.0, -1.0
    sw = np.sqrt(w)
    s = np.linalg.lstsq(G * sw[:, None], y * sw, rcond=None)[0]
    total = float((w * y * y).sum())
    grad = float((w * (G @ s) ** 2).sum())
    comps = len(nodes) - np.linalg.matrix_rank(G) if len(edges) else len(nodes)
    return grad, total - grad, len(edges) - len(nodes) + comps, len(nodes), len(edges)


def hodge_cells(ds, org, obs):
    """``hodge_pooled``'s gradient and non-gradient fractions and its response and edge counts, per flow (labels:
    +1, or 2·agreement − 1 where votes are recorded; model: the plain-forward margin), pooled over the groups
    (``meta["group"]``, else the prompt) with cycle rank ≥ 1, beside ``_hodge_naive``'s."""
    from ..reference import planted_margins
    st = obs_step(obs, "hodge_pooled")
    if not st.get("pooled", False):
        raise ValueError("hodge_pooled: only the pooled split is recomputed")
    enc = encoded(org)
    by_id = {p.id: p for p in org.pairs}
    pairs = [by_id[i] for i in enc.pair_ids]
    margin = planted_margins(org)
    flows = {}
    for p, m in zip(pairs, margin):
        meta = p.meta_dict()
        v = meta.get("votes")
        v = json.loads(v) if isinstance(v, str) else v
        a = meta.get("agreement", None if v is None else sum(int(x) for x in v) / len(v))
        lab = 1.0 if a is None else 2.0 * float(a) - 1.0
        g = meta.get("group") or p.prompt
        flows.setdefault(g, []).append((p.chosen, p.rejected, lab, float(m)))
    min_resp = int(st.get("min_responses", 3))
    hp = ds["hodge_pooled"]
    got, want = [], []
    for k, flow in enumerate(("labels", "model")):
        parts = [_hodge_naive([(c[0], c[1], c[2 + k]) for c in comps]) for comps in flows.values()
                 if len({c[0] for c in comps} | {c[1] for c in comps}) >= min_resp]
        parts = [x for x in parts if x[2] >= 1]
        grad, ng = sum(x[0] for x in parts), sum(x[1] for x in parts)
        row = hp.sel(flow=flow)
        stat = lambda s: float(row.sel(hodge_statistic=s))  # noqa: E731
        got.append(np.asarray([stat("gradient_fraction"), stat("non_gradient_fraction")]))
        want.append(np.asarray([grad / (grad + ng), ng / (grad + ng)]))
        got.append(np.asarray([stat("n_responses"), stat("n_edges")]) / len(pairs))
        want.append(np.asarray([sum(x[3] for x in parts), sum(x[4] for x in parts)], np.float64) / len(pairs))
    return {"hodge_pooled": (got, want)}
