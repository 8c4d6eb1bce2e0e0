"""Trust cannot be forged: broken instruments fail calibration, tampered documents are caught on read.

The broken instruments are observable YAMLs a user could write by accident; none is
special-cased by name (all are called ``dla`` or ``score``). Tampering edits the
stored ``zarr.json`` documents directly, as a user with write access could.
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from reward_lens_spec.errors import StoreError
from reward_lens_spec.spec import ObservableSpec
from reward_lens_spec.store import open_store
from reward_lens_spec.store.catalog_cli import main as store_main
from reward_lens_spec.trust import studies
from reward_lens_spec.trust.evidence import content_hash
from reward_lens_spec.identity import observable_hash
from reward_lens_spec.trust.scorecard import grade, write_card

from test_trust import STUDY, execute_run, make_run

DLA_HEAD = """
  - {name: components, op: capture, site: components}
  - {name: resid, op: capture, site: resid}
  - {name: final_resid, op: select, input: resid, dim: layer, index: last}
  - {name: components_normed, op: final_norm, input: components, mode: frozen, reference: final_resid}
"""
BROKEN = {
    # Σ dla = 2 × margin: every share criterion is scale-free, only magnitude and the identity see it
    "scaled": "name: dla\nsteps:" + DLA_HEAD + """
  - {name: dla_sides, op: project, input: components_normed, direction: head}
  - {name: dla_true, op: diff, input: dla_sides}
  - {name: dla, op: scale, input: dla_true, by: 0.5}
outputs: [dla]
""",
    # the components projected on w_r without the final norm: Σ dla ≠ margin
    "no_final_norm": "name: dla\nsteps:" + DLA_HEAD + """
  - {name: dla_sides, op: project, input: components, direction: head}
  - {name: dla, op: diff, input: dla_sides}
outputs: [dla]
""",
    # sign flipped: Σ dla = −margin
    "sign_flipped": "name: dla\nsteps:" + DLA_HEAD + """
  - {name: dla_sides, op: project, input: components_normed, direction: head}
  - {name: dla_true, op: diff, input: dla_sides}
  - {name: dla, op: scale, input: dla_true, by: -1}
outputs: [dla]
""",
}
EXTRA = """name: score
steps:
  - {name: h, op: capture, site: readout}
  - {name: reward, op: project, input: h, direction: head, bias: true}
  - {name: margin, op: diff, input: reward}
  - {name: margin_share, op: scale, input: margin, by: 7}
