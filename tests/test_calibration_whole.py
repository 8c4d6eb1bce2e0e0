"""Calibration reads the whole output it grades (issue 37 item 7): every PRM step, every step margin, every
response token's implicit reward, position by position, against a truth the organism computes with its own
tokenization and a plain forward (``kinds.prm.organism.plain_step_rewards``, ``kind_organisms.
implicit_organism``). Readings that keep the graded summary (the readout step, the per-token sum) but are
wrong elsewhere fail; a reading that does not fit its criterion (fewer steps, a constant) gives a failing card
with its reason instead of a traceback."""
from __future__ import annotations

import unittest.mock as um
from pathlib import Path

import numpy as np
import pytest

from reward_lens_spec.organisms.kind_organisms import organism_family
from reward_lens_spec.trust import scorecard
from reward_lens_spec.trust.evidence import card_verdict

pytestmark = pytest.mark.usefixtures("one_thread")
S3 = (0.0, 0.5, 1.0)
_REAL = scorecard.evaluate
_SEEN: dict = {}


@pytest.fixture(scope="module")
def prm():
    return organism_family("prm_planted", S3, n_pairs=4)


@pytest.fixture(scope="module")
def implicit():
    return organism_family("implicit_planted", S3, n_pairs=4)


def _once(obs, org):
    key = (obs.name, id(org))
    if key not in _SEEN:
        _SEEN[key] = (org, _REAL(obs, org))
    ds = _SEEN[key][1]
    return ds.copy(deep=True).assign_attrs(identities=list(ds.attrs["identities"]))


def grade(obs, orgs, tamper=None):
    """``scorecard.grade`` on ``orgs``; ``tamper(ds)`` edits every strength's outputs (a broken instrument)."""
    fn = _once if tamper is None else (lambda o, org: tamper(_once(o, org)))
    with um.patch.object(scorecard, "evaluate", fn):
        return scorecard.grade(obs, organisms=orgs)


# -- a card whose criterion could not read its output fails with the reason (no model needed) ------------

def test_a_reading_error_fails_the_card_with_its_reason_and_the_printer_takes_none():
    card = scorecard.Scorecard(observable="x", spec_hash="0" * 64, version=1, model_family="llama",
                               organism="prm_planted", base="tiny_llama", strengths=[0.0, 1.0])
    card.readings = {"prm_step_reward": [None, None]}
    card.spearman = {"prm_step_reward": None}
    card.floors = {"prm_step_reward": {"value": None, "floor": 0.999, "what": "w", "at_strength": 1.0}}
    card.criteria_passed = {"prm_step_reward": False}
    card.reading_errors = {"prm_step_reward": "ValueError: step_reward of p/chosen: 3 finite step(s) read"}
    ok, why = card_verdict({**card.__dict__}, check_code=False)
    assert not ok and "could not read the output" in why and "3 finite step(s)" in why
    text = card.describe()                                      # was: TypeError formatting rho None
    assert "could not read: ValueError" in text and "=> FAIL" in text


# -- PRM: every step, every margin ------------------------------------------------------------------------

@pytest.mark.slow
def test_honest_prm_card_reads_every_step_and_margin(prm):
    card = grade("prm_steps", prm)
    assert card.passed, card.describe()
    assert {"prm_step_reward", "prm_step_margin", "prm_bad_step"} <= set(card.readings)
    assert {"step_reward", "step_margin"} <= set(card.graded)
    assert card.floors["prm_step_reward"]["value"] > 0.9999 and card.floors["prm_step_margin"]["value"] > 0.9999


def _toward_readout(frac):
    """Every step but the readout (last) one moved ``frac`` of its distance toward the readout step's reward:
    the readout step, the margin and the 'last' aggregate stay exact."""
    def tamper(ds):
        sr = ds["step_reward"].copy()
        last = sr.isel(step=-1)
        moved = sr + frac * (last - sr)
        moved[dict(step=-1)] = last
        return ds.assign(step_reward=moved, step_margin=moved.sel(side="chosen") - moved.sel(side="rejected"))
    return tamper


