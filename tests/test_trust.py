"""Trust gates: organisms, scorecards, calibration, preregistered studies, adjudication.

Every gate is tested both ways. Tiny models and a handful of pairs only.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.organisms import (STRENGTHS, organism_family, planted_organism,
                                               trained_organisms)
from reward_lens_spec.observables import load_observable
from reward_lens_spec.spec import ModelSpec, ObservableSpec, RunConfig, StoreSpec, validate
from reward_lens_spec.store import open_store, write_run
from reward_lens_spec.trust import studies
from reward_lens_spec.trust.cli import adjudicate_main, calibrate_main, freeze_main
from reward_lens_spec.trust.gates import compute_trust, trust_report
from reward_lens_spec.trust.scorecard import (Scorecard, evaluate, find_cards, grade, observable_hash,
                                              write_card)

import xarray as xr

STUDY = {"name": "t_study", "version": 1,
         "design": {"observable": {"name": "dla"}, "model": {"name": "tiny_llama"}},
         "hypotheses": [{"id": "H1", "statement": "mlp_L1 pushes towards chosen.", "predictions": [
             {"id": "P1", "metric": {"variable": "dla", "select": {"unit": "mlp_L1"}, "reduce": "mean"},
              "comparator": ">", "threshold": 0.0}]}]}


def make_run(model="tiny_llama", observable="dla", experiment=None, **obs_kw):
    obs = load_observable(observable)
    for k, v in obs_kw.items():
        setattr(obs, k, v)
    return RunConfig(model=ModelSpec(name=model, source=f"builtin:{model}"), observable=obs,
                     store=StoreSpec(), experiment=copy.deepcopy(experiment))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls: one thread is faster than two contended OpenMP threads on a shared 2-core box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def planted():
    return organism_family("planted", n_pairs=6)


@pytest.fixture(scope="module")
def dla_card(planted):
    return grade("dla", organisms=planted)


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "store.zarr")


def fake_card(card: Scorecard, **changes) -> Scorecard:
    out = copy.deepcopy(card)
    for k, v in changes.items():
        setattr(out, k, v)
    return out


# -- organisms ---------------------------------------------------------------------------------

def test_planted_dla_grows_with_strength(planted, dla_card):
    r = dla_card.readings["dla_share"]
    assert [o.strength for o in planted] == list(STRENGTHS)
    assert all(b > a for a, b in zip(r, r[1:])), r           # strictly rising with strength
    assert r[0] < 0.2 and r[-1] >= 0.5
    assert dla_card.passed and dla_card.spearman["dla_share"] == pytest.approx(1.0)
    assert dla_card.model_family == "llama" and dla_card.truth["unit"] == "mlp_L1"
    dla = evaluate(load_observable("dla"), planted[-1])["dla"]
    score = evaluate(load_observable("score"), planted[-1])["margin"]
    np.testing.assert_allclose(dla.sum(["layer", "component"], skipna=True).values, score.values, atol=1e-4)


def test_organisms_are_deterministic():
    a, b = planted_organism(0.5, n_pairs=2), planted_organism(0.5, n_pairs=2)
    for (na, pa), (nb, pb) in zip(a.lm.model.state_dict().items(), b.lm.model.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    assert a.pairs.checksum == b.pairs.checksum
    assert all(p.chosen.endswith("!") and p.rejected.endswith(".") for p in a.pairs)


def test_trained_organism_tracks_label_strength():
    orgs = trained_organisms("length", (0.0, 0.5, 1.0), n_train=64, n_test=12, steps=150)
    card = grade("score", organisms=orgs)
    r = card.readings["score"]
    assert r[0] < r[1] < r[2] and card.floors["score"]["value"] >= 0.8 and card.passed
    assert card.organism == "trained_length"


def test_unit_criteria_need_a_planted_unit():
    with pytest.raises(SpecError, match="no calibration criterion"):
        grade("dla", organism="trained_keyword")
    custom = ObservableSpec(name="h_only", steps=[{"name": "h", "op": "capture", "site": "readout"}],
                            outputs=["h"])
    with pytest.raises(SpecError, match="no calibration criterion"):
        grade(custom)


# -- calibration gate ----------------------------------------------------------------------------

def test_non_monotone_card_fails(planted):
    shuffled = [copy.copy(o) for o in planted]
    for o, s in zip(shuffled, reversed(STRENGTHS)):      # strength labels reversed: readings fall
        o.strength = s
    card = grade("dla", organisms=sorted(shuffled, key=lambda o: o.strength))
    assert card.spearman["dla_share"] == pytest.approx(-1.0) and not card.passed


def test_passing_card_upgrades_to_calibrated(store, dla_card):
    run = make_run()
    assert compute_trust(run, store) == "exploratory"              # no store yet
    rid = write_card(dla_card, store)
    (attrs,) = find_cards(store)
    assert attrs["run_id"] == rid and attrs["passed"] is True and attrs["readings"] == dla_card.readings
    assert attrs["observable_spec_hash"] == observable_hash(run.observable) and attrs["model_family"] == "llama"
    assert compute_trust(run, store) == "calibrated"
    assert compute_trust(make_run("tiny_mistral"), store) == "exploratory"   # another family
    assert compute_trust(make_run("tiny_gpt2"), store) == "exploratory"
    assert compute_trust(make_run(observable="score"), store) == "exploratory"  # another observable
    assert compute_trust(make_run(layers=[1]), store) == "exploratory"       # another spec hash
    assert open_store(store).load(rid, "scorecard", lazy=False)["reading"].shape == (1, 5)


def test_failing_or_mismatched_card_never_upgrades(store, dla_card):
    run = make_run()
    write_card(fake_card(dla_card, passed=False), store)
    assert compute_trust(run, store) == "exploratory"
    write_card(fake_card(dla_card, model_family="gpt2"), store)            # passing, other family
    write_card(fake_card(dla_card, spec_hash="0" * 64), store)             # passing, other hash
    rep = trust_report(run, store)
    assert rep["level"] == "exploratory" and "failing" in rep["calibrated"]["reason"]


def test_failing_card_vetoes_a_passing_one(store, dla_card):
    write_card(dla_card, store)
    assert compute_trust(make_run(), store) == "calibrated"
    write_card(fake_card(dla_card, organism="planted_other", passed=False), store)
    assert compute_trust(make_run(), store) == "exploratory"


def test_trust_key_in_config_is_refused():
    for cfg in ({"trust": "calibrated"}, {"observable": {"name": "dla", "trust": "registered"}},
                {"experiment": {"name": "x", "trust": "adjudicated"}}):
        with pytest.raises(SpecError, match="trust is computed by gates"):
            validate(OmegaConf.create(cfg))


# -- registration gate ---------------------------------------------------------------------------

def test_unfrozen_study_is_not_registered_frozen_is(store, dla_card):
    write_card(dla_card, store)
    run = make_run(experiment=STUDY)
    assert compute_trust(run, store) == "calibrated"
    assert "not frozen" in trust_report(run, store)["registered"]["reason"]
    rec = studies.freeze(STUDY, store)
    assert not rec["reused"] and rec["study_hash"] == studies.study_hash(STUDY)
    assert compute_trust(run, store) == "registered"
    assert compute_trust(make_run(), store) == "calibrated"          # no study: not registered
    assert studies.freeze(STUDY, store)["reused"]                    # idempotent, first freeze kept


def test_registered_needs_calibration(store):
    studies.freeze(STUDY, store)
    assert compute_trust(make_run(experiment=STUDY), store) == "exploratory"
    assert trust_report(make_run(experiment=STUDY), store)["registered"]["ok"]


def test_modified_study_is_refused(store, dla_card):
    write_card(dla_card, store)
    studies.freeze(STUDY, store)
    edited = copy.deepcopy(STUDY)
    edited["hypotheses"][0]["predictions"][0]["threshold"] = -1.0
    with pytest.raises(SpecError, match="edited after it was frozen"):
        compute_trust(make_run(experiment=edited), store)
    with pytest.raises(SpecError, match="already frozen with different content"):
        studies.freeze(edited, store)
    studies.freeze(edited, store, amend=True)                          # a dated amendment
    assert compute_trust(make_run(experiment=edited), store) == "registered"
    assert len(studies.frozen_studies(store, "t_study")) == 2


def test_design_mismatch_is_refused(store):
    studies.freeze(STUDY, store)
    with pytest.raises(SpecError, match="preregistered with observable.name='dla'"):
        compute_trust(make_run(observable="score", experiment=STUDY), store)


def test_bad_study_schema():
    bad = copy.deepcopy(STUDY)
    bad["hypotheses"][0]["predictions"][0]["comparator"] = "=>"
    with pytest.raises(SpecError, match="comparator"):
        studies.validate_study(bad)


# -- adjudication --------------------------------------------------------------------------------

def _fake_result(store, run_id, study, trust, mlp_l1):
    """A stored dla result whose config executed ``study`` (what execute writes, minus the model)."""
    vals = np.zeros((3, 2, 2))
    vals[:, 1, 1] = mlp_l1
    unit = np.array([["attn_L0", "mlp_L0"], ["attn_L1", "mlp_L1"]])
    ds = xr.Dataset({"dla": (("pair", "layer", "component"), vals)},
                    coords={"pair": ["a", "b", "c"], "layer": [0, 1], "component": ["attn", "mlp"],
                            "unit": (("layer", "component"), unit)})
    cfg = OmegaConf.to_yaml(OmegaConf.create({"observable": {"name": "dla"}, "experiment": study}))
    write_run(store, run_id, {"dla": ds}, {"config_yaml": cfg, "trust": trust, "observable": "dla"})


def test_adjudication_uses_the_frozen_copy(store):
    studies.freeze(STUDY, store)
    _fake_result(store, "dla-run1", STUDY, "registered", 0.5)
    edited = copy.deepcopy(STUDY)                               # the "file" now says threshold 1.0
    edited["hypotheses"][0]["predictions"][0]["threshold"] = 1.0
    rec = studies.adjudicate(edited, store)
    assert rec["outcome"] == {"P1": "confirmed"} and rec["predictions"][0]["threshold"] == 0.0
    assert rec["trust"] == "adjudicated" and rec["runs"] == ["dla-run1"]
    stored = open_store(store).provenance(rec["run_id"])
    assert stored["outcome"] == {"P1": "confirmed"} and stored["trust"] == "adjudicated"


def test_adjudication_refutes_and_keeps_lower_trust(store):
    studies.freeze(STUDY, store)
    _fake_result(store, "dla-run2", STUDY, "exploratory", -0.5)
    rec = studies.adjudicate("t_study", store)
    assert rec["outcome"] == {"P1": "refuted"} and rec["trust"] == "exploratory"


def test_adjudication_needs_a_frozen_study_and_runs(store):
    with pytest.raises(SpecError, match="not frozen"):
        studies.adjudicate("t_study", store)
    studies.freeze(STUDY, store)
    with pytest.raises(SpecError, match="no run of study"):
        studies.adjudicate("t_study", store)


def test_freeze_refuses_after_data_exists(store):
    _fake_result(store, "dla-early", STUDY, "exploratory", 0.5)
    with pytest.raises(SpecError, match="would not be a preregistration"):
        studies.freeze(STUDY, store)


# -- end to end, through execute and the CLI functions ---------------------------------------------

def test_end_to_end_example_study(tmp_path, dla_card, capsys):
    from hydra import compose, initialize_config_dir

    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.run import execute
    from reward_lens_spec.spec import register_configs

    url = str(tmp_path / "s.zarr")
    write_card(dla_card, url)
    assert freeze_main(["experiment=example_dla_mlp", f"store.url={url}"]) == 0
    register_configs()
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=example_dla_mlp", "dataset.limit=16"])
    run = validate(cfg)
    out = execute(run, resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=str(tmp_path), store_url=url,
                  progress=False)
    assert open_store(url).provenance(out.run_id)["trust"] == "registered"
    assert adjudicate_main(["experiment=example_dla_mlp", f"store.url={url}"]) == 0
    text = capsys.readouterr().out
    assert "P1:" in text and "P2:" in text and "trust: adjudicated" in text
    assert freeze_main(["experiment=nope", f"store.url={url}"]) == 2


def test_calibrate_cli(tmp_path, capsys):
    url = str(tmp_path / "c.zarr")
    assert calibrate_main(["observable=score", "n_pairs=3", f"store.url={url}"]) == 0
    text = capsys.readouterr().out
    assert "score" in text and "PASS" in text and "s=0.25" in text
    assert find_cards(url)[0]["passed"] is True
    assert calibrate_main(["observable=nope", f"store.url={url}"]) == 2
    assert calibrate_main(["observabel=dla"]) == 2
