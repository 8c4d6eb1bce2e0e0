"""Calibration criteria: what a scorecard reads on an organism, and the floor it must clear.

One ``Criterion`` per reading (the table in ``trust.scorecard``'s docstring): ``reading`` per
strength (Spearman against the planted strength), ``floor_value`` at full strength against the
criterion's own ``floor``, and ``magnitude`` — the planted unit's reading in reward units,
compared with the planted effect within the criterion's ``rtol`` — where the reading has a planted
reward-unit counterpart. Each criterion carries its numbers beside it and is registered in
``registries.CRITERIA``, which the gate (``trust.evidence.card_verdict``) reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..kinds.base import Lazy
from ..registries import CRITERIA as REGISTRY
from .kind_criteria import KIND_FLOORS, kind_criteria
from .sae_criteria import sae_criteria
from .drift_criteria import drift_criteria

# each criterion's cell-by-cell recomputation, imported when a card is graded (that workflow module sits above
# these gates in the layers; tests/test_criteria_cells.py resolves every reference)
CELL_TRUTH = __package__ + ".cell_truth"


def _units(da: xr.DataArray, comps=None) -> xr.DataArray:
    """pair × unit, unit = (layer, component), NaN cells (e.g. attn at the embedding) dropped."""
    if comps is not None:
        da = da.sel(component=[c for c in comps if c in da.component.values])
    return da.stack(u=("layer", "component")).dropna("u", how="all")


def _share(da: xr.DataArray, truth: dict, comps=None) -> np.ndarray:
    if "head" in da.dims:            # a head grid: units are (layer, head); graded on a planted head only
        u = da.stack(u=("layer", "head"))
        hit = (u.layer.values == truth["layer"]) & (u["head"].values == truth.get("head", -1))
    else:
        u = _units(da, comps)
        hit = (u.layer.values == truth["layer"]) & (u.component.values == truth["component"])
    if not hit.any():
        return np.full(u.sizes["pair"], np.nan)
    vals = np.asarray(u.transpose("pair", "u").values, np.float64)
    return vals[:, hit].sum(1) / np.abs(vals).sum(1)


def _lens_jump(ds, truth) -> np.ndarray:
    lens = np.asarray(ds["lens"].transpose("pair", "layer").values, np.float64)
    jumps = np.diff(np.concatenate([np.zeros((lens.shape[0], 1)), lens], 1), axis=1)
    col = list(ds["lens"].layer.values).index(truth["layer"])
    return jumps[:, col] * np.sign(lens[:, -1]) / np.abs(jumps).sum(1)


def _steer_ratio(ds, truth) -> np.ndarray:
    return np.asarray(ds["steer_slope"].values, np.float64) / np.asarray(ds["steer_slope_head"].values, np.float64)


def _at_layer(da, truth):
    return da.sel(layer=truth["layer"]) if "layer" in da.dims else da


def _null_excess(ds, truth) -> float:
    obs, null = _at_layer(ds["observed_effect"], truth), _at_layer(ds["null_draws"], truth)
    return float(obs - null.quantile(0.95, "draw"))


def _group_effect(ds, truth) -> np.ndarray:
    return np.asarray(ds["effect_size_by_dimension"].sel(bound="estimate").values, np.float64)


def _planted_paths(ds, truth) -> np.ndarray:
    """Direct path of the direct unit + indirect path of the indirect unit, per pair (reward units)."""
    da = ds["path_patch_effect"]
    if "direct" not in truth:
        return np.full(da.sizes["pair"], np.nan)
    pick = lambda u, path: da.sel(layer=u["layer"], component=u["component"], path=path)  # noqa: E731
    return np.asarray(pick(truth["direct"], "direct") + pick(truth["indirect"], "indirect"), np.float64)


def _path_share(ds, truth) -> float:
    """``_planted_paths`` / Σ (|direct| + |indirect|) over the units other than the relay (whose direct
    write is the indirect path's last leg), mean over pairs."""
    if "direct" not in truth:
        return float("nan")
    u = np.abs(ds["path_patch_effect"].sel(path=["direct", "indirect"])).sum("path").stack(u=("layer", "component"))
    relay = truth.get("relay", {})
    keep = ~((u.layer.values == relay.get("layer")) & (u.component.values == relay.get("component")))
    return float(np.mean(_planted_paths(ds, truth) / np.asarray(u.isel(u=keep).sum("u"), np.float64)))


def _auc(ds, truth) -> float:
    m = np.asarray(ds["margin"].values, np.float64).ravel()
    return float((m > 0).mean() + 0.5 * (m == 0).mean())


def _unit_value(var):
    """The planted unit's reading of ``var`` per pair, reward units."""
    def value(ds, t):
        da = ds[var]
        if "head" in da.dims:        # a head grid: the planted head (NaN without one, which fails the card)
            if "head" not in t:
                return np.full(da.sizes["pair"], np.nan)
            return np.asarray(da.sel(layer=t["layer"], head=t["head"]).values, np.float64)
        return np.asarray(da.sel(layer=t["layer"], component=t["component"]).values, np.float64)
    return value


def _lens_step(ds, t) -> np.ndarray:
    """Normed-lens change over the planted layer per pair, reward units."""
    lens = ds["lens"]
    layers = list(lens.layer.values)
    i = layers.index(t["layer"])
    return np.asarray((lens.isel(layer=i) - lens.isel(layer=i - 1)).values, np.float64)


@dataclass(frozen=True)
class Criterion:
    """One calibration criterion: what it reads on an organism and the numbers it must clear.

    ``floor``: ``floor_value`` at full strength must be ≥ it (units of that value, stated in ``floor_what``);
    ``rtol``: where a planted reward-unit magnitude exists, ``|reading − truth| ≤ rtol·|truth|`` (``None``: no
    magnitude check); ``exact``: an exact instrument, whose magnitude truth is the same cells from a plain
    forward, compared at ``trust.evidence.MAG_RTOL_EXACT``; ``cells``: a cell-by-cell recomputation
    (``trust.cell_truth``) whose fit must be ≥ ``trust.evidence.CELL_FLOOR``. A missing ``floor`` is a
    ``TypeError``.
    """

    name: str
    needs: tuple
    reading: object          # (Dataset, truth) -> per-pair array
    floor_value: object      # (Dataset at strength 1, truth) -> float
    floor_what: str
    magnitude: object        # (Dataset, truth) -> per-pair reward-unit reading of the planted unit, or None
                             # where the reading has no planted reward-unit counterpart (ratios, p-values)
    needs_unit: bool = True
    kinds: tuple = ()        # organism kinds it grades (empty: any, subject to needs_unit)
    cells: object = None     # (Dataset at strength 1, Organism, ObservableSpec) -> (got, want): the output's
                             # cells beside an independent recomputation (trust.cell_truth), fit ≥ CELL_FLOOR
    floor: float | None = None
    rtol: float | None = None
    exact: bool = False

    def __post_init__(self):
        if self.floor is None:
            raise TypeError(f"criterion '{self.name}' needs its floor (floor=...)")


def _floored(floors: dict):
    """``Criterion`` with ``floor`` taken from ``floors`` by name (for rows whose module keeps its floors in a
    table beside them: ``trust.kind_criteria.KIND_FLOORS``)."""
    return lambda name, *a, **kw: Criterion(name, *a, floor=floors[name], **kw)


def _mean(f):
    return lambda ds, t: float(np.mean(f(ds, t)))


def _hodge(ds, t, stat="non_gradient_fraction"):
    return float(ds["hodge_pooled"].sel(flow="labels", hodge_statistic=stat))


def _rank(ds, bound):
    return float(ds["preference_rank"].sel(rank_statistic="cyclic_gain", bound=bound))


def _contested(ds, stat, bound="estimate"):
    return float(ds["contested_margin"].sel(contested_statistic=stat, bound=bound))


def _pr(ds, t):
    return float(ds["effective_objectives"].sel(effective_statistic="participation_ratio"))


def _cost(ds, stat):
    return float(ds["scalar_cost"].sel(scalar_cost_statistic=stat, bound="estimate"))


PREFERENCE_CRITERIA = (   # preference structure (ops/hodge_rank, …), graded on organisms with that truth
    Criterion("label_cycles", ("hodge_pooled",), _hodge,
              lambda ds, t: _hodge(ds, t) - _hodge(ds, t, "null_q95"),
              "labels' pooled non-gradient fraction above its transitive null's 95% quantile", None,
              needs_unit=False, kinds=("planted_cycle",), cells=Lazy(CELL_TRUTH + ".reference_cells", "hodge_cells"), floor=0.0),
    Criterion("cyclic_gain", ("preference_rank",), lambda ds, t: _rank(ds, "estimate"),
              lambda ds, t: _rank(ds, "ci_low"),
              "held-out cyclic_gain's 95% CI above 0 (nats)", None, needs_unit=False, kinds=("planted_cycle",),
              cells=Lazy(CELL_TRUTH + ".summaries", "rank_identity_cells"), floor=1e-09),
    Criterion("contested_direction", ("contested_direction",),
              lambda ds, t: abs(float(np.asarray(ds["contested_direction"].values) @ np.asarray(t["disagreement_direction"]))),
              lambda ds, t: abs(float(np.asarray(ds["contested_direction"].values) @ np.asarray(t["disagreement_direction"]))),
              "|cos| of the recovered and the planted disagreement direction (whitened) ≥ 0.8", None,
              needs_unit=False, kinds=("annotator_mixture",), cells=Lazy(CELL_TRUTH + ".summaries", "unit_direction_cells"), floor=0.8),
    Criterion("contested_margin", ("contested_margin",), lambda ds, t: 1.0 - _contested(ds, "abs_margin_contested")
              / _contested(ds, "abs_margin_unanimous"), lambda ds, t: -_contested(ds, "abs_margin_gap", "ci_high"),
              "contested-minus-unanimous |margin| gap's 95% CI below 0", None, needs_unit=False,
              kinds=("annotator_agreement",), cells=Lazy(CELL_TRUTH + ".summaries", "contested_margin_cells"), floor=1e-09),
    Criterion("effective_objectives", ("effective_objectives",), _pr,
              lambda ds, t: 1.0 - abs(_pr(ds, t) - t["participation_ratio"]) / t["participation_ratio"],
              "participation ratio within 1% of the planted one", None, needs_unit=False, kinds=("multi_objective",),
              floor=0.99),
    Criterion("scalar_cost", ("scalar_cost",), lambda ds, t: _cost(ds, "sign_disagreement_weighted"),
              lambda ds, t: _cost(ds, "sign_disagreement"),
              "share of pairs whose objectives disagree in sign ≥ 0.5 (K uncorrelated rows)", None, needs_unit=False,
              kinds=("multi_objective",), cells=Lazy(CELL_TRUTH + ".summaries", "scalar_cost_cells"), floor=0.5),
)

CRITERIA = (
    Criterion("dla_share", ("dla",), lambda ds, t: _share(ds["dla"], t), _mean(lambda ds, t: _share(ds["dla"], t)),
              "planted unit's signed DLA share ≥ 0.5", _unit_value("dla"), floor=0.5, rtol=0.1, exact=True),
    Criterion("patch_share", ("patch_effect",), lambda ds, t: _share(ds["patch_effect"], t, ("attn", "mlp")),
              _mean(lambda ds, t: _share(ds["patch_effect"], t, ("attn", "mlp"))),
              "planted unit's signed share of |patch effect| over attn/mlp units ≥ 0.5", _unit_value("patch_effect"),
              floor=0.5, rtol=0.1, exact=True),
    Criterion("attribution_share", ("attribution_patch_effect",),
              lambda ds, t: _share(ds["attribution_patch_effect"], t, ("attn", "mlp")),
              _mean(lambda ds, t: _share(ds["attribution_patch_effect"], t, ("attn", "mlp"))),
              "planted unit's signed share of |attribution patch effect| ≥ 0.5",
              _unit_value("attribution_patch_effect"), cells=Lazy(CELL_TRUTH + ".hooked", "attribution_cells"), floor=0.5, rtol=0.25),
    Criterion("ablation_share", ("ablation_effect",), lambda ds, t: -_share(ds["ablation_effect"], t, ("attn", "mlp")),
              _mean(lambda ds, t: -_share(ds["ablation_effect"], t, ("attn", "mlp"))),
              "planted unit's share of |ablation effect| over attn/mlp units (removing it lowers Δ) ≥ 0.5", None,
              floor=0.5),
    Criterion("steer_alignment", ("steer_slope", "steer_slope_head"), _steer_ratio, _mean(_steer_ratio),
              "steering along the fitted direction moves Δ ≥ 0.5 as fast as along w_r", None,
              cells=Lazy(CELL_TRUTH + ".hooked", "steer_cells"), floor=0.5),
    Criterion("null_excess", ("observed_effect", "null_draws", "p_value"), _null_excess,
              lambda ds, t: 1.0 - float(_at_layer(ds["p_value"], t)),
              "1 − p of the planted layer's effect against its null ≥ 0.95", None, cells=Lazy(CELL_TRUTH + ".summaries", "null_cells"),
              floor=0.95),
    Criterion("group_stats", ("accuracy_by_dimension", "effect_size_by_dimension"), _group_effect,
              lambda ds, t: float(ds["accuracy_by_dimension"].sel(bound="ci_low").min()),
              "every group's accuracy CI above chance (ci_low ≥ 0.5)", None, needs_unit=False,
              cells=Lazy(CELL_TRUTH + ".reference_cells", "group_cells"), floor=0.5),
    Criterion("path_separation", ("path_patch_effect",), _planted_paths, _path_share,
              "the planted paths' share of Σ|direct|+|indirect| over non-relay units ≥ 0.5", None,
              cells=Lazy(CELL_TRUTH + ".reference_cells", "path_cells"), floor=0.5),
    Criterion("lens_jump", ("lens",), _lens_jump, _mean(_lens_jump),
              "share of the normed lens' total movement made at the planted layer ≥ 0.5", _lens_step,
              floor=0.5, rtol=0.15, exact=True),
    Criterion("crystallization", ("lens", "crystallization_layer"), _lens_jump,
              lambda ds, t: float((np.asarray(ds["crystallization_layer"].values) >= t["layer"]).mean()),
              "fraction of pairs crystallizing at or after the planted layer ≥ 0.8", _lens_step,
              floor=0.8, rtol=0.15, exact=True),
    Criterion("score", ("margin",), lambda ds, t: 1.0 / (1.0 + np.exp(-np.asarray(ds["margin"].values, float))),
              _auc, "detection AUC P(Δ>0) + ½P(Δ=0) ≥ 0.8",
              lambda ds, t: np.asarray(ds["margin"].values, np.float64), needs_unit=False,
              floor=0.8, rtol=0.1, exact=True),
) + PREFERENCE_CRITERIA + kind_criteria(_floored(KIND_FLOORS)) + sae_criteria(Criterion) \
    + drift_criteria(Criterion)   # judge, PRM, implicit, LEACE, curvature
# (trust.kind_criteria); sparse features (trust.sae_criteria); drift (trust.drift_criteria, trust.drift_card)
for _c in CRITERIA:
    REGISTRY.register(_c)