@pytest.mark.slow
@pytest.mark.parametrize("frac", [0.05, 0.5])
def test_prm_steps_wrong_away_from_the_readout_fail(prm, frac):
    card = grade("prm_steps", prm, _toward_readout(frac))
    assert not card.passed
    assert not card.criteria_passed["prm_step_reward"] and not card.criteria_passed["prm_step_margin"]
    assert not [r for per in card.identities for r in per if not r["max_abs_err"] <= 1e-3 * r["scale"]], \
        "the tamper keeps every identity (readout step, aggregate): only the whole-shape criteria catch it"


@pytest.mark.slow
def test_prm_step_margin_off_by_five_percent_fails(prm):
    card = grade("prm_steps", prm, lambda ds: ds.assign(step_margin=1.05 * ds["step_margin"]))
    assert not card.passed and not card.criteria_passed["prm_step_margin"]
    assert card.criteria_passed["prm_step_reward"]


@pytest.mark.slow
def test_prm_step_margin_shifted_one_step_fails(prm):
    card = grade("prm_steps", prm, lambda ds: ds.assign(step_margin=ds["step_margin"].roll(step=1, roll_coords=False)))
    assert not card.passed and not card.criteria_passed["prm_step_margin"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fewer_steps", "constant"])
def test_a_prm_reading_that_does_not_fit_gives_a_failing_card_not_a_crash(prm, how):
    """Fewer steps than the organism has (was: IndexError in prm_bad_step) or a constant reading (was: TypeError
    in the printer, ρ None): a card, failing, that says why."""
    if how == "fewer_steps":
        tamper = lambda ds: ds.isel(step=slice(0, 1))            # noqa: E731
    else:
        tamper = lambda ds: ds.assign(step_reward=0.0 * ds["step_reward"] + 1.0)  # noqa: E731
    card = grade("prm_steps", prm, tamper)
    text = card.describe()
    assert not card.passed and "=> FAIL" in text
    if how == "fewer_steps":
        assert "prm_bad_step" in card.reading_errors and "not among them" in card.reading_errors["prm_bad_step"]
        assert "where the organism has 4" in card.reading_errors["prm_step_reward"]
        assert "could not read" in text
    else:
        assert card.spearman["prm_step_reward"] is None and "nan" in text


# -- implicit: per token, position by position ------------------------------------------------------------

def _redistribute(how):
    """Per-token rewards changed with each side's sum kept: deviations from the side's mean ×1.5 or sign-flipped,
    or every value moved one position later (the first takes the last's)."""
    def tamper(ds):
        pt = ds["per_token_reward"].copy()
        v = pt.values
        for i in range(v.shape[0]):
            for s in range(2):
                row = v[i, s]
                n = int(np.isfinite(row).sum())
                r = row[:n]
                if how == "shift":
                    v[i, s, :n] = np.roll(r, 1)
                else:
                    k = 1.5 if how == "x1.5" else -1.0
                    v[i, s, :n] = r.mean() + k * (r - r.mean())
        return ds.assign(per_token_reward=pt)
    return tamper


@pytest.mark.slow
@pytest.mark.parametrize("how", ["x1.5", "sign", "shift"])
def test_implicit_per_token_redistributed_with_its_sum_kept_fails(implicit, how):
    honest = grade("implicit", implicit)
    assert honest.passed, honest.describe()
    card = grade("implicit", implicit, _redistribute(how))
    assert card.readings["implicit_log_ratio"] == pytest.approx(honest.readings["implicit_log_ratio"], abs=1e-9)
    assert not card.passed and not card.criteria_passed["implicit_log_ratio"], card.describe()


@pytest.mark.slow
def test_implicit_per_token_off_by_five_percent_fails(implicit):
    card = grade("implicit", implicit, lambda ds: ds.assign(per_token_reward=1.05 * ds["per_token_reward"]))
    assert not card.criteria_passed["implicit_log_ratio"]


# -- ensembles: a planted ensemble with known members -----------------------------------------------------

@pytest.fixture(scope="module")
def ensemble():
    return organism_family("ensemble_planted", S3, n_pairs=6)


@pytest.mark.slow
def test_honest_ensemble_card_passes_and_reads_every_member(ensemble):
    card = grade("ensemble", ensemble)
    assert card.passed, card.describe()
    assert {"ensemble_reward", "ensemble_member_margin"} <= set(card.readings)
    assert {"reward", "member_margin"} <= set(card.graded)


@pytest.mark.slow
@pytest.mark.parametrize("reduce, q", [("mean", 0.25), ("min", 0.25), ("quantile", 0.5), ("quantile", 0.3)])
def test_a_wrong_reduce_or_quantile_fails(ensemble, reduce, q):
    """The ensemble model reduces by another rule (or another q) than the organism declares: its own run."""
    from dataclasses import replace
    orgs = [replace(o, lm=replace(o.lm, reduce=reduce, q=q)) for o in ensemble]
    card = scorecard.grade("ensemble", organisms=orgs)
    assert not card.passed and not card.criteria_passed["ensemble_reward"], card.describe()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["x1.05", "member_shift"])
