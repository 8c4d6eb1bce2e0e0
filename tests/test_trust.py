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
from reward_lens_spec.organisms.organisms import (STRENGTHS, planted_organism,
                                               trained_organisms)
from reward_lens_spec.observables import load_observable
from reward_lens_spec.spec import ObservableSpec, validate
from reward_lens_spec.store import open_store
from reward_lens_spec.trust import studies, study_doc
from reward_lens_spec.trust.cli import adjudicate_main, calibrate_main, freeze_main
from reward_lens_spec.identity import observable_hash
from reward_lens_spec.trust.scorecard import Scorecard, evaluate, find_cards, grade, write_card

STUDY = {"name": "t_study", "version": 1,
         "design": {"observable": {"name": "dla"}, "model": {"name": "tiny_llama"},
                    "dataset": {"name": "diagnostic", "limit": 4}},
         "hypotheses": [{"id": "H1", "statement": "mlp_L1 pushes towards chosen.", "predictions": [
             {"id": "P1", "metric": {"variable": "dla", "select": {"unit": "mlp_L1"}, "reduce": "mean"},
              "comparator": ">", "threshold": 0.0}]}]}


def make_run(model="tiny_llama", observable="dla", experiment=None, limit=4, **obs_kw):
    """A validated RunConfig (composed like the app) with an in-memory observable or study if given."""
    from reward_lens_spec.run.compose import compose_run
    name = observable if isinstance(observable, str) else "dla"
    run, _ = compose_run([f"model={model}", f"observable={name}", f"dataset.limit={limit}"])
    if not isinstance(observable, str):
        run.observable = observable
    for k, v in obs_kw.items():
        setattr(run.observable, k, v)
    run.experiment = copy.deepcopy(experiment)
    return run


def execute_run(url, tmp_path, run):
    from reward_lens_spec.run import execute
    return execute(run, resolved_yaml=OmegaConf.to_yaml(OmegaConf.structured(run)), base_dir=str(tmp_path),
                   store_url=url, progress=False).run_id


def trust_of(url, run_id):
    return open_store(url).trust(run_id)


pytestmark = pytest.mark.usefixtures("one_thread")


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


# -- calibration gate (derived on read) -------------------------------------------------------------

def test_card_grades_magnitude_and_records_scope(dla_card):
    m = dla_card.magnitude["dla_share"]
    assert m["truth"] > 1.0 and abs(m["reading"] - m["truth"]) <= 0.05 * m["truth"], m
    assert dla_card.graded == ["dla"] and dla_card.ungraded == ["dla_heads"]
    assert dla_card.scope == {"family": "llama", "organism": "planted", "base": "tiny_llama",
                              "strengths": list(STRENGTHS), "n_pairs": 6}
    assert len(dla_card.identities) == 5 and all(r[0]["max_abs_err"] < 1e-4 * r[0]["scale"]
                                                 for r in dla_card.identities)


def test_passing_card_calibrates_the_graded_variable_only(store, tmp_path, dla_card):
    rid = execute_run(store, tmp_path, make_run())
    assert trust_of(store, rid)["trust_by_variable"] == {"dla": "exploratory", "dla_heads": "exploratory"}
    write_card(dla_card, store)
    t = trust_of(store, rid)                                  # derived now: the card came later
    assert t["trust_by_variable"] == {"dla": "calibrated", "dla_heads": "exploratory"}
    assert t["trust"] == "exploratory" and "not graded by any card: ['dla_heads']" in t["trust_reason"]
    assert t["trust_scope"][0]["family"] == "llama" and t["trust_scope"][0]["organism"] == "planted"
    ds = open_store(store).load(rid, "dla")
    assert ds["dla"].attrs["trust"] == "calibrated" and ds["dla_heads"].attrs["trust"] == "exploratory"
    rid2 = execute_run(store, tmp_path, make_run(limit=3))    # written after the card: cache agrees
    assert open_store(store).document(rid2)["trust_by_variable"]["dla"] == "calibrated"
    flags = dict(zip(*open_store(store).runs()[["run_id", "trust_verified"]].values.T))
    # rid's cache predates the card: flagged, shown derived
    assert flags == {rid: False, rid2: True, find_cards(store)[0]["run_id"]: True}
    for other in (make_run("tiny_gpt2", limit=3), make_run(version=2, limit=3)):      # other family / hash
        assert trust_of(store, execute_run(store, tmp_path, other))["trust_by_variable"]["dla"] == "exploratory"


