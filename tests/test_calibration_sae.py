"""The SAE organism is a scorecard kind (issue 37 item 7): ``sae_attribution``'s contribution, error and patch
outputs are graded cell by cell against cells rebuilt from the ``sparse_feature`` organism's plain-forward readout
activations and the run's own dictionary (``trust.sae_criteria``). An honest run passes; a reading 5% off, one
feature late, or a patch with its sign flipped fails, each on the criterion that reads it."""
from __future__ import annotations

import unittest.mock as um

import numpy as np
import pytest

from reward_lens_spec.organisms.kind_organisms import organism_family
from reward_lens_spec.observables import load_observable
from reward_lens_spec.trust import scorecard

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
S3 = (0.0, 0.5, 1.0)
OBS = "examples/sae_attribution"
_REAL = scorecard.evaluate
_SEEN: dict = {}


@pytest.fixture(scope="module")
def sparse():
    return organism_family("sparse_feature", S3, n_pairs=4)


def _once(obs, org):
    key = (obs.name, id(org))
    if key not in _SEEN:
        _SEEN[key] = _REAL(obs, org)
    ds = _SEEN[key]
    return ds.copy(deep=True).assign_attrs(identities=list(ds.attrs["identities"]), sae=ds.attrs["sae"])


def grade(orgs, tamper=None):
    fn = _once if tamper is None else (lambda o, org: tamper(_once(o, org)))
    with um.patch.object(scorecard, "evaluate", fn):
        return scorecard.grade(OBS, organisms=orgs)


def test_honest_sae_card_passes_on_every_cell_and_the_patch_says_what_it_computes(sparse):
    card = grade(sparse)
    assert card.passed, card.describe()
    assert {"sae_contribution", "sae_error", "sae_patch"} <= set(card.readings)
    assert {"sae_contribution", "sae_error", "sae_patch"} <= set(card.graded)
    for c in ("sae_contribution", "sae_error", "sae_patch"):
        assert card.floors[c]["value"] > 0.9999, (c, card.floors[c])
    ds = _once(load_observable(OBS), sparse[-1])
    desc = ds["sae_patch"].attrs["description"]
    assert desc.startswith("change in the rejected side's reward r_r,patched − r_r"), desc
    # independent of the criteria: at the readout the transplant effect of feature i on the rejected side is
    # (f_i(h_c) − f_i(h_r))·(w·d_i), i.e. the contribution itself (the head is linear): same sign, same cells
    got, contrib = ds["sae_patch"].values, ds["sae_contribution"].values
    rows = np.isfinite(got).all(1)
    np.testing.assert_allclose(got[rows], contrib[rows], atol=1e-4 * np.abs(contrib).max())
    assert (got[rows].sum(1) > 0).all()                 # the planted feature carries the margin: + restores it


def _scaled(var, k):
    return lambda ds: ds.assign({var: k * ds[var]})


@pytest.mark.parametrize("var, crit", [("sae_contribution", "sae_contribution"), ("sae_error", "sae_error"),
                                       ("sae_patch", "sae_patch")])
def test_a_reading_five_percent_off_fails(sparse, var, crit):
    card = grade(sparse, _scaled(var, 1.05))
    assert not card.passed and not card.criteria_passed[crit], card.describe()


@pytest.mark.parametrize("var", ["sae_contribution", "sae_patch"])
def test_one_feature_shifted_fails(sparse, var):
    card = grade(sparse, lambda ds: ds.assign({var: ds[var].roll(feature=1, roll_coords=False)}))
    assert not card.passed and not card.criteria_passed[var], card.describe()


def test_the_patch_with_its_sign_flipped_fails(sparse):
    card = grade(sparse, _scaled("sae_patch", -1.0))
    assert not card.passed and not card.criteria_passed["sae_patch"]
    assert card.criteria_passed["sae_contribution"] and card.criteria_passed["sae_error"]


def test_a_dictionary_other_than_the_runs_is_refused_with_its_reason(sparse):
    def swap(ds):
        ds = ds.copy()
        ds["sae_contribution"].attrs["sae"] = "0" * 64
        return ds
    card = grade(sparse, swap)
    assert not card.passed and "did not train or load" in card.reading_errors["sae_contribution"]
    assert "could not read" in card.describe()