def test_member_margins_off_by_five_percent_or_one_member_fail(ensemble, how):
    def tamper(ds):
        mm = ds["member_margin"]
        mm = 1.05 * mm if how == "x1.05" else mm.roll(member=1, roll_coords=False)
        return ds.assign(member_margin=mm)
    card = grade("ensemble", ensemble, tamper)
    assert not card.passed and not card.criteria_passed["ensemble_member_margin"]


def test_naive_quantile_is_numpy_linear_on_hand_values():
    from reward_lens_spec.trust.kind_criteria import naive_reduce
    assert naive_reduce([3.0, 1.0, 2.0], "quantile", 0.25) == 1.5          # h = 0.5: halfway from 1 to 2
    assert naive_reduce([3.0, 1.0, 2.0], "quantile", 1.0) == 3.0
    assert naive_reduce([3.0, 1.0, 2.0], "min", 0.0) == 1.0 and naive_reduce([3.0, 1.0, 2.0], "mean", 0.0) == 2.0


# -- LEACE: the held-out certificate is part of the gate --------------------------------------------------

def _certificate(after_lo, after_hi):
    import xarray as xr
    vals = np.array([[0.95, 0.9, 1.0], [(after_lo + after_hi) / 2, after_lo, after_hi]])
    return xr.Dataset({"certificate": (("stage", "bound"), vals)},
                      coords={"stage": ["before", "after"], "bound": ["estimate", "ci_low", "ci_high"]})


@pytest.mark.parametrize("lo, hi, holds", [(0.40, 0.60, True), (0.76, 0.99, False), (0.501, 0.58, False),
                                           (0.30, 0.499, False), (float("nan"), 0.6, False)])
def test_a_certificate_that_does_not_hold_breaks_the_runs_identities(lo, hi, holds):
    from reward_lens_spec.trust.evidence import identities_ok
    from reward_lens_spec.trust.identities import held_out_record
    rec = held_out_record("certificate", _certificate(lo, hi)["certificate"])
    ok, why = identities_ok([rec])
    assert ok is holds, why
    if not holds:
        assert "does not hold on held-out pairs" in why
        forged = {**rec, "max_abs_err": 0.0}            # a stored gap of 0 is not believed: the interval decides
        assert not identities_ok([forged])[0]


@pytest.mark.slow
def test_leace_card_whose_erasure_leaks_on_held_out_pairs_fails():
    """After-erasure AUC 0.55 with CI [0.52, 0.58]: 90% of the above-chance AUC removed (the old floor passes),
    but a fresh probe still reads the concept on held-out pairs, so the card cannot pass."""
    orgs = organism_family("concept", S3, n_pairs=200)
    honest = grade(str(LEACE_YAML), orgs)
    assert honest.passed, honest.describe()
    assert any(r.get("target") == 0.5 for per in honest.identities for r in per)

    from reward_lens_spec.trust.identities import held_out_record

    def leak(ds):                    # the operator's output leaks; evaluate's identities are of that output
        c = ds["certificate"].copy()
        c.loc[dict(stage="after")] = [0.55, 0.52, 0.58]
        recs = [r for r in ds.attrs["identities"] if "target" not in r] + [held_out_record("certificate", c)]
        return ds.assign(certificate=c).assign_attrs(identities=recs)
    card = grade(str(LEACE_YAML), orgs, leak)
    assert card.floors["leace_removal"]["value"] >= 0.8        # the removal share alone would pass it
    assert not card.passed
    from reward_lens_spec.trust.evidence import identities_ok
    ok, why = identities_ok(card.identities[-1])               # the held-out gate catches it
    assert not ok and "does not hold on held-out pairs" in why
    assert not card.criteria_passed["leace_removal"]           # and so do its cells (0.55 is not the probe's AUC)
    assert card.cells["leace_removal"]["fit"] < 0.999


