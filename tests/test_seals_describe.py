"""Seals that cover what they describe (issue 36, finding 3 and Deliver 4): ``store verify recompute=K``
re-derives a run's descriptive fields (dataset name and checksum, ``effective_n`` incl. ``n_scored``,
``data_flags``, the excluded and flagged pair ids) from its data file and tokenizer, so an edit a writer
re-seals by hand (content hash and log chain rewritten: every integrity check passes) is caught."""
from __future__ import annotations

import pytest

pytest.importorskip("cryptography", reason="the shared fixtures sign (extra `sign`)")

from reward_lens_spec.store import open_store  # noqa: E402
from reward_lens_spec.store.catalog_cli import main as store_main  # noqa: E402
from reward_lens_spec.store.verify import verify_lines  # noqa: E402
from reward_lens_spec.trust.evidence import content_hash  # noqa: E402

from test_evidence_log import margin_trust  # noqa: E402
from test_signatures import _unsigned, copy  # noqa: E402,F401
from test_trust_root import rechain  # noqa: E402
from test_trust_tamper import edit_doc  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

EDITS = {
    "dataset": lambda d: d.update(dataset="a_cleaner_dataset"),
    "n_scored": lambda d: d["effective_n"].update(n_scored=d["effective_n"]["n_scored"] + 1),
    "excluded": lambda d: d["excluded"].update(prompt_mismatch=[]) if d["excluded"].get("prompt_mismatch")
    else d["excluded"].update(prompt_mismatch=["p-that-was-never-left-out"]),
    "pair_flags": lambda d: d["pair_flags"].update(identical_sides=["p-flagged-by-hand"]),
}
SAYS = {"dataset": "dataset: stored a_cleaner_dataset, re-derived", "n_scored": "effective_n.n_scored: stored",
        "excluded": "excluded.prompt_mismatch: stored", "pair_flags": "pair_flags.identical_sides: stored"}


def reseal(store, rid, edit) -> None:
    def fn(d):
        edit(d)
        d["content_hash"] = content_hash(d)
    edit_doc(store, rid, fn)
    rechain(store, rid)


@pytest.mark.slow
@pytest.mark.parametrize("field", sorted(EDITS))
def test_recompute_rederives_descriptive_fields_and_catches_a_resealed_edit(_unsigned, tmp_path, field, capsys):
    store, rid = copy(_unsigned, tmp_path)
    lines, ok = verify_lines(open_store(store), rid, recompute=2, base_dir=str(tmp_path))
    assert ok and any("recompute  ok  descriptive fields agree; recomputed 2 pair(s)" in ln for ln in lines), lines
    reseal(store, rid, EDITS[field])
    assert open_store(store).verify(rid)["ok"] and margin_trust(store, rid)["level"] == "calibrated"  # fooled
    lines, ok = verify_lines(open_store(store), rid, recompute=2, base_dir=str(tmp_path))
    rec = [ln for ln in lines if "recompute" in ln]
    assert not ok and rec and "recompute  FAILED  descriptive fields MISMATCH: " in rec[0] and SAYS[field] in rec[0], \
        lines
    assert "margin max|Δ|" in rec[0] and "margin max|Δ| 0 >" not in rec[0]        # the numbers themselves agree
    assert store_main(["verify", f"url={store}", f"run={rid}", "recompute=2"]) == 1
