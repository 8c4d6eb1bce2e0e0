"""Independent recomputations that some criteria read an output against, cell by cell (issue 37 item 7).

A criterion's ``cells(ds, org, obs)`` returns ``{output: (got, want)}``: each graded output's cells at full
strength beside the same cells recomputed here from plain HF forwards of the organism (batch of one, forward hooks,
float64 arithmetic; none of the capture, operator or executor code). ``trust.scorecard`` stores
``fit = 1 − max |got − want| / RMS(want)`` per output, and their minimum as the card's ``cells`` entry, which
must be ≥ ``CELL_FLOOR``
(``trust.evidence``), so a reading 5 % off, or one pair, member, rank or class shifted, fails the criterion
even where its summary (a ratio, a share, an AUC near chance) would pass.

==================  ======================================  ===================================================
criterion           cells compared                          recomputed by
==================  ======================================  ===================================================
steer_alignment     ``steer_slope``, ``steer_slope_head``    hook adds α·ρ·u at the readout token of the steered
                    per pair                                side at resid_post[layer]; least-squares slope of
                                                            the margin over the declared alphas (``np.polyfit``);
                                                            ρ = RMS norm of resid_post[layer] over every pair and
                                                            side, u = w_r (``direction: head``) or the mean
                                                            chosen − rejected output of the planted unit (input)
leace_specificity   ``displacement``,                       LEACE as the oblique projection
                    ``unplanted_displacement`` per pair     E = Σ_XZ (Σ_XZᵀ Σ_XX⁺ Σ_XZ)⁺ Σ_XZᵀ Σ_XX⁺ (Belrose et
                                                            al. 2023, eq. of Thm. 4.3 rewritten; pseudo-inverses,
                                                            no eigendecomposition), fitted on the seeded split
leace_removal       ``certificate`` estimates before /      the same split and eraser; the probe is L2 logistic
                    after erasure                           regression fitted by Newton's method (IRLS), AUC as
                                                            the Mann–Whitney U (``scipy.stats.mannwhitneyu``)
curvature_          ``margin_eigenvalues`` per pair (and    the dense Hessian of the reward w.r.t. a shift of
direction           side) and rank                          resid_post[layer] at the readout token
                                                            (``torch.autograd.functional.hessian``), its
                                                            eigenvalues (``np.linalg.eigvalsh``) by |λ|
==================  ======================================  ===================================================

Each raises ``ValueError`` naming what does not fit (a layer, a split size, a pair count), which the card
records as the criterion's reading error.
"""
from __future__ import annotations

import hashlib
import json
import re

import numpy as np
from ..inputs import encode
import statistics

SPLIT_SEED, FIT_FRACTION, PROBE_L2 = 0, 0.5, 1.0     # the leace / leace_certificate defaults organisms grade


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


def _step(obs, var) -> dict:
    for s in obs.steps:
        if s.get("name") == var:
            return dict(s)
    raise ValueError(f"the observable has no step named {var!r}")


def _encoded(org):
    return encode(org.lm, org.pairs)


def _rows(ds, var, enc):
    """(indices into the encoding, values) of ``var``'s finite pair rows."""
    da = ds[var]
    idx = {str(p): i for i, p in enumerate(enc.pair_ids)}
    vals = np.asarray(da.transpose("pair", ...).values, np.float64)
    keep = [j for j in range(vals.shape[0]) if np.isfinite(vals[j]).any()]
    return [idx[str(da.pair.values[j])] for j in keep], vals[keep]


def _forward(model, ids, layer=None, add=None, keep=()):
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


# -- steering ------------------------------------------------------------------------------------------

def steer_cells(ds, org, obs):
    """Every pair's ``steer_slope`` and ``steer_slope_head`` beside the plain forward's (module table)."""
    enc = _encoded(org)
    model, t = org.lm.model, org.truth
    out = {}
    for var in ("steer_slope", "steer_slope_head"):
        got, want = [], []
        st = _step(obs, var)
        layer, alphas, side = int(st["layer"]), [float(a) for a in st["alphas"]], st.get("side", "both")
        if st.get("positions", "readout") != "readout":
            raise ValueError(f"{var}: only readout-token steering is recomputed")
        plain = [[_forward(model, s, keep=[(layer, "resid"), (t["layer"], t["component"])])
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
        rows, vals = _rows(ds, var, enc)
        steered = {"both": (0, 1), "chosen": (0,), "rejected": (1,)}[side]
        for i, v in zip(rows, vals):
            seqs = (enc.chosen[i], enc.rejected[i])
            m = []
            for a in alphas:
                r = [_forward(model, seqs[s], layer, a * rho * u if s in steered else None)[0][0]
                     for s in (0, 1)]
                m.append(r[0] - r[1])
            got.append(v)
            want.append(np.polyfit(alphas, m, 1)[0])
        out[var] = (got, want)
    return out


# -- LEACE ---------------------------------------------------------------------------------------------

def _split(ids, salt: str, fraction: float) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.sha256(f"{salt}:{i}".encode()).digest(), "big") < fraction * 2 ** 256
                     for i in ids])