LEACE_YAML = Path(__file__).parent / "data" / "leace_concept.yaml"


# -- every criterion: a test that feeds it a reading off by <= 5% or one position, or the reason it has none ----

CELLS = "tests/test_calibration_whole.py::test_cell_criteria_fail_a_reading_five_percent_off_or_one_position_shifted"
PERTURBED = {   # criterion -> the test that feeds it such a reading and expects a failing card
    "score": "tests/test_calibration_strict.py::test_subtle_breakage_fails_calibration",          # margin ×1.03
    "dla_share": "tests/test_calibration_strict.py::test_subtle_breakage_fails_calibration",      # dla ×1.03
    "patch_share": "tests/test_calibration_strict.py::test_subtle_breakage_fails_calibration",    # patch ×1.03
    "verdict_margin": "tests/test_trust_kinds.py::test_judge_scaled_verdict_fails_the_floor",     # ×1.1
    "prm_bad_step": "tests/test_trust_kinds.py::test_prm_wrong_step_fails",                       # one step late
    "prm_step_reward": "tests/test_calibration_whole.py::test_prm_steps_wrong_away_from_the_readout_fail",
    "prm_step_margin": "tests/test_calibration_whole.py::test_prm_step_margin_off_by_five_percent_fails",
    "implicit_log_ratio": "tests/test_calibration_whole.py::test_implicit_per_token_redistributed_with_its_sum_kept_fails",
    "ensemble_reward": "tests/test_calibration_whole.py::test_a_wrong_reduce_or_quantile_fails",
    "ensemble_member_margin": "tests/test_calibration_whole.py::test_member_margins_off_by_five_percent_or_one_member_fail",
    "effective_objectives": "tests/test_calibration_whole.py::test_effective_objectives_floor_fails_five_percent_off",
    "lens_jump": "tests/test_calibration_whole.py::test_unit_criteria_fail_a_reading_five_percent_off_or_one_layer_late",
    "crystallization": "tests/test_calibration_whole.py::test_unit_criteria_fail_a_reading_five_percent_off_or_one_layer_late",
    "ablation_share": "tests/test_calibration_whole.py::test_unit_criteria_fail_a_reading_five_percent_off_or_one_layer_late",
    "sae_contribution": "tests/test_calibration_sae.py::test_a_reading_five_percent_off_fails",          # and one feature late
    "sae_error": "tests/test_calibration_sae.py::test_a_reading_five_percent_off_fails",
    "sae_patch": "tests/test_calibration_sae.py::test_the_patch_with_its_sign_flipped_fails",          # and 5% off
    "drift_margin": "tests/test_calibration_drift.py::test_a_series_five_percent_off_fails",
    "drift_similarity": "tests/test_calibration_drift.py::test_a_series_five_percent_off_fails",
    "drift_step": "tests/test_calibration_drift.py::test_the_step_moved_one_checkpoint_fails",
    # read cell by cell against trust.cell_truth's independent recomputation (card.cells, CELL_FLOOR)
    **{c: CELLS for c in ("attribution_share", "steer_alignment", "null_excess", "group_stats", "path_separation",
                          "label_cycles", "cyclic_gain", "contested_direction", "contested_margin", "scalar_cost",
                          "leace_removal", "leace_specificity", "curvature_direction")},
}
NOT_YET: dict = {}   # criterion -> why no such test exists yet (empty: every criterion has one)


def test_every_criterion_is_perturbed_by_a_named_test_or_its_gap_is_listed():
    import re
    from pathlib import Path

    from reward_lens_spec.trust.criteria import CRITERIA
    names = {c.name for c in CRITERIA}
    assert set(PERTURBED) | set(NOT_YET) == names and not set(PERTURBED) & set(NOT_YET), \
        (names - set(PERTURBED) - set(NOT_YET), set(PERTURBED) & set(NOT_YET))
    root = Path(__file__).resolve().parent.parent
    for crit, node in PERTURBED.items():
        path, name = node.split("::")
        assert re.search(rf"^def {name}\(", (root / path).read_text(encoding="utf-8"), re.M), (crit, node)


