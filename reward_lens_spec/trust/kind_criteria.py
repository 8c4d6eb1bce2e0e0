"""Calibration criteria for the other kinds of reward signal and the representation instruments.

Each is graded only on its own organism family (``organisms.kind_organisms``) and reads the planted truth that
family records; ``trust.criteria.CRITERIA`` includes them. Floors in ``trust.evidence.FLOORS``.

================  ==================  ==========================================  ==================================
criterion         needs               reading per strength                        floor at full strength
================  ==================  ==========================================  ==================================
verdict_margin    margin              mean verdict margin (reward units)          1 − max |Δ − Δ_causal| / RMS(Δ_causal)
                  (judge_planted)                                                 ≥ 0.999, Δ_causal the causal LM's own
                                                                                  logit(Y) − logit(N) margin
prm_bad_step      step_reward         −(drop of the rejected − chosen step        share of pairs whose most negative
                  (prm_planted)       margin at the planted bad step), mean       drop is the planted step ≥ 0.9
prm_step_reward   step_reward         mean chosen − rejected step reward over     every step of every side: 1 − max
                  (prm_planted)       pairs and steps                             |step − plain forward's| / RMS ≥
                                                                                  0.999 (as many steps as the
                                                                                  organism's sides have)
prm_step_margin   step_margin         mean step margin over pairs and steps       every step's margin: 1 − max err /
                  (prm_planted)                                                   RMS ≥ 0.999 against the plain
                                                                                  forward's chosen − rejected
implicit_log_     per_token_reward    mean Σ_t per-token reward, chosen −         every response token, position by
ratio             (implicit_planted)  rejected (reward units)                     position: min(1 − max |err| / RMS,
                                                                                  Pearson r) ≥ 0.999 against the
                                                                                  planted per-token term
ensemble_reward   reward              mean ensemble margin (reward units)         every pair's reduced reward, both
                  (ensemble_planted)                                              sides: 1 − max err / RMS ≥ 0.999
                                                                                  against the declared reduce (naive
                                                                                  quantile) of each member's own
                                                                                  plain-forward reward
ensemble_member_  member_margin       mean member margin                          every (pair, member) margin against
margin            (ensemble_planted)                                              that member's own: 1 − max err /
                                                                                  RMS ≥ 0.999
leace_removal     certificate         probe AUC before − after erasure            share of the probe's above-chance
                  (concept)                                                       AUC erasure removes ≥ 0.8
leace_            displacement,       planted − non-planted concept's relative    1 − non-planted / planted
specificity       unplanted_displ…    displacement (mean)                         displacement ≥ 0.75
                  (concept)
curvature_        margin_eigenvalues  top |eigenvalue| (mean over pairs)           Rayleigh quotient of the planted
direction         (curvature)                                                     direction vᵀHv (plain double
                                                                                  backward) / top eigenvalue ≥ 0.9
================  ==================  ==========================================  ==================================

``leace_removal``, ``leace_specificity`` and ``curvature_direction`` also read their outputs cell by cell against
``trust.cell_truth`` (the certificate's AUCs, every held-out displacement, the top eigenvalues of a dense Hessian;
``evidence.CELL_FLOOR``), so displacements scaled together or eigenvalues 4 % off fail though the ratios pass.

A wrong instrument fails: a flipped verdict sign reads falling and off the causal LM's margin; the wrong step
misses the planted one; a step reward or margin off by 5% anywhere but the readout step misses the plain forward's;
a per-token reward redistributed with its sum kept (deviations scaled or sign-flipped, one position late) misses
the planted per-token terms; a reading with a step or token missing or extra raises ``ValueError`` naming the
row, which ``trust.scorecard.grade`` records as the criterion's ``reading_errors`` entry (a failing card); an erasure that
leaves the concept readable keeps its AUC; an erasure that moves every concept is not specific; a top eigenvalue
off the planted direction has a Rayleigh quotient far below 1 along it.
"""
from __future__ import annotations

import numpy as np

from ..kinds.base import Lazy

