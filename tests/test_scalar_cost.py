"""The scalar summary's cost on multi-objective heads (ops/scalar_cost, ops/effective_objectives)."""
from __future__ import annotations

import numpy as np
import pytest

from reward_lens_spec.errors import SpecError
from reward_lens_spec.organisms.preference_organisms import multi_objective_organisms, planted_participation_ratio
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.effective_objectives import participation_ratio
from reward_lens_spec.ops.scalar_cost import cost_statistics
from reward_lens_spec.spec import ObservableSpec
from reward_lens_spec.trust.scorecard import evaluate, grade


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def organisms():
    return multi_objective_organisms((0.0, 0.5, 1.0))


def test_cost_statistics_worked_case():
    D = np.array([[1.0, 2.0], [3.0, -1.0], [0.0, -2.0], [-1.0, -1.0]])
    s = np.array([1.0, 1.0, -1.0, -1.0])
    st = cost_statistics(D, s)
    assert st["sign_disagreement"] == 0.25                          # only row 1 (a zero never disagrees)
    assert st["sign_disagreement_weighted"] == pytest.approx(4.0 / 11.0)   # masses 3, 4, 2, 2
    assert st["overruled_preference"] == pytest.approx(1.0 / 11.0)         # the −1 of row 1 against s > 0
    assert st["mean_pairwise_disagreement"] == 0.25


def test_participation_ratio_worked_cases():
    assert participation_ratio(np.eye(4)[:3] * 2.0)[0] == pytest.approx(3.0)
    assert participation_ratio(np.ones((3, 5)))[0] == pytest.approx(1.0)
    for s in (0.25, 0.5):
        U = np.sqrt(1 - s) * np.eye(6)[[0, 0, 0]] + np.sqrt(s) * np.eye(6)[1:4]
        lam = np.linalg.eigvalsh(U @ U.T)
        assert participation_ratio(U)[0] == pytest.approx(lam.sum() ** 2 / (lam ** 2).sum())
        assert participation_ratio(U)[0] == pytest.approx(planted_participation_ratio(s, 3), rel=1e-12)


def test_planted_heads_read_their_closed_form_and_disagree_only_when_rows_differ(organisms):
    obs = load_observable("scalar_cost")
    for org in organisms:
        ds = evaluate(obs, org)
        pr = float(ds["effective_objectives"].sel(effective_statistic="participation_ratio"))
        assert pr == pytest.approx(org.truth["participation_ratio"], rel=1e-4)
        eo = ds["effective_objectives"]
        assert eo.attrs["gauge"] == f"frame:whitened:{eo.attrs['frame_id']}"
        cost = ds["scalar_cost"].sel(bound="estimate")
        if org.strength == 0:                                       # K copies of one row: nothing is lost
            assert float(cost.sel(scalar_cost_statistic="sign_disagreement")) == 0.0
            assert float(cost.sel(scalar_cost_statistic="overruled_preference")) == 0.0
        else:
            assert float(cost.sel(scalar_cost_statistic="sign_disagreement")) > 0.2


def test_gated_scalar_is_the_models_own_score():
    from reward_lens_spec.models.gated_head import attach_gated_head
    org = multi_objective_organisms((1.0,), n_pairs=24)[0]
    attach_gated_head(org.lm.model, 3, seed=0)
    from reward_lens_spec.models.loading import wrap_model
    lm = wrap_model("gated_mo", org.lm.model, org.lm.tokenizer)
    obs = load_observable("examples/gated_scalar_cost")
    obs.outputs = ["gated_scalar_cost", "margin", "objective_margin"]
    from reward_lens_spec.organisms.organisms import Organism
    ds = evaluate(obs, Organism("multi_objective", 1.0, lm, org.pairs))
    D, s = ds["objective_margin"].transpose("pair", "objective").values.astype(float), ds["margin"].values.astype(float)
    direct = (np.abs(D) * (D * s[:, None] < 0)).sum() / np.abs(D).sum()
    got = float(ds["gated_scalar_cost"].sel(scalar_cost_statistic="overruled_preference", bound="estimate"))
    assert got == pytest.approx(direct, rel=1e-12)


def test_plan_time_errors():
    from reward_lens_spec.models.families import family_for
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    one = PlanInfo(family=family_for("llama"), n_layers=4, n_objectives=1, objectives=("reward",))
    with pytest.raises(SpecError, match=r"steps\.e: the model has 1 head row"):
        build_plan(ObservableSpec(name="t", steps=[{"name": "e", "op": "effective_objectives"}], outputs=["e"]), one)
    two = PlanInfo(family=family_for("llama"), n_layers=4, n_objectives=2, objectives=("a", "b"))
    steps = [{"name": "h", "op": "capture", "site": "readout"},
             {"name": "r", "op": "project", "input": "h", "direction": "objectives"},
             {"name": "m", "op": "diff", "input": "r"}]
    with pytest.raises(SpecError, match=r"steps\.c\.input"):
        build_plan(ObservableSpec(name="t", steps=steps + [{"name": "c", "op": "scalar_cost", "input": "r"}],
                                  outputs=["c"]), two)
    with pytest.raises(SpecError, match=r"steps\.c\.scalar"):
        build_plan(ObservableSpec(name="t", steps=steps + [{"name": "c", "op": "scalar_cost", "input": "m",
                                                            "scalar": "m"}], outputs=["c"]), two)


def test_scalar_cost_criteria_pass_on_the_multi_objective_organism(organisms):
    card = grade("scalar_cost", organisms=organisms)
    assert sorted(card.readings) == ["effective_objectives", "scalar_cost"] and card.passed, card.describe()