def test_effective_objectives_floor_fails_five_percent_off():
    """The floor reads the participation ratio within 1% of the planted one: 5% off fails it (the honest card is
    ``tests/test_preference_rank.py``'s / ``test_scalar_cost.py``'s)."""
    import xarray as xr

    from reward_lens_spec.trust.criteria import CRITERIA
    (crit,) = [c for c in CRITERIA if c.name == "effective_objectives"]
    t = {"participation_ratio": 2.0}
    ds = lambda pr: xr.Dataset({"effective_objectives": (("effective_statistic",), [pr])},   # noqa: E731
                               coords={"effective_statistic": ["participation_ratio"]})
    assert crit.floor_value(ds(2.0), t) >= crit.floor
    assert crit.floor_value(ds(2.0 * 1.05), t) < crit.floor and crit.floor_value(ds(2.0 * 0.95), t) < crit.floor


# -- classifier unit criteria: a reading 5% off or one layer late -----------------------------------------

def _shift_layer(var):
    """``var`` read one layer late: each layer's cells hold the previous layer's (the first keeps its own)."""
    def tamper(ds):
        da = ds[var]
        moved = da.shift(layer=1).fillna(da.isel(layer=0))
        return ds.assign({var: moved})
    return tamper


@pytest.mark.slow
@pytest.mark.parametrize("obs, how", [("lens", "x1.05"), ("lens", "shift"), ("crystallization", "x1.05"),
                                      ("crystallization", "shift"), ("examples/ablation", "shift")])
def test_unit_criteria_fail_a_reading_five_percent_off_or_one_layer_late(planted, obs, how):
    var = "ablation_effect" if "ablation" in obs else "lens"
    honest = grade(obs, planted)
    assert honest.passed, honest.describe()
    tamper = _shift_layer(var) if how == "shift" else (lambda ds: ds.assign({var: 1.05 * ds[var]}))
    card = grade(obs, planted, tamper)
    assert not card.passed, card.describe()
    crit = {"lens": ["lens_jump"], "crystallization": ["crystallization"],
            "examples/ablation": ["ablation_share"]}[obs]
    assert not any(card.criteria_passed[c] for c in crit) or how == "x1.05", card.describe()


# -- criteria read against an independent recomputation (trust.cell_truth): 5% off or one position ---------

_FAMILIES: dict = {}


def _family(name):
    """Organism families the cell criteria grade on, built once per module."""
    if name not in _FAMILIES:
        from reward_lens_spec.organisms import preference_organisms as pref
        _FAMILIES[name] = {
            "planted": lambda: organism_family("planted", n_pairs=6),
            "planted_paths": lambda: organism_family("planted_paths", n_pairs=6),
            "trained_length": lambda: organism_family("trained_length"),
            "cycle24": lambda: pref.cycle_organisms(n_groups=24),
            "cycle": lambda: pref.cycle_organisms(S3),
            "mixture": lambda: pref.annotator_organisms("annotator_mixture", S3),
            "agreement": lambda: pref.annotator_organisms("annotator_agreement", S3),
            "multi": lambda: pref.multi_objective_organisms(S3),
            "concept": lambda: organism_family("concept", S3, n_pairs=200),
            "curvature": lambda: organism_family("curvature", S3, n_pairs=2),
        }[name]()
    return _FAMILIES[name]


def _leace_obs():
    from reward_lens_spec.observables import load_observable
    return load_observable(str(LEACE_YAML))


def _scale(var, k, **sel):
    def tamper(ds):
        da = ds[var].copy()
        if sel:
            da.loc[sel] = da.loc[sel] * k
        else:
            da = da * k
        return ds.assign({var: da})
    return tamper


def _scale_both(a, b, k):
    return lambda ds: ds.assign({a: k * ds[a], b: k * ds[b]})


def _roll(dim, *vars_):
    """Each of ``vars_`` moved one position along ``dim`` (the last cell takes the first's), values kept."""
    def tamper(ds):
        out = {}
        for v in vars_:
            da = ds[v]
            if dim == "pair":               # only the finite rows (interventions leave pairs past observable.pairs NaN)
                rows = np.flatnonzero(np.isfinite(np.asarray(da.transpose("pair", ...).values)).reshape(
                    da.sizes["pair"], -1).all(1))
                vals = da.transpose("pair", ...).values.copy()
                vals[rows] = np.roll(vals[rows], 1, axis=0)
                out[v] = da.transpose("pair", ...).copy(data=vals).transpose(*da.dims)
            else:
                out[v] = da.roll({dim: 1}, roll_coords=False)
        return ds.assign(out)
    return tamper


