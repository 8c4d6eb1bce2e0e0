"""Confounders of a reward margin: length, presentation order, lexical support from the prompt.

Operators (all gauge-invariant; statistics from ``stats``: cluster bootstrap over prompt
clusters, 95% percentile CIs; ``n_pairs`` and ``n_effective`` = distinct prompt clusters):

``pair_feature`` (no input) → ``pair``: a per-pair feature, chosen minus rejected:
  length_log_ratio  log((1 + len_c)/(1 + len_r)), characters                   [log_ratio]
  length_diff       len_c − len_r, characters                                  [chars]
  overlap_diff      overlap(chosen, prompt) − overlap(rejected, prompt), where overlap is the
                    share of the response's word tokens (``\\w+``, lowercased) found in the
                    prompt's words; NaN when the prompt has fewer than ``min_prompt_words``
                    words (no evidence to copy from)                           [fraction]
  chosen_position   ``Pair.meta["chosen_position"]`` (1 or 2) where the data records the
                    presentation order (llmbar), else NaN                      [position]
``confound`` (margin; ``feature``: a pair_feature step) → ``statistic × bound``:
  model_accuracy, baseline_accuracy ("feature > 0 wins"), spearman ρ(margin, feature),
  matched_model_accuracy / matched_baseline_accuracy (|feature| ≤ ``matched``),
  model_accuracy_feature_agrees (feature > 0) / _disagrees (feature < 0), n_pairs, n_effective.
  Pairs with a NaN feature are left out.
``position_bias`` (margin; ``feature``: chosen_position) → ``order_statistic × bound`` (its own
  dim, so that one Dataset holding both kinds does not pad either with NaN rows):
  chosen_first_rate (label bias of the data), model_accuracy_chosen_first / _second,
  accuracy_gap (first − second), n_pairs, n_effective. All NaN when no pair records a position.
``swap_consistency`` (margin; re-runs the model) → ``pair``: Δ(c, r) + Δ(r, c), both orders
  re-scored with ``batch_size`` sequences per forward (1 by default: no padding, so the two
  orders see identical computations and the residual must be exactly 0). Pairs beyond
  ``observable.pairs`` are NaN.
Sources: length bias of reward models — Singhal et al. 2023, "A Long Way to Go"; position bias —
Zheng et al. 2023 (MT-Bench); lexical-overlap baselines — McCoy et al. 2019 (HANS).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..registries import OPERATORS
from .base import INVARIANT, Operator, labelled, need_dim
from ..data.checksum import prompt_cluster_key
from ..stats import accuracy, bootstrap_ci, correct, mean_with_ci, n_eff, spearman

FEATURES = {"length_log_ratio": "log_ratio", "length_diff": "chars", "overlap_diff": "fraction",
            "chosen_position": "position"}
BOUND = ["estimate", "ci_low", "ci_high"]
_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall((text or "").lower())


def overlap(response: str, prompt_words: set) -> float:
    """Share of the response's word tokens that occur in ``prompt_words`` (0 for an empty response)."""
    w = _words(response)
    return sum(t in prompt_words for t in w) / len(w) if w else 0.0


def pair_feature(pair, feature: str, min_prompt_words: int = 30) -> float:
    """One pair's feature value (see module doc)."""
    if feature == "length_log_ratio":
        return float(np.log1p(len(pair.chosen)) - np.log1p(len(pair.rejected)))
    if feature == "length_diff":
        return float(len(pair.chosen) - len(pair.rejected))
    if feature == "overlap_diff":
        pw = _words(pair.prompt)
        if len(pw) < min_prompt_words:
            return float("nan")
        s = set(pw)
        return overlap(pair.chosen, s) - overlap(pair.rejected, s)
    if feature == "chosen_position":
        v = pair.meta_dict().get("chosen_position")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")
    raise SpecError("observable.steps.feature", f"unknown feature '{feature}'.", value=feature, options=FEATURES)


def prompt_groups(ctx):
    by_id = {p.id: p for p in ctx.pairs}
    return np.array([prompt_cluster_key(by_id[i].prompt) for i in ctx.encoded.pair_ids], dtype=object)


def _per_objective(margin: xr.DataArray):
    if "objective" in margin.dims:
        return [(str(o), margin.sel(objective=o).values) for o in margin["objective"].values]
    return [(None, margin.values)]


