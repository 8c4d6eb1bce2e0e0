"""Adjudication pins what it scored (issue 26 item 3): the digests of every array it read, re-verified
whenever the record is read. Editing a run's array (before or after adjudicating), with or without
forging the run's digests and seal, never leaves an ``adjudicated`` record standing.

The study predicts ``mean(margin) > 1e6`` on ``observable=score`` (tiny_llama): refuted on the real
numbers; an edit that multiplies the stored margins by 1e9 would make it "confirmed".
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr

from reward_lens_spec.errors import SpecError, StoreError
from reward_lens_spec.store import open_store
from reward_lens_spec.store.digest import KEY, result_digests
from reward_lens_spec.trust import studies
from reward_lens_spec.trust.evidence import content_hash
from reward_lens_spec.trust.scorecard import write_card

from test_evidence_log import card, edit_doc
from test_trust import execute_run, make_run

pytestmark = pytest.mark.usefixtures("one_thread")

STUDY = {"name": "pin_study", "version": 1,
         "design": {"observable": {"name": "score"}, "model": {"name": "tiny_llama"},
                    "dataset": {"name": "diagnostic", "limit": 4}},
         "hypotheses": [{"id": "H1", "statement": "huge margins.", "predictions": [
             {"id": "P1", "metric": {"variable": "margin", "reduce": "mean"}, "comparator": ">",
              "threshold": 1e6}]}]}


@pytest.fixture(scope="module")
def _ran(tmp_path_factory, one_thread):
    tmp = tmp_path_factory.mktemp("pins")
    store = str(tmp / "store.zarr")
    write_card(card(True, "a"), store)
    studies.freeze(STUDY, store, base_dir=str(tmp))
    rid = execute_run(store, tmp, make_run(observable="score", experiment=STUDY))
    assert open_store(store).trust(rid)["trust_by_variable"]["margin"] == "registered"
    return store, rid


@pytest.fixture
def ran(_ran, tmp_path):
    src, rid = _ran
    store = str(tmp_path / "store.zarr")
    shutil.copytree(src, store)
    return store, rid


def inflate_margin(store, rid) -> None:
    """Multiply the stored margins by 1e9 in place (decoded, edited, re-encoded: valid chunk checksums)."""
    a = zarr.open_array(store=zarr.storage.LocalStore(store), path=f"runs/{rid}/score/margin", mode="r+")
    a[...] = np.asarray(a[...]) * 1e9


def forge_digests(store, rid) -> None:
    """The forger also rewrites the run's sealed digests to the edited data and reseals the run."""
    from reward_lens_spec.store.published import open_published
    new = result_digests(open_published(zarr.storage.LocalStore(store), f"runs/{rid}/score", lazy=False))

    def fn(d):
        d[KEY] = {"score": new}
        d["content_hash"] = content_hash(d)
    edit_doc(store, rid, fn)


def test_adjudication_pins_the_digests_it_read(ran):
    store, rid = ran
    rec = studies.adjudicate("pin_study", store)
    assert rec["outcome"] == {"P1": "refuted"} and rec["trust"] == "adjudicated"
    assert rec["scored"] == {rid: open_store(store).document(rid)[KEY]}
    t = open_store(store).trust(rec["run_id"])
    assert t["trust"] == "adjudicated" and t["trust_verified"], t


def test_array_edited_before_adjudicating(ran):
    store, rid = ran
    inflate_margin(store, rid)
    with pytest.raises(StoreError, match=f"run {rid} observable score"):     # the digest check on read
        studies.adjudicate("pin_study", store)
    forge_digests(store, rid)                         # digests and seal forged: the run is not in the log
    with pytest.raises(SpecError, match="no run of study"):
        studies.adjudicate("pin_study", store)


@pytest.mark.parametrize("forge", [False, True])
def test_array_edited_after_adjudicating_voids_the_record(ran, forge):
    store, rid = ran
    rec = studies.adjudicate("pin_study", store)
    inflate_margin(store, rid)
    if forge:
        forge_digests(store, rid)
    for t in (open_store(store).trust(rec["run_id"]), open_store(store).provenance(rec["run_id"]),
              open_store(store).runs().set_index("run_id").loc[rec["run_id"]]):
        assert t["trust"] == "exploratory" and not t["trust_verified"]
    why = open_store(store).trust(rec["run_id"])["trust_reason"]
    assert ("data of run" in why or "not in the store's evidence log" in why) if forge else \
        ("adjudication void" in why and rid in why), why


def test_edited_pins_void_the_record(ran):
    store, rid = ran
    rec = studies.adjudicate("pin_study", store)

    def drop(d):                                       # the record no longer pins what it read, resealed
        d.pop("scored")
        d["content_hash"] = content_hash(d)
    edit_doc(store, rec["run_id"], drop)
    t = open_store(store).trust(rec["run_id"])
    assert t["trust"] == "exploratory" and not t["trust_verified"] and "void" in t["trust_reason"]
