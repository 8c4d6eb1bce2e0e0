"""RewardBench 2's Ties subset scored with the official formula (issue 41 item 5; reward-bench
``process_single_model``, PRs #244/#255), checked on an example worked by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from reward_lens_spec.errors import SpecError
from reward_lens_spec.ops.rewardbench_ties import TERMS, item_stats, split_id, ties_bounds, ties_terms

# (id, correct rewards, wrong rewards)
ITEMS = [
    ("ref:1", [3.0], [1.0, 2.5]),            # gap 0.5, accurate
    ("tied:1", [3.0, 2.8, 2.0], [1.5, 0.5]),  # gap 0.5, spread 1.0, accurate
    ("ref:2", [1.0], [2.0]),                  # gap -1, wrong
    ("tied:2", [4.0, 3.9], [1.0]),            # gap 2.9, spread 0.1
    ("ref:3", [2.0], [2.0]),                  # gap 0: an exact tie is not accurate; no tied partner
    ("tied:4", [1.0, 1.0], [0.0]),            # no ref partner: counts in tied accuracy only
    ("ref:5", [2.0], [1.0]),                  # gap 1
    ("tied:5", [3.0, 3.0], [0.0]),            # gap 3, spread 0: 1/0 = inf, tanh = 1
    ("ref:6", [1.0], [1.0]),                  # gap 0
    ("tied:6", [2.0, 2.0], [2.0]),            # gap 0, spread 0: 0/0, counted 0
]


def _stats():
    return [(*split_id(i), *item_stats(c, w)) for i, c, w in ITEMS]


def test_ties_score_matches_the_hand_worked_example():
    ref_acc = 2 / 5                                   # ref:1 and ref:5 of five ref items
    tied_acc = 4 / 5                                  # all tied items but tied:6 (gap 0)
    preferred = 2 / 4                                 # shared prompts 1, 2, 5, 6: 2.9 > 0.1 and 3 > 0
    hard = 1 / 4                                      # min(gap_ref, gap_tied) > spread only for prompt 5
    margin = (math.tanh(0.5 / 1.0 - 1) + math.tanh(-1 / 0.1 - 1) + 1.0 + 0.0) / 4
    score = 0.30 * tied_acc + 0.30 * ref_acc + 0.20 * preferred + 0.20 * hard + 0.01 * margin
    assert score == pytest.approx(0.5088447071, abs=1e-9)
    got = dict(zip(TERMS, ties_terms(_stats())))
    want = {"tied_accuracy": tied_acc, "ref_accuracy": ref_acc, "correctness_preferred": preferred,
            "correctness_preferred_hard": hard, "correctness_margin_score": margin, "ties_score": score}
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k


def test_bootstrap_brackets_the_score_is_seeded_and_keeps_a_prompts_items_together():
    b1, b2 = ties_bounds(_stats(), 300, 4), ties_bounds(_stats(), 300, 4)
    np.testing.assert_array_equal(b1, b2)
    assert b1[-1, 0] == pytest.approx(0.5088447071, abs=1e-9)
    assert b1[-1, 1] <= b1[-1, 0] <= b1[-1, 2]
    assert not np.array_equal(b1, ties_bounds(_stats(), 300, 5))


def test_terms_with_nothing_to_average_are_nan_not_zero():
    only_ref = [(*split_id("ref:1"), *item_stats([1.0], [0.0]))]
    t = dict(zip(TERMS, ties_terms(only_ref)))
    assert t["ref_accuracy"] == 1.0 and math.isnan(t["tied_accuracy"]) and math.isnan(t["ties_score"])


@pytest.mark.parametrize("bad", ["it4", "tie:3", "ref:", "ref"])
def test_an_id_not_in_the_official_shape_is_refused_in_one_line(bad):
    with pytest.raises(SpecError, match=r"is not 'ref:<k>' or 'tied:<k>'") as exc:
        split_id(bad)
    assert "\n" not in str(exc.value)


def test_a_tied_item_with_one_correct_answer_is_refused():
    with pytest.raises(SpecError, match="'tied:2' has one correct answer"):
        ties_bounds([(*split_id("tied:2"), *item_stats([1.0], [0.0]))], 10, 0)
