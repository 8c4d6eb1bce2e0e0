"""Nothing that orders or decides lies outside a seal (issue 26 item 2).

Cards, studies, adjudications and runs are ordered by the store's append-only, hash-chained evidence
log (``store.log``), not by the editable ``created`` field; ``created`` and ``seq`` are sealed. The
tamper matrix edits the stored files by hand, as a user with write access could. The scorecards here
are documents written through the real writer (``write_card``) with readings that pass or fail this
package's thresholds; the run they grade is a real run of ``observable=score`` on tiny_llama.
"""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from reward_lens_spec.identity import observable_hash
from reward_lens_spec.store import open_store
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.log import append, entry_hash, read_log
from reward_lens_spec.trust import studies
from reward_lens_spec.trust.evidence import code_hash, content_hash, seal
from reward_lens_spec.trust.scorecard import Scorecard, write_card

from test_trust import execute_run, make_run

pytestmark = pytest.mark.usefixtures("one_thread")


def card(passing: bool, tag: str) -> Scorecard:
    """A scorecard of ``observable=score`` on the llama family; ``tag`` makes its run id its own."""
    run = make_run(observable="score")
    rho = 1.0 if passing else 0.5
    return Scorecard(observable="score", spec_hash=observable_hash(run.observable), version=1,
                     model_family="llama", organism="trained_keyword", base="tiny_llama", strengths=[0.0, 0.5, 1.0],
                     readings={"score": [0.1, 0.5, 0.95]}, spearman={"score": rho},
                     floors={"score": {"value": 0.95, "what": "accuracy at full strength"}},
                     criteria_passed={"score": passing}, passed=passing, graded=["margin"],
                     organism_checksum=tag, code_hash=code_hash())


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "store.zarr")


def doc_path(url, rid) -> Path:
    return Path(url) / "runs" / rid / "zarr.json"


def edit_doc(url, rid, fn) -> None:
    p = doc_path(url, rid)
    d = json.loads(p.read_text())
    fn(d["attributes"])
    p.write_text(json.dumps(d, indent=2))


def entries(url) -> list[Path]:
    return sorted((Path(url) / "_internal" / "log").glob("*.json"))


def margin_trust(url, rid) -> dict:
    t = open_store(url).trust(rid)
    return {"level": t["trust_by_variable"]["margin"], "verified": t["trust_verified"], "why": t["trust_reason"]}


@pytest.fixture(scope="module")
def _calibrated(tmp_path_factory, one_thread):
    tmp = tmp_path_factory.mktemp("calibrated")
    store = str(tmp / "store.zarr")
    a = write_card(card(True, "a"), store)
    rid = execute_run(store, tmp, make_run(observable="score"))
    assert margin_trust(store, rid)["level"] == "calibrated"
    b = write_card(card(False, "b"), store)
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and f"latest scorecard {b} fails" in t["why"]
    return store, a, rid, b


@pytest.fixture
def calibrated(_calibrated, tmp_path):
    """A passing card A, a run R it calibrates, then a later failing card B: R is no longer calibrated
    (a fresh copy of the store per test)."""
    src, a, rid, b = _calibrated
    store = str(tmp_path / "store.zarr")
    shutil.copytree(src, store)
    return store, a, rid, b


def test_every_document_is_logged_with_sealed_created_and_seq(calibrated):
    store, a, rid, b = calibrated
    log = read_log(Backend(store))
    assert log.error is None and [e["id"] for e in log.entries] == [a, rid, b]
    for seq, e in enumerate(log.entries):
        d = open_store(store).document(e["id"])
        assert d["seq"] == seq == e["seq"] and e["doc"] == d["content_hash"] == content_hash(d)
        assert e["prev"] == (log.entries[seq - 1]["hash"] if seq else "") and e["hash"] == entry_hash(e)
        assert "created" in d and content_hash({**d, "created": "2000-01-01T00:00:00+00:00"}) != d["content_hash"]