def _oblique_eraser(X, Z):
    """(mu, E) with r(x) = x − E (x − mu): LEACE written as an oblique projection (module table)."""
    mu = X.mean(0)
    Xc, Zc = X - mu, Z - Z.mean(0)
    sxx, sxz = Xc.T @ Xc / len(X), Xc.T @ Zc / len(X)
    sinv = np.linalg.pinv(sxx, rcond=1e-10, hermitian=True)
    return mu, sxz @ np.linalg.pinv(sxz.T @ sinv @ sxz, rcond=1e-10) @ sxz.T @ sinv


def _leace_layer(ds, var) -> int:
    m = re.search(r"resid_post\[(\d+)\]", str(ds[var].attrs.get("description", "")))
    if m is None:
        raise ValueError(f"{var}: only resid_post erasure is recomputed (its description names no resid_post[layer])")
    return int(m.group(1))


def _concept_data(org, layer, field):
    enc = _encoded(org)
    X = np.asarray([[_forward(org.lm.model, s, keep=[(layer, "resid")])[1][(layer, "resid")]
                     for s in (enc.chosen[i], enc.rejected[i])] for i in range(len(enc.pair_ids))])
    by_id = {p.id: p for p in org.pairs}
    y = np.asarray([str(by_id[i].meta_dict()[field]) for i in enc.pair_ids])
    return enc, X, y


def _erased(X, y, fit):
    classes = np.unique(y[fit])
    Z = (np.repeat(y[fit], 2)[:, None] == classes[None, :]).astype(np.float64)
    mu, E = _oblique_eraser(X[fit].reshape(-1, X.shape[-1]), Z)
    return X - (X - mu) @ E.T


def leace_displacement_cells(ds, org, obs):
    """Every held-out pair's ``displacement`` (planted concept) and ``unplanted_displacement`` beside the
    recomputation's mean over sides of ‖r(x) − x‖ / ‖x‖."""
    out = {}
    for var in ("displacement", "unplanted_displacement"):
        field = str(ds[var].attrs.get("concept", "")).removeprefix("field:")
        enc, X, y = _concept_data(org, _leace_layer(ds, var), field)
        fit_ = _split(enc.pair_ids, str(SPLIT_SEED), FIT_FRACTION)
        if int(ds[var].attrs.get("n_fit", -1)) != int(fit_.sum()):
            raise ValueError(f"{var}: fitted on {ds[var].attrs.get('n_fit')} pairs, the declared split has "
                             f"{int(fit_.sum())}")
        moved = np.linalg.norm(_erased(X, y, fit_) - X, axis=-1) / np.linalg.norm(X, axis=-1)
        rows, vals = _rows(ds, var, enc)
        if sorted(rows) != [i for i in range(len(enc.pair_ids)) if not fit_[i]][:len(rows)] or not rows:
            raise ValueError(f"{var}: read on pairs that are not the held-out split")
        out[var] = ([vals.ravel()], [moved[rows].mean(1)])
    return out


def _newton_logistic(X, t, l2):
    """L2 logistic regression (weights penalized, intercept not) on standardized X by Newton's method."""
    m, sd = X.mean(0), X.std(0) + 1e-12
    A = np.hstack([(X - m) / sd, np.ones((len(X), 1))])
    w = np.zeros(A.shape[1])
    pen = np.r_[np.full(A.shape[1] - 1, l2), 0.0]
    for _ in range(100):
        p = 1 / (1 + np.exp(-(A @ w)))
        g = A.T @ (p - t) + pen * w
        H = (A * (p * (1 - p))[:, None]).T @ A + np.diag(pen)
        step = np.linalg.solve(H, g)
        w -= step
        if np.max(np.abs(step)) < 1e-12:
            break
    return lambda Xn: np.hstack([(Xn - m) / sd, np.ones((len(Xn), 1))]) @ w


