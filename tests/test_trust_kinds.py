"""Trust for every kind of reward signal (issue 28 item 6, issue 29 item 6): organism families with planted
truth for judges, PRMs, implicit rewards, LEACE and curvature (``organisms.kind_organisms``), their criteria
(``trust.kind_criteria``), the kinds' exactness identities (``trust.identities``), end to end through
``calibrate`` into a store whose runs then read ``calibrated``. Every criterion is also shown to FAIL a card
when the instrument's reading is deliberately wrong (sign, step, scale, no erasure, wrong direction)."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from reward_lens_spec.organisms.kind_organisms import KINDS, organism_family
from reward_lens_spec.observables import load_observable
from reward_lens_spec.store import open_store
from reward_lens_spec.trust import scorecard
from reward_lens_spec.trust.evidence import identities_ok
from reward_lens_spec.trust.identities import check_identities

pytestmark = pytest.mark.usefixtures("one_thread")
S3 = (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def families():
    """One small family per kind, built once (grading takes hand-made organisms)."""
    fam = {k: organism_family(k, S3, n_pairs=4) for k in ("judge_planted", "prm_planted", "implicit_planted")}
    fam["curvature"] = organism_family("curvature", S3, n_pairs=2)
    fam["concept"] = organism_family("concept", S3, n_pairs=200)
    return fam


_REAL_EVALUATE = scorecard.evaluate
_SEEN: dict = {}


def _evaluate_once(obs, org):
    """``scorecard.evaluate`` (the one executor), each (observable, organism) once per module: a tampered grading
    reads the very outputs the honest one did."""
    key = (obs.name, id(org))
    if key not in _SEEN:
        _SEEN[key] = (org, _REAL_EVALUATE(obs, org))      # the organism kept alive, so its id stays its own
    ds = _SEEN[key][1]
    return ds.copy(deep=True).assign_attrs(identities=list(ds.attrs["identities"]))


def _grade(obs, orgs, tamper=None, monkeypatch=None):
    """``scorecard.grade`` on ``orgs``; ``tamper(ds)`` edits every organism's outputs (a broken instrument)."""
    import unittest.mock as um
    fn = _evaluate_once if tamper is None else (lambda o, org: tamper(_evaluate_once(o, org)))
    with um.patch.object(scorecard, "evaluate", fn):
        return scorecard.grade(obs, organisms=orgs)


def test_new_kinds_are_reachable_from_the_family_table():
    for k in ("judge_planted", "prm_planted", "implicit_planted", "concept", "curvature"):
        assert k in KINDS


# -- judge ------------------------------------------------------------------------------------------------

def test_judge_cards_pass_and_record_the_verdict_margin_identity(families):
    orgs = families["judge_planted"]
    card = _grade("score", orgs)
    assert card.passed, card.describe()
    assert set(card.readings) == {"score", "verdict_margin"}
    r = card.readings["verdict_margin"]
    assert r[0] < r[1] < r[2] and r[2] > 1.0            # the verdict margin climbs with the planted write
    dla = _grade("dla", orgs)
    assert dla.passed and dla.criteria_passed["dla_share"], dla.describe()
    names = {rec["identity"] for per in dla.identities for rec in per}
    assert "sum of dla = verdict margin" in names


def test_judge_flipped_verdict_fails(families, monkeypatch):
    def flip(ds):
        return ds.assign(margin=-ds["margin"])
    card = _grade("score", families["judge_planted"], flip, monkeypatch)
    assert not card.passed and not card.criteria_passed["verdict_margin"]
    assert card.floors["verdict_margin"]["value"] < 0        # nowhere near the causal LM's own margin


def test_judge_scaled_verdict_fails_the_floor(families, monkeypatch):
    """Monotone but 10% off the causal LM's margin: the floor (not the ranking) fails it."""
    card = _grade("score", families["judge_planted"], lambda ds: ds.assign(margin=1.1 * ds["margin"]), monkeypatch)
    assert card.spearman["verdict_margin"] == 1.0 and not card.criteria_passed["verdict_margin"]


# -- PRM --------------------------------------------------------------------------------------------------

def test_prm_card_locates_the_planted_step(families):
    card = _grade("prm_steps", families["prm_planted"])
    assert card.passed, card.describe()
    assert card.floors["prm_bad_step"]["value"] == 1.0
    r = card.readings["prm_bad_step"]
    assert abs(r[0]) < 0.05 and r[0] < r[1] < r[2]
    names = {rec["identity"] for per in card.identities for rec in per}
    assert {"aggregate = 'last' over σ(step rewards)", "step reward at the readout step = reward"} <= names


def test_prm_wrong_step_fails(families, monkeypatch):
    def shift(ds):                                   # an instrument reading one step late
        return ds.assign(step_reward=ds["step_reward"].roll(step=1, roll_coords=False))
    card = _grade("prm_steps", families["prm_planted"], shift, monkeypatch)
    assert not card.passed and not card.criteria_passed["prm_bad_step"]