def test_backdated_failing_card_does_not_bring_back_the_passing_one(calibrated):
    store, a, rid, b = calibrated
    edit_doc(store, b, lambda d: d.update(created="2000-01-01T00:00:00.000+00:00"))     # created is sealed
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and "content hash mismatch" in t["why"] and b in t["why"]

    def reseal(d):                      # the forger recomputes the seal: the log still orders the card last
        d["created"] = "2000-01-01T00:00:00.000+00:00"
        d["content_hash"] = content_hash(d)
    edit_doc(store, b, reseal)
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and "not in the store's evidence log" in t["why"]


@pytest.mark.parametrize("how", ["remove_last", "remove_middle", "swap", "edit", "edit_rehash", "no_log"])
def test_tampered_log_is_caught_on_read(calibrated, how):
    store, a, rid, b = calibrated
    files = entries(store)
    if how == "remove_last":             # drop the failing card's entry: it is then in no log, not forgotten
        files[2].unlink()
    elif how == "remove_middle":
        files[1].unlink()
    elif how == "swap":                  # the failing card's entry moved before the passing card's
        x, y = files[0].read_bytes(), files[2].read_bytes()
        files[0].write_bytes(y)
        files[2].write_bytes(x)
    elif how in ("edit", "edit_rehash"):
        e = json.loads(files[2].read_text())
        e["id"] = a                      # the last entry now claims to log the passing card again
        if how == "edit_rehash":
            e["hash"] = entry_hash(e)
        files[2].write_text(json.dumps(e))
    elif how == "no_log":
        for f in files:
            f.unlink()
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory", t
    if how in ("remove_middle", "swap", "no_log"):          # the run itself is no longer ordered
        assert not t["verified"] and "not in the store's evidence log" in t["why"]
    log = read_log(Backend(store))
    if how in ("remove_middle", "swap", "edit"):
        assert log.error, how
    assert open_store(store).runs().set_index("run_id").loc[rid, "trust"] == "exploratory"


def test_concurrent_appenders_neither_fork_nor_lose_entries(tmp_path):
    from reward_lens_spec.store.layout import check_layout

    b = Backend(str(tmp_path / "s.zarr"))
    check_layout(b, create=True)
    got, errors = {}, []

    def worker(w):
        try:
            for i in range(8):
                rid = f"w{w}-{i}"
                got[rid] = append(Backend(b.url), rid, seal({"kind": "run", "created": "now", "w": w, "i": i}))
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    log = read_log(b)
    assert log.error is None and len(log.entries) == 48 == len({e["id"] for e in log.entries})
    for rid, doc in got.items():         # every appender's document is ordered at the seq sealed in it
        assert log.order(rid, content_hash(doc), doc["seq"]) == (doc["seq"], "")


SCORE_STUDY = {"name": "log_study", "version": 1,
               "design": {"observable": {"name": "score"}, "model": {"name": "tiny_llama"},
                          "dataset": {"name": "diagnostic", "limit": 4}},
               "hypotheses": [{"id": "H1", "statement": "chosen wins.", "predictions": [
                   {"id": "P1", "metric": {"variable": "margin", "reduce": "mean"}, "comparator": ">",
                    "threshold": -1e6}]}]}


def test_registration_and_adjudication_follow_the_log_not_the_clock(store, tmp_path):
    write_card(card(True, "a"), store)
    rec = studies.freeze(SCORE_STUDY, store, base_dir=str(tmp_path))
    rid = execute_run(store, tmp_path, make_run(observable="score", experiment=SCORE_STUDY))
    assert margin_trust(store, rid)["level"] == "registered"

    def backdate(d):                     # the run claims to predate the study, resealed
        d["created"] = "2000-01-01T00:00:00.000+00:00"
        d["content_hash"] = content_hash(d)
    edit_doc(store, rid, backdate)
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and not t["verified"] and "evidence log" in t["why"]
    with pytest.raises(Exception, match="no run of study"):     # adjudicate picks runs by log order only
        studies.adjudicate("log_study", store)
    assert rec["seq"] < open_store(store).document(rid)["seq"]