CELL_TRUTH = __package__ + ".cell_truth"   # cell recomputations, imported when a card is graded (trust.criteria)


def _by_pair(ds, var, table) -> np.ndarray:
    return np.asarray([table[str(p)] for p in ds[var].pair.values], np.float64)


def _verdict_floor(ds, t) -> float:
    if "verdict_margin" not in t:
        return float("nan")
    want = _by_pair(ds, "margin", t["verdict_margin"])
    got = np.asarray(ds["margin"].values, np.float64)
    return 1.0 - float(np.max(np.abs(got - want)) / max(np.sqrt(np.mean(want ** 2)), 1e-12))


def _drops(ds, t):
    sr = np.asarray(ds["step_reward"].transpose("pair", "side", "step").values, np.float64)
    gap = sr[:, 1] - sr[:, 0]                         # rejected − chosen per step
    drop = np.diff(np.concatenate([np.zeros((gap.shape[0], 1)), gap], 1), axis=1)
    bad = np.asarray([t["bad_step"][str(p)] for p in ds["step_reward"].pair.values], np.int64)
    if bad.size and bad.max() >= drop.shape[1]:
        raise ValueError(f"step_reward has {drop.shape[1]} step(s); the planted bad step {int(bad.max())} is not "
                         "among them")
    return drop, bad


def _prm_reading(ds, t) -> np.ndarray:
    drop, bad = _drops(ds, t)
    return -drop[np.arange(len(bad)), bad]


def _prm_floor(ds, t) -> float:
    drop, bad = _drops(ds, t)
    return float((np.nanargmin(drop, 1) == bad).mean())


def _rows(ds, var, table, key) -> tuple[list, list]:
    """Every (pair, side) row of ``var`` (pair × side × step|position, NaN past a side's end) beside the truth's
    list for it (``table[pair id][side]``), as flat float64 arrays; ``ValueError`` naming the row when the
    reading's finite cells are not exactly the truth's length (a step or token missing, extra or NaN)."""
    da = ds[var].transpose("pair", "side", key)
    vals = np.asarray(da.values, np.float64)
    got, want = [], []
    for i, pid in enumerate(da.pair.values):
        for s, side in enumerate(da.side.values):
            w = np.asarray(table[str(pid)][s], np.float64)
            row = vals[i, s]
            n = int(np.isfinite(row).sum())
            if len(w) > row.size or n != len(w) or not np.isfinite(row[:len(w)]).all():
                raise ValueError(f"{var} of {pid}/{side}: {n} finite {key}(s) read where the organism has "
                                 f"{len(w)}")
            got.append(row[:len(w)])
            want.append(w)
    return got, want


def _fit(got, want) -> float:
    """1 − max |reading − truth| / RMS(truth) over every cell (reward units)."""
    g, w = np.concatenate(got), np.concatenate(want)
    return 1.0 - float(np.max(np.abs(g - w)) / max(np.sqrt(np.mean(w ** 2)), 1e-12))


def _fit_and_corr(got, want) -> float:
    """The worse of ``_fit`` and Pearson's r between reading and truth over every cell."""
    g, w = np.concatenate(got), np.concatenate(want)
    r = float(np.corrcoef(g, w)[0, 1]) if np.ptp(g) > 0 and np.ptp(w) > 0 else float("nan")
    return min(_fit(got, want), r)


def _step_gap(ds, t) -> float:
    """Mean over pairs and shared steps of the chosen − rejected step reward (reward units)."""
    got, _ = _rows(ds, "step_reward", t["step_reward"], "step")
    return float(np.mean(np.concatenate([c[:len(r)] - r[:len(c)] for c, r in zip(got[0::2], got[1::2])])))


def _step_margins(ds, t) -> tuple[list, list]:
    """Every pair's ``step_margin`` row beside the truth's chosen − rejected per step both sides have."""
    table = {p: [np.asarray(c[:len(r)]) - np.asarray(r[:len(c)])] for p, (c, r) in t["step_reward"].items()}
    return _rows(ds[["step_margin"]].expand_dims(side=["both"]), "step_margin", table, "step")