def test_prm_flipped_drop_fails(families, monkeypatch):
    def swap(ds):                                    # sides swapped: the clean side looks flawed
        return ds.assign(step_reward=ds["step_reward"].isel(side=[1, 0]).assign_coords(side=["chosen", "rejected"]))
    card = _grade("prm_steps", families["prm_planted"], swap, monkeypatch)
    assert not card.criteria_passed["prm_bad_step"]


# -- implicit ---------------------------------------------------------------------------------------------

def test_implicit_card_recovers_the_planted_log_ratio(families):
    card = _grade("implicit", families["implicit_planted"])
    assert card.passed, card.describe()
    assert card.readings["implicit_log_ratio"] == pytest.approx([0.0, 0.25, 0.5], abs=1e-6)   # β·s, β = 0.5
    names = {rec["identity"] for per in card.identities for rec in per}
    assert "sum of per-token reward = reward" in names


@pytest.mark.parametrize("how", ["sign", "beta"])
def test_implicit_wrong_per_token_fails(families, monkeypatch, how):
    k = -1.0 if how == "sign" else 2.0                # a flipped log-ratio; β read twice
    card = _grade("implicit", families["implicit_planted"],
                  lambda ds: ds.assign(per_token_reward=k * ds["per_token_reward"]), monkeypatch)
    assert not card.criteria_passed["implicit_log_ratio"] and not card.passed


# -- identities: a tampered value breaks them -------------------------------------------------------------

def _evaluated(orgs, obs):
    org = orgs[-1]
    return org, scorecard.evaluate(load_observable(obs), org)


def _recheck(ds, org, **kw):
    """Identities of ``ds`` against the organism's own head output (a fresh capture pass)."""
    from reward_lens_spec.run.executor import compute
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    lm = org.lm
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=lm.head.objectives)
    plan = build_plan(load_observable("margin"), info, load_observable)
    tpl = {"template": org.params["template"]} if "template" in org.params else {}
    _, ctx, enc = compute(lm, org.pairs, plan, info, **tpl)
    return check_identities(ds, ctx.capture.logits, enc.pair_ids, n_layers=lm.n_layers, objectives=lm.head.objectives,
                            signal=kw.get("signal", getattr(lm, "signal", None)))


def test_tampered_per_token_reward_breaks_its_identity(families):
    org, ds = _evaluated(families["implicit_planted"], "implicit")
    assert identities_ok(_recheck(ds, org))[0]
    bad = ds.copy(deep=True)
    bad["per_token_reward"][0, 0, 0] += 0.01
    ok, why = identities_ok(_recheck(bad, org))
    assert not ok and "per-token" in why


def test_tampered_prm_aggregate_or_rule_breaks_its_identity(families):
    from dataclasses import replace
    org, ds = _evaluated(families["prm_planted"], "prm_steps")
    assert identities_ok(_recheck(ds, org))[0]
    bad = ds.copy(deep=True)
    bad["aggregate"][1, 0] += 0.01
    ok, why = identities_ok(_recheck(bad, org))
    assert not ok and "aggregate" in why
    other = replace(org.lm.signal, aggregate="min")   # the model declares min; the output used last
    ok, why = identities_ok(_recheck(ds, org, signal=other))
    assert not ok and "'min'" in why
    bad = ds.copy(deep=True)
    bad["step_reward"][0, 1, :] += 0.05              # every step moved: the readout step disagrees with the head
    ok, why = identities_ok(_recheck(bad, org))
    assert not ok


def test_tampered_dla_breaks_the_verdict_margin_identity(families):
    org, ds = _evaluated(families["judge_planted"], "dla")
    recs = _recheck(ds, org)
    assert identities_ok(recs)[0] and any(r["identity"] == "sum of dla = verdict margin" for r in recs)
    bad = ds.copy(deep=True)
    bad["dla"].loc[dict(layer=1, component="mlp")] += 0.05
    ok, why = identities_ok(_recheck(bad, org))
    assert not ok and "verdict margin" in why


# -- every run of the kinds records them ------------------------------------------------------------------

@pytest.mark.parametrize("model, obs, identity", [
    ("tiny_implicit", "implicit", "sum of per-token reward = reward"),
    ("tiny_judge", "dla", "sum of dla = verdict margin"),
    ("tiny_prm", "prm_steps", "aggregate = 'min' over σ(step rewards)")])
def test_every_run_of_the_kind_records_its_identity(tmp_path, model, obs, identity):
    from reward_lens_spec.run import compose_run, execute
    run, _ = compose_run([f"model={model}", f"observable={obs}", "dataset.limit=3"])
    store = str(tmp_path / "s.zarr")
    rid = execute(run, resolved_yaml=OmegaConf.to_yaml(OmegaConf.structured(run)), base_dir=str(tmp_path),
                  store_url=store, progress=False).run_id
    recs = open_store(store).document(rid)["identities"]
    assert identity in {r["identity"] for r in recs} and identities_ok(recs)[0]


# -- end to end: calibrate writes a card, a run of that observable reads calibrated ------------------------

