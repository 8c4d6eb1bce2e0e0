"""Summary cells recomputed from plain-forward outputs (``trust.cell_truth``): the per-layer null and its p-values,
and the preference-structure statistics (scalar cost, contested margin, a unit direction, the rank gains)."""
from __future__ import annotations

import json

import numpy as np

from .common import encoded, hooked_forward, obs_step


# -- the null ----------------------------------------------------------------------------------------------

def null_cells(ds, org, obs):
    """``observed_effect`` per layer beside the mean over pairs of w_r · (mlp_out_c − mlp_out_r) at the readout
    token, and ``p_value`` beside the Monte-Carlo p (1 + #{draw ≥ observed}) / (1 + B) of the stored draws,
    Benjamini–Hochberg adjusted by ``statsmodels``."""
    from statsmodels.stats.multitest import multipletests
    st = {k: obs_step(obs, k) for k in ("observed_effect", "null_draws", "p_value")}
    chain = {s["name"]: s for s in obs.steps}
    src = chain.get(st["observed_effect"].get("input"), {})
    src = chain.get(src.get("input"), {})                  # reduce <- diff <- project <- capture
    if src.get("op") != "project" or src.get("direction", "head") != "head" or \
            chain.get(src.get("input"), {}).get("site") != "mlp_out":
        raise ValueError("observed_effect: only the mean w_r · Δ mlp_out of each layer is recomputed")
    enc = encoded(org)
    model = org.lm.model
    L = len(model.model.layers)
    w = model.score.weight.detach().double().numpy()[0]
    diff = []
    for i in range(len(enc.pair_ids)):
        sides = [hooked_forward(model, s, keep=[(l, "mlp") for l in range(L)])[1]
                 for s in (enc.chosen[i], enc.rejected[i])]
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
    enc = encoded(org)
    return enc, np.asarray([[hooked_forward(org.lm.model, s)[0] for s in (enc.chosen[i], enc.rejected[i])]
                            for i in range(len(enc.pair_ids))])


def scalar_cost_cells(ds, org, obs):
    """``scalar_cost`` estimates beside the same fractions of plain-forward per-objective margins D (pair × K)
    and their mean s, written out pair by pair: share of pairs with objectives of both signs, that share
    weighted by Σ_k |D_k|, the |D|-mass of objectives against s, the mean over objective pairs of opposite
    signs; and the pair count."""
    st = obs_step(obs, "scalar_cost")
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
    st = obs_step(obs, "contested_margin")
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


def rank_identity_cells(ds, org, obs):
    """``preference_rank``'s gains beside the differences they are defined as (cyclic_gain = transitive − skew
    log-loss; accuracy_gain = skew − transitive accuracy). Not a recomputation: the skew fit is non-convex from a
    seeded start and has no independent reference here, so a forgery that keeps these identities is not caught."""
    est = ds["preference_rank"].sel(bound="estimate")
    g = lambda s: float(est.sel(rank_statistic=s))  # noqa: E731
    return {"preference_rank": ([np.asarray([g("cyclic_gain"), g("accuracy_gain")])],
                                [np.asarray([g("transitive_log_loss") - g("skew_log_loss"),
                                             g("skew_accuracy") - g("transitive_accuracy")])])}