def test_later_failing_card_downgrades_earlier_runs(store, tmp_path, dla_card):
    write_card(dla_card, store)
    rid = execute_run(store, tmp_path, make_run())
    assert trust_of(store, rid)["trust_by_variable"]["dla"] == "calibrated"
    bad = copy.deepcopy(dla_card)
    bad.organism, bad.passed = "planted_other", False
    bad.readings = {"dla_share": [0.0] * 5}
    bad.spearman = {"dla_share": None}
    write_card(bad, store)
    t = trust_of(store, rid)
    assert t["trust_by_variable"]["dla"] == "exploratory" and "fails" in t["trust_reason"]
    assert t["trust_verified"] is False            # its cached label said calibrated
    assert open_store(store).provenance(rid)["trust_stored"] == "exploratory"


def test_failing_card_never_upgrades(store, tmp_path, dla_card):
    card = copy.deepcopy(dla_card)
    card.spearman = {"dla_share": 0.5}
    card.passed = False
    write_card(card, store)
    rid = execute_run(store, tmp_path, make_run())
    assert trust_of(store, rid)["trust_by_variable"]["dla"] == "exploratory"


def test_trust_key_in_config_is_refused():
    for cfg in ({"trust": "calibrated"}, {"observable": {"name": "dla", "trust": "registered"}},
                {"experiment": {"name": "x", "trust": "adjudicated"}}):
        with pytest.raises(SpecError, match="trust is computed by gates"):
            validate(OmegaConf.create(cfg))