outputs: [margin, margin_share]
"""


def observable(text: str, tmp_path: Path) -> ObservableSpec:
    path = tmp_path / "obs.yaml"
    path.write_text(text)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ObservableSpec), OmegaConf.load(path)))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "store.zarr")


def edit_doc(url: str, run_id: str, fn) -> None:
    """Apply ``fn`` to the stored attrs of ``run_id`` in place (what a hand edit of zarr.json does)."""
    path = Path(url) / "runs" / run_id / "zarr.json"
    doc = json.loads(path.read_text())
    fn(doc["attributes"])
    path.write_text(json.dumps(doc, indent=2))


def snapshot(url: str) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(url).rglob("*")) if p.is_file()}


# -- broken instruments ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_dla_fails_calibration(kind, planted, tmp_path):
    obs = observable(BROKEN[kind], tmp_path)
    card = grade(obs, organisms=planted)
    assert not card.passed, card.describe()
    ids = [r for per in card.identities for r in per]
    assert ids and all(r["max_abs_err"] > 1e-2 * r["scale"] for r in ids)     # Σ dla = margin broken
    m = card.magnitude["dla_share"]
    assert abs(m["reading"] - m["truth"]) > 0.1 * abs(m["truth"])               # and the planted magnitude


def test_identity_breaking_run_is_not_calibrated_even_with_a_valid_card(store, tmp_path, dla_card):
    obs = observable(BROKEN["scaled"], tmp_path)
    forged = copy.deepcopy(dla_card)                      # a valid passing card, for the scaled hash
    forged.spec_hash = observable_hash(obs)
    write_card(forged, store)
    rid = execute_run(store, tmp_path, make_run(observable=obs))
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"] == {"dla": "exploratory"} and "identity 'sum of dla = margin' broken" in \
        t["trust_reason"]


def test_ungraded_output_stays_exploratory(store, tmp_path, planted):
    obs = observable(EXTRA, tmp_path)
    card = grade(obs, organisms=planted)
    assert card.passed and card.graded == ["margin"] and card.ungraded == ["margin_share"]
    write_card(card, store)
    rid = execute_run(store, tmp_path, make_run(observable=obs))
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"] == {"margin": "calibrated", "margin_share": "exploratory"}
    assert t["trust"] == "exploratory"                    # the run's level: the lowest over its outputs
    ds = open_store(store).load(rid, "score")
    assert ds["margin"].attrs["trust"] == "calibrated" and ds["margin_share"].attrs["trust"] == "exploratory"


# -- tampered documents --------------------------------------------------------------------------------

def test_edited_run_label_is_caught_on_read(store, tmp_path, dla_card, capsys):
    write_card(dla_card, store)
    rid = execute_run(store, tmp_path, make_run())
    edit_doc(store, rid, lambda a: a.update(trust="registered", trust_by_variable={"dla": "registered",
                                                                                   "dla_heads": "registered"}))
    before = snapshot(store)
    st = open_store(store)
    row = st.runs().set_index("run_id").loc[rid]
    assert row["trust"] == "exploratory" and not row["trust_verified"]
    prov = st.provenance(rid)
    assert prov["trust"] == "exploratory" and prov["trust_stored"] == "registered" and not prov["trust_verified"]
    assert "stored trust 'registered'" in prov["trust_reason"] and prov["trust_by_variable"]["dla"] == "calibrated"
    assert st.load(rid, "dla")["dla"].attrs["trust"] == "calibrated"
    assert store_main(["ls", f"url={store}"]) == 0 and store_main(["show", f"url={store}", f"run={rid}"]) == 0
    out = capsys.readouterr().out
    assert "trust_verified: false" in out and "trust_stored: registered" in out
    assert "1 run(s) with trust_verified=False" in out
    assert list(st.runs(trust_verified="false")["run_id"]) == [rid]
    assert snapshot(store) == before                      # reading changed nothing


def test_edited_hash_covered_field_breaks_the_seal(store, tmp_path, dla_card):
    write_card(dla_card, store)
    rid = execute_run(store, tmp_path, make_run())
    edit_doc(store, rid, lambda a: a.update(model_family="llama", identities=[]))    # drop its identity record
    t = open_store(store).trust(rid)
    assert t["trust"] == "exploratory" and not t["trust_verified"] and "content hash mismatch" in t["trust_reason"]
    assert rid in t["trust_reason"]


def test_compare_shows_derived_trust(store, tmp_path):
    from reward_lens_spec.compare.runs import compare_runs
    a = execute_run(store, tmp_path, make_run(observable="score"))
    b = execute_run(store, tmp_path, make_run("tiny_mistral", observable="score"))
    edit_doc(store, a, lambda d: d.update(trust="registered"))
    edit_doc(store, b, lambda d: d.update(trust="registered"))
    rid, _, _ = compare_runs(store, a, b)
    assert open_store(store).document(rid)["trust"] == "exploratory"
    assert open_store(store).trust(rid)["trust"] == "exploratory"


def test_edited_card_passed_is_caught(store, tmp_path, dla_card):
    failing = copy.deepcopy(dla_card)
    failing.spearman = {"dla_share": 0.5}
    failing.passed = False
    cid = write_card(failing, store)
    edit_doc(store, cid, lambda a: a.update(passed=True))                     # seal broken
    rid = execute_run(store, tmp_path, make_run())
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"]["dla"] == "exploratory" and "content hash mismatch" in t["trust_reason"]
    assert not open_store(store).trust(cid)["trust_verified"]

    def reseal(a):                                  # the forger also recomputes the content hash
        a["passed"] = True
        a["content_hash"] = content_hash(a)
    edit_doc(store, cid, reseal)
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"]["dla"] == "exploratory" and "its readings give False" in t["trust_reason"]
    rid2 = execute_run(store, tmp_path, make_run(limit=3))                   # the next run is not calibrated
    assert open_store(store).document(rid2)["trust_by_variable"]["dla"] == "exploratory"


def test_hole_b_edited_stored_study_is_refused(store, tmp_path, dla_card):
    write_card(dla_card, store)
    rec = studies.freeze(STUDY, store)
    rid = execute_run(store, tmp_path, make_run(experiment=STUDY))
    assert open_store(store).trust(rid)["trust_by_variable"]["dla"] == "registered"

    def move(a):                                    # flip the prediction inside the stored record
        a["study"]["hypotheses"][0]["predictions"][0]["threshold"] = -1e9
    edit_doc(store, rec["run_id"], move)
    before = snapshot(store)
    with pytest.raises(StoreError, match=f"study {rec['run_id']}: content hash mismatch"):
        studies.adjudicate("t_study", store)
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"]["dla"] == "calibrated" and rec["run_id"] in t["trust_reason"]
    assert snapshot(store) == before

    def reseal(a):                                  # and with the seal recomputed: the study hash still differs
        move(a)
        a["content_hash"] = content_hash(a)
    edit_doc(store, rec["run_id"], reseal)
    with pytest.raises(StoreError, match="does not hash to its study_hash"):
        studies.adjudicate("t_study", store)


def test_edited_adjudication_outcome_is_caught(store, tmp_path, dla_card):
    write_card(dla_card, store)
    studies.freeze(STUDY, store)
    execute_run(store, tmp_path, make_run(experiment=STUDY))
    rec = studies.adjudicate("t_study", store)
    flipped = {"confirmed": "refuted", "refuted": "confirmed"}[rec["outcome"]["P1"]]

    def flip(a):
        a["outcome"] = {"P1": flipped}
        a["content_hash"] = content_hash(a)
    edit_doc(store, rec["run_id"], flip)
    t = open_store(store).trust(rec["run_id"])
    assert t["trust"] == "exploratory" and not t["trust_verified"] and "its values give" in t["trust_reason"]
