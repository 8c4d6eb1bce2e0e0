"""Every output of every shipped observable, and every drift variable, is either read by a calibration criterion
or carries a stored reason why not (issue 37 item 7; ``trust.coverage``); a card shows the reason beside each
ungraded output. And ``calibrate`` never crashes on a reading: every criterion fed a constant, all-NaN, empty,
too-short or wrongly shaped reading gives a failing card that says why (``trust.scorecard.grade_readings``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.compare.drift import VARIABLES as DRIFT_VARIABLES
from reward_lens_spec.observables import load_observable
from reward_lens_spec.registry import expand_steps
from reward_lens_spec.trust.coverage import WHY_NOT, graded_by, why_not
from reward_lens_spec.trust.criteria import CRITERIA
from reward_lens_spec.trust.evidence import card_verdict
from reward_lens_spec.trust.scorecard import Scorecard, grade_readings

CONF = Path(__file__).resolve().parents[1] / "conf" / "observable"


def shipped_outputs() -> dict[str, list[str]]:
    out = {}
    for p in sorted(CONF.rglob("*.yaml")):
        name = str(p.relative_to(CONF))[:-5]
        out[name] = list(expand_steps(load_observable(name), load_observable)[1])
    return out


def test_every_output_of_every_shipped_observable_and_drift_is_graded_or_says_why_not():
    outs = shipped_outputs()
    assert len(outs) >= 40 and "examples/sae_attribution" in outs and "ensemble" in outs
    missing = sorted({f"{o} ({obs})" for obs, vs in outs.items() for o in vs if not graded_by(o) and o not in WHY_NOT})
    missing += sorted(f"{v} (drift)" for v in DRIFT_VARIABLES if not graded_by(v) and v not in WHY_NOT)
    assert not missing, f"outputs neither graded nor explained (add a criterion or a trust.coverage.WHY_NOT entry): {missing}"
    both = sorted(k for k in WHY_NOT if graded_by(k))
    assert not both, f"outputs both graded and explained as ungraded: {both}"
    # the newly graded kinds: SAE outputs, drift series, ensemble rewards
    for v in ("sae_contribution", "sae_error", "sae_patch", "mean_margin", "cka", "procrustes_residual",
              "margin_spearman", "member_margin"):
        assert graded_by(v), v


def test_an_ungraded_output_is_shown_on_the_card_with_its_reason():
    card = Scorecard(observable="ensemble", spec_hash="0" * 64, version=1, model_family="llama",
                     organism="ensemble_planted", base="tiny_llama", strengths=[0.0, 1.0])
    card.ungraded = ["member_sign_agreement", "reward"]
    card.why_not = {v: why_not(v, "planted") for v in card.ungraded}
    text = card.describe()
    assert f"not graded: member_sign_agreement: {WHY_NOT['member_sign_agreement']}" in text
    assert "not graded: reward: graded by ensemble_reward on organism ensemble_planted, not on planted" in text


# -- fuzz: every criterion, hostile readings -> a failing card with its reason, never an exception --------------
PIDS = [f"p{i}" for i in range(4)]


def _truth() -> dict:
    """A truth with every key some criterion reads (values of plausible shape)."""
    rng = np.random.default_rng(0)
    return {"layer": 1, "component": "mlp", "head": 0, "direct": {"layer": 1, "component": "mlp"},
            "indirect": {"layer": 0, "component": "attn"}, "relay": {"layer": 1, "component": "attn"},
            "bad_step": {p: 1 for p in PIDS}, "step_reward": {p: [[0.1, 0.2, 0.3], [0.1, -0.2, -0.3]] for p in PIDS},
            "planted_per_token": {p: [[0.1, 0.2], [0.0, -0.1, 0.2]] for p in PIDS},
            "member_reward": {p: [[1.0, 0.5], [0.8, 0.1], [1.2, 0.3]] for p in PIDS}, "members": ["a", "b", "c"],
            "reduce": "quantile", "q": 0.25, "rayleigh": {p: [0.5, 0.2] for p in PIDS},
            "verdict_margin": {p: 1.0 for p in PIDS}, "disagreement_direction": list(rng.normal(size=8)),
            "participation_ratio": 2.0, "readout": {p: [list(rng.normal(size=8)), list(rng.normal(size=8))]
                                                    for p in PIDS}, "w": list(rng.normal(size=8)), "b": 0.0,
            "steps": [80, 100, 120], "planted_step": 100,
            "series": {"mean_margin": np.array([0.1, 0.2, 2.0]), "accuracy": np.array([0.5, 0.6, 1.0]),
                       **{k: np.full((3, 2), 0.5) for k in ("cka", "procrustes_residual", "margin_spearman")}}}


def _reading(form: str, var: str) -> xr.DataArray:
    if form == "constant":
        return xr.DataArray(np.ones((4, 2, 3)), dims=("pair", "side", "step"), coords={"pair": PIDS})
    if form == "all_nan":
        return xr.DataArray(np.full((4, 2, 5), np.nan), dims=("pair", "side", "position"), coords={"pair": PIDS})
    if form == "empty":
        return xr.DataArray(np.zeros((0,)), dims=("pair",), coords={"pair": []})
    if form == "fewer":            # fewer steps / positions / layers / members / checkpoints than the organism
        return xr.DataArray(np.ones((4, 2, 1)), dims=("pair", "side", "step"), coords={"pair": PIDS})
    if form == "flat_constant":    # the right leading dim, constant: ρ undefined
        return xr.DataArray(np.full(4, 0.7), dims=("pair",), coords={"pair": PIDS})
    return xr.DataArray(np.ones((2, 3)), dims=("x", "y"))             # wrong dims


FORMS = ("constant", "all_nan", "empty", "fewer", "flat_constant", "wrong_dims")


@pytest.mark.parametrize("form", FORMS)
def test_every_criterion_fed_a_hostile_reading_gives_a_failing_card_with_a_reason(form, tmp_path):
    t = _truth()
    for c in CRITERIA:
        ds = xr.Dataset({v: _reading(form, v) for v in c.needs})
        card = Scorecard(observable="fuzz", spec_hash="0" * 64, version=1, model_family="llama",
                         organism=(c.kinds or ("planted",))[0], base="tiny_llama", strengths=[0.0, 0.5, 1.0],
                         truth={k: v for k, v in t.items() if k != "series"})
        grade_readings(card, [c], [ds, ds.copy(), ds.copy()], [t, t, t])
        assert not card.passed, (c.name, form, card.readings)
        ok, why = card_verdict(card.__dict__, check_code=False)
        assert not ok and why, (c.name, form)
        text = card.describe()
        assert "=> FAIL" in text and c.name in text, (c.name, form)