def _auc(score, pos):
    from scipy.stats import mannwhitneyu
    return float(mannwhitneyu(score[pos], score[~pos]).statistic / (pos.sum() * (~pos).sum()))


def leace_certificate_cells(ds, org, obs):
    """The ``certificate``'s before / after AUC estimates beside the recomputation's (binary concept)."""
    cert = ds["certificate"]
    field = str(cert.attrs.get("concept", "")).removeprefix("field:")
    st = _step(obs, "certificate")
    enc, X, y = _concept_data(org, int(st["layer"]), field)
    ids = [str(i) for i in enc.pair_ids]
    fit_ = _split(ids, str(SPLIT_SEED), FIT_FRACTION)
    held = np.flatnonzero(~fit_)
    tr = held[_split([ids[i] for i in held], f"probe:{SPLIT_SEED}", 0.5)]
    te = np.setdiff1d(held, tr)
    if (int(cert["n_train"]), int(cert["n_test"])) != (tr.size, te.size):
        raise ValueError(f"certificate: probe split {int(cert['n_train'])}/{int(cert['n_test'])} pairs, the "
                         f"declared split {tr.size}/{te.size}")
    classes = np.unique(y[tr])
    if classes.size != 2:
        raise ValueError("certificate: only a binary concept is recomputed")
    want = []
    for A in (X, _erased(X, y, fit_)):
        score = _newton_logistic(A[tr].reshape(-1, A.shape[-1]), np.repeat(y[tr] == classes[1], 2).astype(float),
                                 PROBE_L2)(A[te].reshape(-1, A.shape[-1]))
        want.append(_auc(score, np.repeat(y[te] == classes[1], 2)))
    got = np.asarray(cert.sel(stage=["before", "after"], bound="estimate").values, np.float64)
    return {"certificate": ([got], [np.asarray(want)])}


# -- curvature -----------------------------------------------------------------------------------------

def curvature_cells(ds, org, obs):
    """Every pair's (and side's) top-k ``margin_eigenvalues`` beside the dense Hessian's k of largest |λ|."""
    import torch
    from torch.autograd.functional import hessian
    da = ds["margin_eigenvalues"]
    st = _step(obs, "margin_eigenvalues")
    layer, of = int(st["layer"]), st.get("of", "margin")
    enc = _encoded(org)
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
    rows, vals = _rows(ds, "margin_eigenvalues", enc)
    got, want = [], []
    for i, v in zip(rows, vals):
        Hc, Hr = dense(enc.chosen[i]), dense(enc.rejected[i])
        want.append(top(Hc - Hr) if of == "margin" else np.stack([top(Hc), top(Hr)]))
        got.append(v)
    return {"margin_eigenvalues": (got, want)}


# -- group statistics and the null ---------------------------------------------------------------------

def group_cells(ds, org, obs):
    """Every group's ``accuracy_by_dimension`` and ``effect_size_by_dimension`` estimates beside P(Δ>0) + ½P(Δ=0)
    and d_z = mean / sd (n − 1, ``statistics.stdev``) of the plain-forward margins of that group's pairs."""
    from .reference import planted_margins
    enc = _encoded(org)
    margin = dict(zip((str(i) for i in enc.pair_ids), planted_margins(org)))
    by_id = {p.id: p for p in org.pairs}
    out = {}
    for var, stat in (("accuracy_by_dimension", lambda m: float(np.mean([(x > 0) + 0.5 * (x == 0) for x in m]))),
                      ("effect_size_by_dimension", lambda m: statistics.mean(m) / statistics.stdev(m))):
        got, want = [], []
        by = _step(obs, var).get("by")
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