def _per_token_sum(ds) -> np.ndarray:
    pt = ds["per_token_reward"].transpose("pair", "side", "position")
    return np.nansum(np.asarray(pt.values, np.float64), -1)


def _implicit_reading(ds, t) -> np.ndarray:
    s = _per_token_sum(ds)
    return s[:, 0] - s[:, 1]


def _implicit_floor(ds, t) -> float:
    return _fit_and_corr(*_rows(ds, "per_token_reward", t["planted_per_token"], "position"))


def _auc(ds, stage) -> float:
    return float(ds["certificate"].sel(stage=stage, bound="estimate"))


def _removed(ds, t) -> float:
    above = _auc(ds, "before") - 0.5
    return 1.0 - abs(_auc(ds, "after") - 0.5) / above if above > 0 else float("nan")


def _displacement(ds, var) -> float:
    return float(np.nanmean(np.asarray(ds[var].values, np.float64)))


def _top_eig(ds) -> np.ndarray:
    """Top |eigenvalue| per pair (and side, for ``of: reward``)."""
    ev = ds["margin_eigenvalues"]
    ev = ev.isel(rank=0) if "rank" in ev.dims else ev
    return np.abs(np.asarray(ev.transpose("pair", *(("side",) if "side" in ev.dims else ())).values, np.float64))


def _rayleigh(ds, t) -> float:
    """Planted direction's Rayleigh quotient |vᵀHv| over the top |eigenvalue|, mean over the pairs (and sides)
    the reading covers; vᵀHv of the margin is vᵀH_c v − vᵀH_r v."""
    if "rayleigh" not in t:
        return float("nan")
    top = _top_eig(ds)
    q = np.asarray([t["rayleigh"][str(p)] for p in ds["margin_eigenvalues"].pair.values], np.float64)
    want = np.abs(q if top.ndim == 2 else q[:, 0] - q[:, 1])
    ok = np.isfinite(top) & (top > 0)
    return float(np.mean(want[ok] / top[ok])) if ok.any() else float("nan")


def naive_reduce(x, how: str, q: float) -> float:
    """The ensemble reward a list of member rewards implies: mean, min, or the ``q`` quantile by linear
    interpolation between order statistics (Hyndman & Fan 1996, definition 7), written out."""
    x = sorted(float(v) for v in x)
    if how == "mean":
        return sum(x) / len(x)
    if how == "min":
        return x[0]
    h = (len(x) - 1) * q
    lo = int(np.floor(h))
    return x[lo] + (h - lo) * (x[min(lo + 1, len(x) - 1)] - x[lo])


def _ensemble_rows(ds, t) -> tuple[list, list]:
    """Each pair's reduced reward [chosen, rejected] beside the reduce of the members' plain-forward rewards."""
    da = ds["reward"].transpose("pair", "side")
    got = list(np.asarray(da.values, np.float64))
    want = [np.asarray([naive_reduce([m[s] for m in t["member_reward"][str(p)]], t["reduce"], t["q"])
                        for s in (0, 1)]) for p in da.pair.values]
    return got, want


def _member_margins(ds, t) -> tuple[list, list]:
    """Each pair's ``member_margin`` row (members in the truth's order) beside each member's plain-forward margin."""
    da = ds["member_margin"]
    names = [str(m) for m in da.member.values]
    if names != list(t["members"]):
        raise ValueError(f"member_margin's members {names} are not the organism's {list(t['members'])}")
    vals = np.asarray(da.transpose("pair", "member").values, np.float64)
    want = [np.asarray([m[0] - m[1] for m in t["member_reward"][str(p)]]) for p in da.pair.values]
    return list(vals), want


