"""Calibration reads the whole output it grades (issue 37 item 7): every PRM step, every step margin, every
response token's implicit reward, position by position, against a truth the organism computes with its own
tokenization and a plain forward (``organisms.prm_organism.plain_step_rewards``, ``kind_organisms.
implicit_organism``). Readings that keep the graded summary (the readout step, the per-token sum) but are
wrong elsewhere fail; a reading that does not fit its criterion (fewer steps, a constant) gives a failing card
with its reason instead of a traceback."""
from __future__ import annotations

import unittest.mock as um

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
def test_leace_card_whose_erasure_leaks_on_held_out_pairs_fails(tmp_path):
    """After-erasure AUC 0.55 with CI [0.52, 0.58]: 90% of the above-chance AUC removed (the old floor passes),
    but a fresh probe still reads the concept on held-out pairs, so the card cannot pass."""
    path = tmp_path / "leace_concept.yaml"
    path.write_text(LEACE_YAML)
    orgs = organism_family("concept", S3, n_pairs=200)
    honest = grade(str(path), orgs)
    assert honest.passed, honest.describe()
    assert any(r.get("target") == 0.5 for per in honest.identities for r in per)

    from reward_lens_spec.trust.identities import held_out_record

    def leak(ds):                    # the operator's output leaks; evaluate's identities are of that output
        c = ds["certificate"].copy()
        c.loc[dict(stage="after")] = [0.55, 0.52, 0.58]
        recs = [r for r in ds.attrs["identities"] if "target" not in r] + [held_out_record("certificate", c)]
        return ds.assign(certificate=c).assign_attrs(identities=recs)
    card = grade(str(path), orgs, leak)
    assert card.criteria_passed["leace_removal"]               # the removal share alone would pass it
    assert not card.passed and "does not hold on held-out pairs" in card.describe()


LEACE_YAML = """name: leace_concept
version: 1
steps:
  - {name: resid, op: capture, site: resid_post}
  - {name: certificate, op: leace_certificate, input: resid, layer: 2, concept: "field:concept", resamples: 200}
  - {name: displacement, op: leace, layer: 2, concept: "field:concept", quantity: displacement}
  - {name: unplanted_displacement, op: leace, layer: 2, concept: "field:label", quantity: displacement}
outputs: [certificate, displacement, unplanted_displacement]
"""


# -- every criterion: a test that feeds it a reading off by <= 5% or one position, or the reason it has none ----

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
}
NOT_YET = {     # criterion -> why no such test exists yet (reported to the lead; each is a known gap)
    "attribution_share": "first-order instrument graded within a 25% band (MAG_RTOL): a 5% error is inside it",
    "steer_alignment": "a ratio of slopes: scale-free; no planted magnitude",
    "null_excess": "1 − p floor: a 5% change of the effect is not detectable against the null",
    "group_stats": "reads d_z / accuracy CIs: no planted magnitude",
    "path_separation": "a share: scale-free; a one-layer shift is untested",
    "label_cycles": "a non-gradient fraction against its null: no planted magnitude",
    "cyclic_gain": "a held-out gain CI above 0: no planted magnitude",
    "contested_direction": "|cos| ≥ 0.8 to the planted direction: a one-position shift is untested",
    "contested_margin": "a CI below 0: no planted magnitude",
    "scalar_cost": "a share of sign disagreements ≥ 0.5: no planted magnitude",
    "leace_removal": "an AUC near 0.5: a 5% change is inside its CI (the held-out certificate identity gates leaks)",
    "leace_specificity": "a ratio of displacements ≤ 0.25: scale-free",
    "curvature_direction": "one-sided floor (Rayleigh / top ≥ 0.9) on a 2-probe Lanczos estimate (0.91 at s=0.5): "
                           "too loose for 5%",
}


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