def null_cells(ds, org, obs):
    """``observed_effect`` per layer beside the mean over pairs of w_r · (mlp_out_c − mlp_out_r) at the readout
    token, and ``p_value`` beside the Monte-Carlo p (1 + #{draw ≥ observed}) / (1 + B) of the stored draws,
    Benjamini–Hochberg adjusted by ``statsmodels``."""
    from statsmodels.stats.multitest import multipletests
    st = {k: _step(obs, k) for k in ("observed_effect", "null_draws", "p_value")}
    chain = {s["name"]: s for s in obs.steps}
    src = chain.get(st["observed_effect"].get("input"), {})
    src = chain.get(src.get("input"), {})                  # reduce <- diff <- project <- capture
    if src.get("op") != "project" or src.get("direction", "head") != "head" or \
            chain.get(src.get("input"), {}).get("site") != "mlp_out":
        raise ValueError("observed_effect: only the mean w_r · Δ mlp_out of each layer is recomputed")
    enc = _encoded(org)
    model = org.lm.model
    L = len(model.model.layers)
    w = model.score.weight.detach().double().numpy()[0]
    diff = []
    for i in range(len(enc.pair_ids)):
        sides = [_forward(model, s, keep=[(l, "mlp") for l in range(L)])[1] for s in (enc.chosen[i], enc.rejected[i])]
        diff.append([w @ (sides[0][(l, "mlp")] - sides[1][(l, "mlp")]) for l in range(L)])
    obs_da = ds["observed_effect"].transpose("layer", ...)
    want_obs = np.asarray(diff).mean(0)[[int(x) for x in obs_da.layer.values]]
    o = np.asarray(obs_da.values, np.float64).ravel()
    d = np.asarray(ds["null_draws"].transpose("draw", "layer", ...).values, np.float64).reshape(
        ds["null_draws"].sizes["draw"], -1)
    alt = st["p_value"].get("alternative", "greater")
    pg, pl = (1 + (d >= o).sum(0)) / (1 + len(d)), (1 + (d <= o).sum(0)) / (1 + len(d))
    p = {"greater": pg, "less": pl, "two-sided": np.minimum(1.0, 2 * np.minimum(pg, pl))}[alt]
    if st["p_value"].get("correction", "none") == "bh":
        p = multipletests(p, method="fdr_bh")[1]
    got_p = np.asarray(ds["p_value"].transpose("layer", ...).values, np.float64).ravel()
    return {"observed_effect": ([o], [want_obs]), "p_value": ([got_p], [p])}


# -- preference structure ------------------------------------------------------------------------------

def _side_outputs(org):
    """Per pair (in encoding order) the head's output vector for each side by plain forwards: (pair, side, K)."""
    enc = _encoded(org)
    return enc, np.asarray([[_forward(org.lm.model, s)[0] for s in (enc.chosen[i], enc.rejected[i])]
                            for i in range(len(enc.pair_ids))])


def scalar_cost_cells(ds, org, obs):
    """``scalar_cost`` estimates beside the same fractions of plain-forward per-objective margins D (pair × K)
    and their mean s, written out pair by pair: share of pairs with objectives of both signs, that share
    weighted by Σ_k |D_k|, the |D|-mass of objectives against s, the mean over objective pairs of opposite
    signs; and the pair count."""
    st = _step(obs, "scalar_cost")
    if st.get("scalar") is not None:
        raise ValueError("scalar_cost: only the mean-over-objectives scalar is recomputed")
    _, out = _side_outputs(org)
    D = out[:, 0] - out[:, 1]
    K = D.shape[1]
    s = D.mean(1)
    both = [bool((row > 0).any() and (row < 0).any()) for row in D]
    mass = [float(np.abs(row).sum()) for row in D]
    against = [sum(abs(x) for x in row if x * si < 0) for row, si in zip(D, s)]
    pairs_k = [(i, j) for i in range(K) for j in range(i + 1, K)]
    want = {"sign_disagreement": np.mean(both),
            "sign_disagreement_weighted": sum(m for m, b in zip(mass, both) if b) / sum(mass),
            "overruled_preference": sum(against) / sum(mass),
            "mean_pairwise_disagreement": np.mean([np.mean(D[:, i] * D[:, j] < 0) for i, j in pairs_k]),
            "n_pairs": float(len(D))}
    est = ds["scalar_cost"].sel(bound="estimate")
    got = np.asarray([float(est.sel(scalar_cost_statistic=k)) for k in want], np.float64)
    return {"scalar_cost": ([got[:-1], got[-1:] / len(D)], [np.asarray(list(want.values())[:-1]), np.ones(1)])}