def _leace_after(k):
    """The certificate's after-erasure AUC (estimate and CI) ×k: its held-out identity re-derived from it."""
    def tamper(ds):
        from reward_lens_spec.trust.identities import held_out_record
        c = ds["certificate"].copy()
        c.loc[dict(stage="after")] = c.sel(stage="after").values * k
        recs = [r for r in ds.attrs["identities"] if "target" not in r] + [held_out_record("certificate", c)]
        return ds.assign(certificate=c).assign_attrs(identities=recs)
    return tamper


CELL_CASES = {   # id -> (criterion, family, observable, tamper)
    "attribution_x1.05": ("attribution_share", "planted", "attribution_patch",
                          _scale("attribution_patch_effect", 1.05)),
    "attribution_layer": ("attribution_share", "planted", "attribution_patch", _roll("layer", "attribution_patch_effect")),
    "steer_both_x1.05": ("steer_alignment", "planted", "examples/steer_dose_response",
                         _scale_both("steer_slope", "steer_slope_head", 1.05)),
    "steer_pair": ("steer_alignment", "planted", "examples/steer_dose_response",
                   _roll("pair", "steer_slope", "steer_slope_head")),
    "null_x1.05": ("null_excess", "planted", "examples/null_mlp_effect",
                   _scale_both("observed_effect", "null_draws", 1.05)),
    "null_layer": ("null_excess", "planted", "examples/null_mlp_effect", _roll("layer", "observed_effect", "p_value")),
    "group_dz_x1.05": ("group_stats", "trained_length", "examples/accuracy_by_dimension",
                       _scale("effect_size_by_dimension", 1.05)),
    "group_acc_x0.96": ("group_stats", "trained_length", "examples/accuracy_by_dimension",
                        _scale("accuracy_by_dimension", 0.96)),
    "path_x1.05": ("path_separation", "planted_paths", "examples/path_patch", _scale("path_patch_effect", 1.05)),
    "path_layer": ("path_separation", "planted_paths", "examples/path_patch", _roll("layer", "path_patch_effect")),
    "hodge_x1.05": ("label_cycles", "cycle24", "preference_cycles",
                    _scale("hodge_pooled", 1.05, flow="labels", hodge_statistic="non_gradient_fraction")),
    "rank_x1.05": ("cyclic_gain", "cycle", "preference_rank",
                   _scale("preference_rank", 1.05, rank_statistic="cyclic_gain")),
    "direction_x1.05": ("contested_direction", "mixture", "contested", _scale("contested_direction", 1.05)),
    "direction_shift": ("contested_direction", "mixture", "contested", _roll("d_model", "contested_direction")),
    "contested_x1.05": ("contested_margin", "agreement", "contested",
                        _scale("contested_margin", 1.05, contested_statistic="abs_margin_contested")),
    "scalar_cost_x0.96": ("scalar_cost", "multi", "scalar_cost", _scale("scalar_cost", 0.96)),
    "scalar_cost_shift": ("scalar_cost", "multi", "scalar_cost", _roll("scalar_cost_statistic", "scalar_cost")),
    "leace_after_x1.05": ("leace_removal", "concept", "leace", _leace_after(1.05)),
    "leace_both_x0.96": ("leace_specificity", "concept", "leace",
                         _scale_both("displacement", "unplanted_displacement", 0.96)),
    "leace_pair": ("leace_specificity", "concept", "leace", _roll("pair", "displacement", "unplanted_displacement")),
    "curvature_x1.04": ("curvature_direction", "curvature", "examples/curvature", _scale("margin_eigenvalues", 1.04)),
    "curvature_pair": ("curvature_direction", "curvature", "examples/curvature", _roll("pair", "margin_eigenvalues")),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CELL_CASES))
def test_cell_criteria_fail_a_reading_five_percent_off_or_one_position_shifted(case):
    """Each criterion that reads its output against ``trust.cell_truth``: its honest card passes with the cells
    fitting to float error, and a reading 5% off (or a ratio's two readings both 5% off, so the ratio the
    summary floor reads is kept) or moved one position (pair, layer, statistic, coordinate) fails it. Most of
    these passed before the criterion read cells: the summaries (a share, a ratio, an AUC near chance, a
    Rayleigh quotient ≥ 0.9) keep their floors."""
    crit, fam, obs, tamper = CELL_CASES[case]
    obs = _leace_obs() if obs == "leace" else obs
    orgs = _family(fam)
    honest = grade(obs, orgs)
    assert honest.passed and honest.criteria_passed[crit], honest.describe()
    assert honest.cells[crit]["fit"] > 0.9999, honest.cells
    card = grade(obs, orgs, tamper)
    assert not card.criteria_passed[crit] and not card.passed, card.describe()


