"""Calibration reads the whole output it grades (issue 37 item 7): every PRM step, every step margin, every
response token's implicit reward, position by position, against a truth the organism computes with its own
tokenization and a plain forward (``models.prm_organism.plain_step_rewards``, ``kind_organisms.
implicit_organism``). Readings that keep the graded summary (the readout step, the per-token sum) but are
wrong elsewhere fail; a reading that does not fit its criterion (fewer steps, a constant) gives a failing card
with its reason instead of a traceback."""
from __future__ import annotations

import unittest.mock as um

import numpy as np
import pytest

from reward_lens_spec.models.kind_organisms import organism_family
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