def _stats_array(rows: list[tuple], per_obj: list[tuple], description: str, dim: str = "statistic") -> xr.DataArray:
    """``rows``: statistic names; ``per_obj``: (objective, {name: (est, lo, hi)})."""
    data = np.array([[[d[name][k] for k in range(3)] for name in rows] for _, d in per_obj], np.float64)
    coords = {dim: list(rows), "bound": BOUND}
    if per_obj[0][0] is None:
        arr = xr.DataArray(data[0], dims=(dim, "bound"), coords=coords)
    else:
        arr = xr.DataArray(data, dims=("objective", dim, "bound"),
                           coords={**coords, "objective": [o for o, _ in per_obj]})
    return labelled(arr, "statistic", INVARIANT, description)


def _triple(d: dict) -> tuple:
    return (d["estimate"], d["ci_low"], d["ci_high"])


def _count(n) -> tuple:
    return (float(n),) * 3


@dataclass(frozen=True)
class PairFeatureParams:
    feature: str
    min_prompt_words: int = 30


@OPERATORS.register
class PairFeature(Operator):
    """A per-pair confounder feature (length, prompt overlap, presentation position)."""

    name = "pair_feature"
    pair_fields = ("chosen_position",)
    per_pair = True
    dims = "() → pair"
    Params = PairFeatureParams
    n_inputs = 0

    def out_dims(self, in_dims, info, where):
        if self.p.feature not in FEATURES:
            raise SpecError(where + ".feature", f"unknown feature '{self.p.feature}'.", value=self.p.feature,
                            options=FEATURES)
        return ("pair",)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx):
        by_id = {p.id: p for p in ctx.pairs}
        vals = [pair_feature(by_id[i], self.p.feature, self.p.min_prompt_words) for i in ctx.encoded.pair_ids]
        arr = xr.DataArray(np.array(vals, np.float64), dims=("pair",), coords=ctx.pair_coords())
        return labelled(arr, FEATURES[self.p.feature], INVARIANT, f"{self.p.feature}, chosen minus rejected")


@dataclass(frozen=True)
class ConfoundParams:
    feature: str
    matched: float = 0.1
    n_boot: int = 1000
    seed: int = 0


def _margin_dims(in_dims, where):
    need_dim(in_dims[0], "pair", where, "a margin per pair")
    if "side" in in_dims[0] or set(in_dims[0]) - {"pair", "objective"}:
        raise SpecError(where + ".input", f"needs a margin (pair [× objective]), got dims {in_dims[0]}.",
                        fix="feed it the 'margin' step of the score observable.")
    return ("objective",) if "objective" in in_dims[0] else ()


@OPERATORS.register
class Confound(Operator):
    """Margin vs a per-pair feature: baseline accuracy, Spearman ρ, matched-bin accuracy, with CIs."""

    name = "confound"
    dims = "margin (pair [× objective]), feature (pair) → [objective ×] statistic × bound"
    Params = ConfoundParams
    n_inputs = 2
    extra_inputs = ("feature",)

    def out_dims(self, in_dims, info, where):
        return _margin_dims(in_dims, where) + ("statistic", "bound")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, margin, feature):
        f_all, g_all = np.asarray(feature.values, np.float64), prompt_groups(ctx)
        keep = np.isfinite(f_all)
        f, g = f_all[keep], g_all[keep]
        kw = dict(n_boot=self.p.n_boot, seed=self.p.seed)
        names = ["model_accuracy", "baseline_accuracy", "spearman", "matched_model_accuracy",
                 "matched_baseline_accuracy", "model_accuracy_feature_agrees",
                 "model_accuracy_feature_disagrees", "n_pairs", "n_effective"]
        per_obj = []
        for obj, m_all in _per_objective(margin):
            m = np.asarray(m_all, np.float64)[keep]
            close, agree, dis = np.abs(f) <= self.p.matched, f > 0, f < 0
            per_obj.append((obj, {
                "model_accuracy": _triple(accuracy(m, groups=g, **kw)),
                "baseline_accuracy": _triple(accuracy(f, groups=g, **kw)),
                "spearman": _triple(spearman(m, f, groups=g, **kw)),
                "matched_model_accuracy": _triple(accuracy(m[close], groups=g[close], **kw)),
                "matched_baseline_accuracy": _triple(accuracy(f[close], groups=g[close], **kw)),
                "model_accuracy_feature_agrees": _triple(accuracy(m[agree], groups=g[agree], **kw)),
                "model_accuracy_feature_disagrees": _triple(accuracy(m[dis], groups=g[dis], **kw)),
                "n_pairs": _count(len(m)), "n_effective": _count(n_eff(g, len(m)))}))
        out = _stats_array(names, per_obj, f"margin vs {feature.attrs.get('description', 'feature')}")
        out.attrs.update(n_pairs=int(keep.sum()), n_effective=int(n_eff(g, len(g))), matched=float(self.p.matched))
        return out