def test_cell_criteria_are_the_ones_with_a_recomputation():
    from reward_lens_spec.trust.criteria import CRITERIA
    from reward_lens_spec.trust.evidence import CELL_CRITERIA
    assert set(CELL_CRITERIA) == {c.name for c in CRITERIA if c.cells is not None}


@pytest.mark.parametrize("cells, ok", [({"fit": 0.9995}, True), ({"fit": 0.95}, False), ({"fit": None}, False),
                                        (None, False)])
def test_a_card_without_fitting_cells_fails_its_cell_criterion(cells, ok):
    """The verdict re-derived from a stored card: a cell criterion whose cells are missing or off fails,
    whatever its readings and floor say (a card written before cells existed included)."""
    card = {"readings": {"steer_alignment": [0.0, 0.5, 0.99]}, "spearman": {"steer_alignment": 1.0},
            "floors": {"steer_alignment": {"value": 0.99}}, "truth": {"layer": 1}}
    if cells is not None:
        card["cells"] = {"steer_alignment": cells}
    got, why = card_verdict(card, check_code=False)
    assert got is ok, why
    assert ok or "independent recomputation" in why


def test_naive_leace_and_hodge_agree_with_hand_values_and_the_closed_form():
    """``cell_truth``'s oblique-projection LEACE is the operator's eigen-form eraser on random data (two
    formulas, one eraser), and leaves no linear covariance with the concept; its least-squares HodgeRank reads
    a 3-cycle as all non-gradient and a transitive ±1 triangle as 1/9 non-gradient (hand values)."""
    from reward_lens_spec.ops._leace import fit_leace
    from reward_lens_spec.trust.cell_truth.leace import _oblique_eraser
    from reward_lens_spec.trust.cell_truth.reference_cells import _hodge_naive
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 6)) @ rng.normal(size=(6, 6))
    y = rng.integers(0, 3, 80)
    Z = (y[:, None] == np.arange(3)[None]).astype(float)
    mu, E = _oblique_eraser(X, Z)
    mu2, E2 = fit_leace(X, Z)
    np.testing.assert_allclose(E, E2, atol=1e-9)
    R = X - (X - mu) @ E.T
    assert np.abs((R - R.mean(0)).T @ (Z - Z.mean(0))).max() < 1e-9
    grad, ng, rank, n, e = _hodge_naive([("a", "b", 1.0), ("b", "c", 1.0), ("c", "a", 1.0)])
    assert (rank, n, e) == (1, 3, 3) and grad == pytest.approx(0.0, abs=1e-12) and ng == pytest.approx(3.0)
    grad, ng, *_ = _hodge_naive([("a", "b", 1.0), ("b", "c", 1.0), ("a", "c", 1.0)])
    assert ng / (grad + ng) == pytest.approx(1 / 9)


def test_one_adjacent_swap_of_five_strengths_meets_the_spearman_floor_and_two_do_not():
    """ρ = 0.9 exactly for one adjacent swap of 5 (Spearman 1904: 1 − 6·2/(5·24)); scipy gives 0.8999999999999998,
    which must not fail a card (it failed the honest LEACE card at the default strengths). Two swaps (ρ = 0.8) fail."""
    from reward_lens_spec.stats import spearman_rho
    from reward_lens_spec.trust.evidence import MIN_SPEARMAN, RHO_ROUNDING

    s = [0, 0.25, 0.5, 0.75, 1]
    one, two = spearman_rho(s, [0, 2, 1, 3, 4]), spearman_rho(s, [1, 0, 3, 2, 4])
    naive = lambda d: 1 - 6 * sum(x * x for x in d) / (5 * 24)     # noqa: E731  no ties: the textbook formula
    assert naive([0, 1, -1, 0, 0]) == 0.9 and abs(one - 0.9) < 1e-12 and naive([1, -1, 1, -1, 0]) == 0.8
    assert one >= MIN_SPEARMAN - RHO_ROUNDING and not two >= MIN_SPEARMAN - RHO_ROUNDING