def contested_margin_cells(ds, org, obs):
    """``contested_margin`` estimates beside mean |Δ| (plain forward) of the contested and the unanimous pairs
    (agreement = share of ``votes`` for the chosen side; unanimous when max(a, 1 − a) ≥ ``unanimous``), their
    gap, and the two counts (as shares of the pairs)."""
    st = _step(obs, "contested_margin")
    una = float(st.get("unanimous", 1.0))
    enc, out = _side_outputs(org)
    by_id = {p.id: p for p in org.pairs}
    m = np.abs(out[:, 0, 0] - out[:, 1, 0])
    a = []
    for i in enc.pair_ids:
        v = by_id[i].meta_dict().get("votes")
        v = json.loads(v) if isinstance(v, str) else v
        a.append(float("nan") if v is None else sum(int(x) for x in v) / len(v))
    a = np.asarray(a)
    rec = np.isfinite(a)
    cont = rec & (np.maximum(a, 1 - a) < una - 1e-12)
    unan = rec & ~cont
    mc, mu = float(m[cont].mean()), float(m[unan].mean())
    est = ds["contested_margin"].sel(bound="estimate")
    g = lambda k: float(est.sel(contested_statistic=k))  # noqa: E731
    n = float(len(m))
    return {"contested_margin": ([np.asarray([g("abs_margin_contested"), g("abs_margin_unanimous"),
                                              g("abs_margin_gap")]),
                                  np.asarray([g("n_contested"), g("n_unanimous")]) / n],
                                 [np.asarray([mc, mu, mc - mu]), np.asarray([cont.sum(), unan.sum()]) / n])}


def unit_direction_cells(ds, org, obs):
    """``contested_direction``'s norm beside 1: the output is a unit direction (its |cos| to the planted one is
    the criterion's floor), so a reading scaled by any factor is not one."""
    v = np.asarray(ds["contested_direction"].values, np.float64).ravel()
    return {"contested_direction": ([np.asarray([np.linalg.norm(v)])], [np.ones(1)])}


# -- attribution patching ------------------------------------------------------------------------------

def attribution_cells(ds, org, obs):
    """Every (pair, layer, component) cell of ``attribution_patch_effect`` beside gradient × activation
    difference written out: ∂r/∂a of the base side's head output w.r.t. the component's output a at the readout
    (last) token (``torch.autograd.grad`` through a plain forward, batch of one) · (a_source − a_base), the
    source's a from its own plain forward (Nanda 2023, "Attribution patching"; Syed et al. 2023)."""
    import torch
    st = _step(obs, "attribution_patch_effect")
    mode = st.get("mode", "denoise")
    da = ds["attribution_patch_effect"]
    if "objective" in da.dims:
        raise ValueError("attribution_patch_effect: only a one-objective grid is recomputed")
    heads = "head" in da.dims           # a head grid: the o_proj input's slice of each head (z_h)
    enc = _encoded(org)
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
    rows, vals = _rows(ds, "attribution_patch_effect", enc)
    got, want = [], []
    for i, v in zip(rows, vals):
        base, src = (enc.rejected[i], enc.chosen[i]) if mode == "denoise" else (enc.chosen[i], enc.rejected[i])
        a_b, g_b = outputs(base, True)
        a_s, _ = outputs(src, False)
        want.append(np.asarray([g_b[k] @ (a_s[k] - a_b[k]) for k in cells]).reshape(v.shape))
        got.append(v)
    return {"attribution_patch_effect": (got, want)}


# -- path patching -------------------------------------------------------------------------------------

def path_cells(ds, org, obs):
    """Every (pair, layer, component, path) cell of ``path_patch_effect`` beside plain forwards: the base side,
    the source side, and the base side re-run with the sender's readout-token output replaced by the source's
    (``trust.reference``'s hooks); total = r(x') − r(x), direct = r(x + Δa) − r(x), indirect = r(x' − Δa) − r(x)
    with r(x) = the model's own final norm and score modules applied to a last residual x."""
    import torch

    from .reference import plain_forward, plain_modules
    st = _step(obs, "path_patch_effect")
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
    enc = _encoded(org)
    rows, vals = _rows(ds, "path_patch_effect", enc)
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
    from .reference import planted_margins
    st = _step(obs, "hodge_pooled")
    if not st.get("pooled", False):
        raise ValueError("hodge_pooled: only the pooled split is recomputed")
    enc = _encoded(org)
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


def rank_identity_cells(ds, org, obs):
    """``preference_rank``'s gains beside the differences they are defined as (cyclic_gain = transitive − skew
    log-loss; accuracy_gain = skew − transitive accuracy). Not a recomputation: the skew fit is non-convex from a
    seeded start and has no independent reference here, so a forgery that keeps these identities is not caught."""
    est = ds["preference_rank"].sel(bound="estimate")
    g = lambda s: float(est.sel(rank_statistic=s))  # noqa: E731
    return {"preference_rank": ([np.asarray([g("cyclic_gain"), g("accuracy_gain")])],
                                [np.asarray([g("transitive_log_loss") - g("skew_log_loss"),
                                             g("skew_accuracy") - g("transitive_accuracy")])])}