def test_trust_override_gets_the_one_line_error(tmp_path):
    import os
    import subprocess
    import sys
    for arg in ("+experiment.trust=1", "+trust=registered", "+observable.trust=1"):
        out = subprocess.run([sys.executable, "-m", "reward_lens_spec", arg], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().count("\n") == 0 and "trust is computed by gates" in out.stderr


# -- registration ----------------------------------------------------------------------------------

def test_unfrozen_study_is_not_registered_frozen_is(store, tmp_path, dla_card):
    write_card(dla_card, store)
    rid = execute_run(store, tmp_path, make_run(experiment=STUDY))
    t = trust_of(store, rid)
    assert t["trust_by_variable"]["dla"] == "calibrated" and "not frozen" in t["trust_reason"]
    with pytest.raises(SpecError, match="would not be a preregistration"):     # results exist already
        studies.freeze(STUDY, store)


def test_frozen_study_registers_matching_runs(store, tmp_path, dla_card):
    write_card(dla_card, store)
    rec = studies.freeze(STUDY, store)
    assert not rec["reused"] and rec["study_hash"] == studies.study_hash(STUDY)
    assert set(rec["pins"]) == {"observable_spec_hash", "model_fingerprint", "dataset_checksum"}
    assert rec["pins"]["observable_spec_hash"] == observable_hash(load_observable("dla"))
    rid = execute_run(store, tmp_path, make_run(experiment=STUDY))
    assert trust_of(store, rid)["trust_by_variable"]["dla"] == "registered"
    assert studies.freeze(STUDY, store)["reused"]                    # idempotent, first freeze kept
    with pytest.raises(SpecError, match="preregistered with dataset.limit=4"):
        execute_run(store, tmp_path, make_run(experiment=STUDY, limit=3))


def test_hole_a_same_name_other_instrument_is_refused(store, tmp_path, dla_card):
    studies.freeze(STUDY, store)
    other = load_observable("dla")
    other.outputs = ["dla"]                                 # same name "dla", different content hash
    with pytest.raises(SpecError, match="different instrument under the same name"):
        execute_run(store, tmp_path, make_run(observable=other, experiment=STUDY))


def test_hole_c_and_d_no_refreezing_after_results(store, tmp_path, dla_card):
    write_card(dla_card, store)
    studies.freeze(STUDY, store)
    execute_run(store, tmp_path, make_run(experiment=STUDY))
    first = studies.adjudicate("t_study", store)
    moved = copy.deepcopy(STUDY)                                        # move the threshold after seeing it
    moved["hypotheses"][0]["predictions"][0]["threshold"] = -100.0
    with pytest.raises(SpecError, match="edited after it was frozen"):
        execute_run(store, tmp_path, make_run(experiment=moved))
    with pytest.raises(SpecError, match="already frozen with different content"):
        studies.freeze(moved, store)
    with pytest.raises(SpecError, match="amending study 't_study' now would not be a preregistration"):
        studies.freeze(moved, store, amend=True)                        # (d): amending after the outcome
    renamed = {**moved, "name": "t_study_again"}
    with pytest.raises(SpecError, match="would not be a preregistration"):
        studies.freeze(renamed, store)                                  # (c): a fresh name, same design
    assert len(studies.frozen_studies(store, "t_study")) == 1
    again = studies.adjudicate("t_study", store)
    assert again["reused"] and again["run_id"] == first["run_id"] and again["outcome"] == first["outcome"]


def test_peeking_under_another_name_or_through_an_include_blocks_freezing(store, tmp_path):
    peek = load_observable("dla")
    peek.name = "dla_peek"                                    # same instrument, another name
    execute_run(store, tmp_path, make_run(observable=peek, limit=6))
    with pytest.raises(SpecError, match="would not be a preregistration"):
        studies.freeze(STUDY, store)
    other = str(tmp_path / "other.zarr")
    share = load_observable("examples/mlp_attn_share")          # includes dla, and stores it
    share.outputs = ["margin_share", "dla"]
    execute_run(other, tmp_path, make_run(observable=share, limit=2))
    with pytest.raises(SpecError, match="would not be a preregistration"):
        studies.freeze(STUDY, other)
    clean = str(tmp_path / "clean.zarr")
    execute_run(clean, tmp_path, make_run(model="tiny_qwen2", observable=peek))  # another model: no peek
    assert not studies.freeze(STUDY, clean)["reused"]


def test_an_amendment_carries_the_refutation_it_follows(store, tmp_path, dla_card):
    write_card(dla_card, store)
    doomed = copy.deepcopy(STUDY)
    doomed["hypotheses"][0]["predictions"][0]["threshold"] = 1e6           # cannot hold
    studies.freeze(doomed, store)
    execute_run(store, tmp_path, make_run(experiment=doomed))
    assert studies.adjudicate("t_study", store)["outcome"] == {"P1": "refuted"}
    moved = copy.deepcopy(doomed)
    moved["design"]["model"] = {"name": "tiny_qwen2"}                     # a new design, not yet run
    rec = studies.freeze(moved, store, amend=True)
    assert [r["refuted"] for r in rec["amended_after_refutation"]] == [["P1"]]
    execute_run(store, tmp_path, make_run(model="tiny_qwen2", experiment=moved))
    later = studies.adjudicate("t_study", store)
    assert later["amended_after_refutation"] and later["amended_after_refutation"][0]["refuted"] == ["P1"]


def test_modified_study_is_refused(store, tmp_path, dla_card):
    write_card(dla_card, store)
    studies.freeze(STUDY, store)
    edited = copy.deepcopy(STUDY)
    edited["hypotheses"][0]["predictions"][0]["threshold"] = -1.0
    with pytest.raises(SpecError, match="edited after it was frozen"):
        studies.check_run(make_run(experiment=edited), store)
    with pytest.raises(SpecError, match="already frozen with different content"):
        studies.freeze(edited, store)
    amended = studies.freeze(edited, store, amend=True)              # before any result: a new version
    assert amended["version_index"] == 2 and amended["amends"] == [studies.study_hash(STUDY)]
    rid = execute_run(store, tmp_path, make_run(experiment=edited))
    assert trust_of(store, rid)["trust_by_variable"]["dla"] == "registered"
    versions = studies.frozen_studies(store, "t_study")
    assert [v["study_hash"] for v in versions] == [studies.study_hash(STUDY), studies.study_hash(edited)]


def test_bad_study_schema():
    bad = copy.deepcopy(STUDY)
    bad["hypotheses"][0]["predictions"][0]["comparator"] = "=>"
    with pytest.raises(SpecError, match="comparator"):
        study_doc.validate_study(bad)


# -- adjudication ----------------------------------------------------------------------------------

def test_adjudication_uses_the_frozen_copy_and_derived_trust(store, tmp_path, dla_card):
    write_card(dla_card, store)
    studies.freeze(STUDY, store)
    rid = execute_run(store, tmp_path, make_run(experiment=STUDY))
    edited = copy.deepcopy(STUDY)                               # the "file" now says threshold 1e9
    edited["hypotheses"][0]["predictions"][0]["threshold"] = 1e9
    rec = studies.adjudicate(edited, store)
    assert rec["predictions"][0]["threshold"] == 0.0 and rec["runs"] == [rid]
    mean = float(open_store(store).load(rid, "dla")["dla"].sel(layer=1, component="mlp").mean())
    assert rec["outcome"] == {"P1": "confirmed" if mean > 0 else "refuted"}
    assert rec["trust"] == "adjudicated" and rec["run_trust"] == {rid: "registered"}
    assert open_store(store).trust(rec["run_id"])["trust"] == "adjudicated"


def test_adjudication_of_unregistered_runs_is_not_adjudicated(store, tmp_path):
    studies.freeze(STUDY, store)                       # no card: the runs stay exploratory
    execute_run(store, tmp_path, make_run(experiment=STUDY))
    rec = studies.adjudicate("t_study", store)
    assert rec["trust"] == "exploratory" and open_store(store).trust(rec["run_id"])["trust"] == "exploratory"


def test_adjudication_needs_a_frozen_study_and_runs(store):
    with pytest.raises(SpecError, match="not frozen"):
        studies.adjudicate("t_study", store)
    studies.freeze(STUDY, store)
    with pytest.raises(SpecError, match="no run of study"):
        studies.adjudicate("t_study", store)


# -- end to end, through execute and the CLI functions ---------------------------------------------

def test_end_to_end_example_study(tmp_path, dla_card, capsys, monkeypatch):
    from hydra import compose, initialize_config_dir

    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.run import execute
    from reward_lens_spec.spec import register_configs

    monkeypatch.chdir(tmp_path)
    url = str(tmp_path / "s.zarr")
    write_card(dla_card, url)
    assert freeze_main(["experiment=example_dla_mlp", f"store.url={url}"]) == 0
    register_configs()
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=example_dla_mlp"])
    run = validate(cfg)
    out = execute(run, resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=str(tmp_path), store_url=url,
                  progress=False)
    prov = open_store(url).provenance(out.run_id)
    assert prov["trust_by_variable"] == {"dla": "registered", "dla_heads": "exploratory"} and prov["trust_verified"]
    assert adjudicate_main(["experiment=example_dla_mlp", f"store.url={url}"]) == 0
    text = capsys.readouterr().out
    assert "P1:" in text and "P2:" in text and "trust: adjudicated" in text
    assert freeze_main(["experiment=nope", f"store.url={url}"]) == 2


def test_calibrate_cli(tmp_path, capsys):
    url = str(tmp_path / "c.zarr")
    assert calibrate_main(["observable=score", "n_pairs=3", f"store.url={url}"]) == 0
    text = capsys.readouterr().out
    assert "score" in text and "PASS" in text and "s=0.25" in text and "magnitude" in text
    assert find_cards(url)[0]["passed"] is True
    assert calibrate_main(["observable=nope", f"store.url={url}"]) == 2
    assert calibrate_main(["observabel=dla"]) == 2


def test_amending_the_design_keeps_earlier_versions_and_adjudications(store, tmp_path, dla_card):
    write_card(dla_card, store)
    studies.freeze(STUDY, store)
    execute_run(store, tmp_path, make_run(experiment=STUDY))
    first = studies.adjudicate("t_study", store)
    peeked = copy.deepcopy(STUDY)                    # 3 of the 4 pairs already seen on this model: a peek
    peeked["design"]["dataset"]["limit"] = 3
    with pytest.raises(SpecError, match="would not be a preregistration"):
        studies.freeze(peeked, store, amend=True)
    moved = copy.deepcopy(STUDY)                     # a new design (pairs no run has seen): other data
    moved["design"]["dataset"]["dimensions"] = ["sycophancy"]
    v2 = studies.freeze(moved, store, amend=True)
    v1 = studies.frozen_studies(store, "t_study")[0]
    assert v2["version_index"] == 2 and v2["pins"]["dataset_checksum"] != v1["pins"]["dataset_checksum"]
    new_data = make_run(experiment=moved)
    new_data.dataset.dimensions = ["sycophancy"]
    execute_run(store, tmp_path, new_data)
    second = studies.adjudicate("t_study", store)
    assert second["run_id"] != first["run_id"] and second["study_hash"] == studies.study_hash(moved)
    st = open_store(store)
    assert st.trust(first["run_id"])["trust"] == st.trust(second["run_id"])["trust"] == "adjudicated"
    assert st.document(first["run_id"])["outcome"] == first["outcome"]           # never overwritten
    assert [v["version_index"] for v in studies.frozen_studies(store, "t_study")] == [1, 2]
