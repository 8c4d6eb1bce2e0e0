"""The drift card kind (issue 37 item 7): ``calibrate organism=training`` reads a store holding the training
organism's checkpoint sequence and grades the stored drift series against plain forwards of the checkpoints
(``trust.drift_card``, ``trust.drift_criteria``). The honest sequence passes; the series moved one checkpoint, or
its magnitude 5% off, fails."""
from __future__ import annotations

import json
import unittest.mock as um

import numpy as np
import pytest

from reward_lens_spec.compare import drift as drift_mod
from reward_lens_spec.trust import drift_card

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
STEPS = [80, 100, 120, 140]          # around the planted step (100)
_TRUTH: dict = {}
_REAL_TRUTH = drift_card._checkpoint_truth


@pytest.fixture(scope="module")
def sequence(tmp_path_factory):
    """One in-process multirun over four checkpoints on the organism's held-out pairs, into one store."""
    import os

    from reward_lens_spec.cli import main
    from reward_lens_spec.models.training_organism import eval_pairs

    tmp = tmp_path_factory.mktemp("drift_card")
    old = {k: os.environ.get(k) for k in ("REWARD_LENS_SPEC_ORGANISMS",)}
    os.environ["REWARD_LENS_SPEC_ORGANISMS"] = str(tmp_path_factory.getbasetemp() / "rls_organisms")
    data = tmp / "eval.jsonl"
    data.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected,
                                        "dimension": p.dimension}) + "\n" for p in eval_pairs(n=20)))
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        main(["model=tiny_checkpoints", f"model.checkpoints.steps=[{','.join(map(str, STEPS))}]",
              "model.checkpoint=all", "observable=examples/checkpoint_dynamics", "dataset=jsonl",
              f"dataset.path={data}", f"store.url={tmp / 'ck.zarr'}"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    finally:
        os.chdir(cwd)
    yield str(tmp / "ck.zarr")
    for k, v in old.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _memo_truth(steps, pairs):
    key = tuple(steps)
    if key not in _TRUTH:
        _TRUTH[key] = _REAL_TRUTH(steps, pairs)
    return _TRUTH[key]


def grade(url, tamper=None):
    real = drift_card.drift          # the name grade_drift calls (compare.drift.drift, bound at import)

    def fake(*a, **kw):
        rid, ds, w = real(*a, **kw)
        return rid, (tamper(ds.copy(deep=True)) if tamper else ds), w
    with um.patch.object(drift_card, "_checkpoint_truth", _memo_truth), um.patch.object(drift_card, "drift", fake):
        return drift_card.grade_drift(url)


def test_honest_sequence_reads_calibrated_and_locates_the_planted_step(sequence, capsys):
    card = grade(sequence)
    assert card.passed, card.describe()
    assert card.truth["planted_interval"] == "step100 -> step120"
    assert card.floors["drift_step"]["value"] == 1.0
    assert card.floors["drift_margin"]["value"] > 0.9999 and card.floors["drift_similarity"]["value"] > 0.9999
    assert {"mean_margin", "accuracy", "cka", "procrustes_residual", "margin_spearman"} <= set(card.graded)
    assert set(card.graded) | set(card.ungraded) <= set(drift_mod.VARIABLES)       # coverage sees every one
    assert set(card.why_not) == set(card.ungraded) and "not graded: w_r_cosine: " in card.describe()
    # the reading is the stored series, not the largest_change attr: the jump ending at 120 is the largest
    jumps = card.readings["drift_step"]
    assert int(np.argmax(jumps)) == STEPS.index(120)
    # through the command: the card goes into the sequence's own store, exit 0
    from reward_lens_spec.trust.cli import calibrate_main
    with um.patch.object(drift_card, "_checkpoint_truth", _memo_truth):
        assert calibrate_main(["organism=training", f"store.url={sequence}"]) == 0
    out = capsys.readouterr().out
    assert "=> PASS" in out and "card: scorecard-drift-" in out


def _roll(ds):
    """Every per-checkpoint series moved one checkpoint later (the first takes the last's values)."""
    return ds.assign({v: ds[v].roll(checkpoint=1, roll_coords=False) for v in ds.data_vars})


def test_the_step_moved_one_checkpoint_fails(sequence):
    card = grade(sequence, _roll)
    assert not card.passed
    assert not card.criteria_passed["drift_step"] and not card.criteria_passed["drift_margin"], card.describe()


@pytest.mark.parametrize("var, crit", [("mean_margin", "drift_margin"), ("accuracy", "drift_margin"),
                                       ("cka", "drift_similarity"), ("procrustes_residual", "drift_similarity"),
                                       ("margin_spearman", "drift_similarity")])
def test_a_series_five_percent_off_fails(sequence, var, crit):
    card = grade(sequence, lambda ds: ds.assign({var: 1.05 * ds[var]}))
    assert not card.passed and not card.criteria_passed[crit], card.describe()
    if var == "mean_margin":
        assert card.criteria_passed["drift_step"]          # the step is still located: only the magnitude is off


@pytest.mark.parametrize("how", ["missing_checkpoint", "all_nan", "no_variable"])
def test_a_drift_reading_that_does_not_fit_gives_a_failing_card_with_its_reason(sequence, how):
    tamper = {"missing_checkpoint": lambda ds: ds.isel(checkpoint=slice(0, 2)),
              "all_nan": lambda ds: ds.assign({v: ds[v] * np.nan for v in ds.data_vars}),
              "no_variable": lambda ds: ds.drop_vars(["cka", "mean_margin"])}[how]
    card = grade(sequence, tamper)
    text = card.describe()
    assert not card.passed and "=> FAIL" in text and card.reading_errors, text