def test_calibrate_prm_end_to_end_calibrates_the_graded_variables(tmp_path, capsys):
    from reward_lens_spec.run import compose_run, execute
    from reward_lens_spec.trust.cli import calibrate_main
    store = str(tmp_path / "s.zarr")
    assert calibrate_main(["observable=prm_steps", "organism=prm_planted", "n_pairs=4", f"store.url={store}"]) == 0
    out = capsys.readouterr().out
    assert "prm_bad_step" in out and "=> PASS" in out
    card = scorecard.find_cards(store)[-1]
    assert card["passed"] and set(card["graded"]) == {"margin", "step_reward", "step_margin"}
    run, _ = compose_run(["model=tiny_prm", "observable=prm_steps", "dataset.limit=3"])
    rid = execute(run, resolved_yaml=OmegaConf.to_yaml(OmegaConf.structured(run)), base_dir=str(tmp_path),
                  store_url=store, progress=False).run_id
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"]["step_reward"] == "calibrated" and t["trust_by_variable"]["margin"] == "calibrated"
    assert t["trust_by_variable"]["step_margin"] == "calibrated"
    assert t["trust_by_variable"]["aggregate"] == "exploratory"


# -- LEACE: the planted concept removed, the non-planted one left where it was ----------------------------

LEACE_YAML = Path(__file__).parent / "data" / "leace_concept.yaml"


@pytest.fixture(scope="module")
def leace_yaml():
    return str(LEACE_YAML)


def test_leace_card_removes_the_planted_concept_and_spares_the_other(families, leace_yaml):
    card = _grade(leace_yaml, families["concept"])
    assert card.passed, card.describe()
    assert set(card.readings) == {"leace_removal", "leace_specificity"}
    assert card.floors["leace_removal"]["value"] > 0.9 and card.floors["leace_specificity"]["value"] > 0.75


def test_leace_that_does_not_erase_fails(families, leace_yaml, monkeypatch):
    def keep(ds):                                    # "after" = "before": the probe still reads the concept
        c = ds["certificate"].copy()
        c.loc[dict(stage="after")] = c.sel(stage="before").values
        return ds.assign(certificate=c)
    card = _grade(leace_yaml, families["concept"], keep, monkeypatch)
    assert not card.passed and not card.criteria_passed["leace_removal"]


def test_leace_that_moves_every_concept_fails(families, leace_yaml, monkeypatch):
    def blunt(ds):                                   # the non-planted concept's erasure moves as much as the planted
        return ds.assign(unplanted_displacement=ds["displacement"].copy())
    card = _grade(leace_yaml, families["concept"], blunt, monkeypatch)
    assert not card.passed and not card.criteria_passed["leace_specificity"]


# -- curvature: the top eigenvalue is the planted direction's --------------------------------------------

def test_curvature_card_finds_the_planted_direction(families):
    card = _grade("examples/curvature", families["curvature"])
    assert card.passed, card.describe()
    r = card.readings["curvature_direction"]
    assert r[0] < r[1] < r[2] and r[2] > 20 * r[0]
    assert card.floors["curvature_direction"]["value"] > 0.9


def test_curvature_off_the_planted_direction_fails(families, monkeypatch):
    """A top eigenvalue twice the planted direction's curvature: its eigenvector is not v (Rayleigh ≈ 0.5)."""
    card = _grade("examples/curvature", families["curvature"],
                  lambda ds: ds.assign(margin_eigenvalues=2.0 * ds["margin_eigenvalues"]), monkeypatch)
    assert not card.passed and not card.criteria_passed["curvature_direction"]


def test_calibrate_implicit_end_to_end_with_a_base(tmp_path, capsys):
    """``calibrate observable=implicit organism=implicit_planted base=tiny_llama``: the card passes and a DPO-implicit
    run of that observable (model=tiny_implicit, same family) reads calibrated on the graded variables only."""
    from reward_lens_spec.run import compose_run, execute
    from reward_lens_spec.trust.cli import calibrate_main
    store = str(tmp_path / "s.zarr")
    assert calibrate_main(["observable=implicit", "organism=implicit_planted", "base=tiny_llama", "n_pairs=4",
                           f"store.url={store}"]) == 0
    assert "implicit_log_ratio" in capsys.readouterr().out
    run, _ = compose_run(["model=tiny_implicit", "observable=implicit", "dataset.limit=3"])
    rid = execute(run, resolved_yaml=OmegaConf.to_yaml(OmegaConf.structured(run)), base_dir=str(tmp_path),
                  store_url=store, progress=False).run_id
    by_var = open_store(store).trust(rid)["trust_by_variable"]
    assert by_var == {"reward": "exploratory", "margin": "calibrated", "p_chosen": "exploratory",
                      "per_token_reward": "calibrated"}


def test_unknown_organism_kind_names_every_kind():
    from reward_lens_spec.errors import SpecError
    with pytest.raises(SpecError) as e:
        organism_family("judge_plantd")
    assert "judge_planted" in str(e.value)