@OPERATORS.register
class PositionBias(Operator):
    """Label position bias and accuracy by the chosen response's presentation position, with CIs."""

    name = "position_bias"
    dims = "margin (pair [× objective]), feature (pair) → [objective ×] order_statistic × bound"
    Params = ConfoundParams
    n_inputs = 2
    extra_inputs = ("feature",)

    def out_dims(self, in_dims, info, where):
        return _margin_dims(in_dims, where) + ("order_statistic", "bound")

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, margin, feature):
        pos, g_all = np.asarray(feature.values, np.float64), prompt_groups(ctx)
        keep = np.isfinite(pos)
        pos, g = pos[keep], g_all[keep]
        kw = dict(n_boot=self.p.n_boot, seed=self.p.seed)
        names = ["chosen_first_rate", "model_accuracy_chosen_first", "model_accuracy_chosen_second",
                 "accuracy_gap", "n_pairs", "n_effective"]
        per_obj = []
        for obj, m_all in _per_objective(margin):
            c = correct(np.asarray(m_all, np.float64)[keep])
            first = pos == 1

            def gap(idx, c=c, first=first):
                a, b = c[idx][first[idx]], c[idx][~first[idx]]
                return float(a.mean() - b.mean()) if len(a) and len(b) else np.nan
            est = gap(np.arange(len(c))) if len(c) else np.nan
            lo, hi = bootstrap_ci(gap, len(c), groups=g, **kw)
            per_obj.append((obj, {
                "chosen_first_rate": _triple(mean_with_ci(first.astype(float), groups=g, **kw)),
                "model_accuracy_chosen_first": _triple(mean_with_ci(c[first], groups=g[first], **kw)),
                "model_accuracy_chosen_second": _triple(mean_with_ci(c[~first], groups=g[~first], **kw)),
                "accuracy_gap": (est, lo, hi), "n_pairs": _count(len(c)), "n_effective": _count(n_eff(g, len(c)))}))
        out = _stats_array(names, per_obj, "presentation order: label bias and accuracy by chosen position",
                           dim="order_statistic")
        out.attrs.update(n_pairs=int(keep.sum()), n_effective=int(n_eff(g, len(g))))
        return out


@dataclass(frozen=True)
class SwapParams:
    batch_size: int = 1
    limit: Optional[int] = None


@OPERATORS.register
class SwapConsistency(Operator):
    """Δ(c, r) + Δ(r, c) per pair, both orders re-scored (exactly 0 when scoring is per side)."""

    name = "swap_consistency"
    dims = "margin (pair [× objective]) → same dims"
    Params = SwapParams
    reruns = True
    restricted_by = ("pairs",)

    def out_dims(self, in_dims, info, where):
        return ("pair",) + _margin_dims(in_dims, where)

    def gauge(self, in_gauges, info):
        return INVARIANT

    def run(self, ctx, margin):
        from ..engine.capture import capture
        enc = ctx.encoded
        n_all = len(enc.pair_ids)
        n = min(x for x in (n_all, ctx.info.pairs, self.p.limit) if x is not None)
        kw = dict(sites=(), batch_size=self.p.batch_size, padding_side=getattr(ctx.lm.tokenizer, "padding_side", "left"))
        fwd = type(enc)(**{**enc.__dict__, "pair_ids": enc.pair_ids[:n], "chosen": enc.chosen[:n],
                           "rejected": enc.rejected[:n]})
        rev = type(enc)(**{**enc.__dict__, "pair_ids": enc.pair_ids[:n], "chosen": enc.rejected[:n],
                           "rejected": enc.chosen[:n]})
        a, b = capture(ctx.lm, fwd, **kw), capture(ctx.lm, rev, **kw)
        ctx.add_counts(self.name, {"forward_passes": a.counts["forward_passes"] + b.counts["forward_passes"]})
        ra, rb = ctx.lm.head.rewards(a.h, a.gate).astype(np.float64), ctx.lm.head.rewards(b.h, b.gate).astype(np.float64)
        resid = np.full((n_all, ra.shape[-1]), np.nan)
        resid[:n] = (ra[:, 0] - ra[:, 1]) + (rb[:, 0] - rb[:, 1])
        coords = ctx.pair_coords()
        if "objective" in margin.dims:
            arr = xr.DataArray(resid, dims=("pair", "objective"), coords={**coords, "objective": margin["objective"].values})
        else:
            arr = xr.DataArray(resid[:, 0], dims=("pair",), coords=coords)
        out = labelled(arr, "reward", INVARIANT, "margin(chosen, rejected) + margin(rejected, chosen)")
        out.attrs.update(n_pairs=int(n), batch_size=int(self.p.batch_size))
        return out