def kind_criteria(Criterion) -> tuple:
    """The criteria of this module as ``trust.criteria.Criterion`` rows (the class passed in: no import cycle)."""
    return (
        Criterion("verdict_margin", ("margin",), lambda ds, t: np.asarray(ds["margin"].values, np.float64),
                  _verdict_floor, "verdict margin equals the causal LM's own logit(Y) − logit(N) margin "
                  "(1 − max err / RMS ≥ 0.999)", None, needs_unit=False, kinds=("judge_planted",)),
        Criterion("prm_bad_step", ("step_reward",), _prm_reading, _prm_floor,
                  "share of pairs whose largest step-margin drop is the planted bad step ≥ 0.9", None,
                  needs_unit=False, kinds=("prm_planted",)),
        Criterion("prm_step_reward", ("step_reward",), _step_gap,
                  lambda ds, t: _fit(*_rows(ds, "step_reward", t["step_reward"], "step")),
                  "every step's reward, both sides, equals the plain forward's (1 − max err / RMS ≥ 0.999)", None,
                  needs_unit=False, kinds=("prm_planted",)),
        Criterion("prm_step_margin", ("step_margin",), lambda ds, t: float(np.mean(np.concatenate(
                      _step_margins(ds, t)[0]))), lambda ds, t: _fit(*_step_margins(ds, t)),
                  "every step's chosen − rejected margin equals the plain forward's (1 − max err / RMS ≥ 0.999)",
                  None, needs_unit=False, kinds=("prm_planted",)),
        Criterion("implicit_log_ratio", ("per_token_reward",), _implicit_reading, _implicit_floor,
                  "every response token's reward equals the planted per-token term, position by position: "
                  "min(1 − max err / RMS, Pearson r) ≥ 0.999", None, needs_unit=False, kinds=("implicit_planted",)),
        Criterion("ensemble_reward", ("reward",), lambda ds, t: float(np.mean(np.diff(
                      -np.asarray(ds["reward"].transpose("pair", "side").values, np.float64), axis=1))),
                  lambda ds, t: _fit(*_ensemble_rows(ds, t)),
                  "every pair's reduced reward, both sides, equals the declared reduce of the members' own rewards "
                  "(1 − max err / RMS ≥ 0.999)", None, needs_unit=False, kinds=("ensemble_planted",)),
        Criterion("ensemble_member_margin", ("member_margin",),
                  lambda ds, t: float(np.nanmean(np.asarray(ds["member_margin"].values, np.float64))),
                  lambda ds, t: _fit(*_member_margins(ds, t)),
                  "every (pair, member) margin equals that member's own (1 − max err / RMS ≥ 0.999)", None,
                  needs_unit=False, kinds=("ensemble_planted",)),
        Criterion("leace_removal", ("certificate",), lambda ds, t: _auc(ds, "before") - _auc(ds, "after"), _removed,
                  "share of the probe's above-chance AUC that erasure removes ≥ 0.8", None, needs_unit=False,
                  kinds=("concept",), cells=Lazy(CELL_TRUTH + ".leace", "leace_certificate_cells")),
        Criterion("leace_specificity", ("displacement", "unplanted_displacement"),
                  lambda ds, t: _displacement(ds, "displacement") - _displacement(ds, "unplanted_displacement"),
                  lambda ds, t: 1.0 - _displacement(ds, "unplanted_displacement") / _displacement(ds, "displacement"),
                  "erasing the non-planted concept moves the activation ≤ 0.25 as far as the planted one", None,
                  needs_unit=False, kinds=("concept",), cells=Lazy(CELL_TRUTH + ".leace", "leace_displacement_cells")),
        Criterion("curvature_direction", ("margin_eigenvalues",), lambda ds, t: np.nanmean(_top_eig(ds)),
                  _rayleigh, "planted direction's |vᵀHv| / top |eigenvalue| ≥ 0.9", None, needs_unit=False,
                  kinds=("curvature",), cells=Lazy(CELL_TRUTH + ".hooked", "curvature_cells")),
    )


KIND_FLOORS = {"verdict_margin": 0.999, "prm_bad_step": 0.9, "prm_step_reward": 0.999, "prm_step_margin": 0.999,
               "ensemble_reward": 0.999, "ensemble_member_margin": 0.999, "implicit_log_ratio": 0.999, "leace_removal": 0.8,
               "leace_specificity": 0.75, "curvature_direction": 0.9}
