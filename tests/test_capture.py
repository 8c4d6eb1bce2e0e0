"""Runtime invariants on a tiny random model of every family (float32)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from reward_lens_spec.data import Pair
from reward_lens_spec.errors import CaptureError
from reward_lens_spec.engine.capture import capture
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.models.head import read_head
from tests.conftest import make_pairs, tiny_lm

SITES = ("embed", "resid_post", "attn_out", "mlp_out")


def test_scores_invariant_to_batch_size_and_padding_side(family_lm, encoded_for):
    enc = encoded_for(family_lm)
    ref = capture(family_lm, enc, (), batch_size=1)
    for bs in (2, 3, 10):
        for side in ("left", "right"):
            got = capture(family_lm, enc, (), batch_size=bs, padding_side=side)
            np.testing.assert_allclose(got.logits, ref.logits, atol=1e-5, rtol=0)
            np.testing.assert_allclose(got.h, ref.h, atol=1e-5, rtol=0)


def test_components_sum_to_last_residual(family_lm, encoded_for):
    cap = capture(family_lm, encoded_for(family_lm), SITES, batch_size=4)
    s = cap.sites
    recon = s["embed"][:, :, 0] + s["attn_out"].sum(2) + s["mlp_out"].sum(2)
    last = s["resid_post"][:, :, -1]
    np.testing.assert_allclose(recon, last, atol=1e-5 * (1 + np.abs(last).max()))


def test_captured_head_reproduces_model_logits(family_lm, encoded_for):
    cap = capture(family_lm, encoded_for(family_lm), (), batch_size=4)
    np.testing.assert_allclose(family_lm.head.rewards(cap.h), cap.logits, atol=1e-5)


def test_self_check_fires_on_wrong_head():
    lm = tiny_lm("tiny")
    enc = encode_pairs(lm.tokenizer, make_pairs(3))
    lm.head.W[0, 0] += 1.0          # the read-off copy no longer matches the model's own head
    with pytest.raises(CaptureError, match="self-check"):
        capture(lm, enc, (), batch_size=2)


def test_self_check_fires_on_wrong_readout_position():
    lm = tiny_lm("tiny")
    enc = encode_pairs(lm.tokenizer, make_pairs(3))

    def off_by_one(mask):
        T = mask.shape[1]
        return torch.full((mask.shape[0],), T - 2, dtype=torch.long)
    with pytest.raises(CaptureError, match="self-check"):
        capture(lm, enc, (), batch_size=3, readout_fn=off_by_one)


def test_pad_equal_to_eos_with_eos_inside_prompt():
    lm = tiny_lm("tiny", pad_token="</s>")
    assert lm.tokenizer.pad_token_id == lm.tokenizer.eos_token_id
    ps = [Pair(id="a", prompt="Stop here</s> and go on", chosen="yes", rejected="no thanks"),
          Pair(id="b", prompt="short", chosen="a much longer chosen answer here", rejected="n")]
    enc = encode_pairs(lm.tokenizer, ps)
    assert lm.tokenizer.eos_token_id in enc.chosen[0]         # EOS really sits inside the prompt
    single = capture(lm, enc, (), batch_size=1)
    batched = capture(lm, enc, (), batch_size=4)
    np.testing.assert_allclose(batched.logits, single.logits, atol=1e-5)


def test_tokenizer_without_pad_token_batches():
    lm = tiny_lm("tiny", pad_token=None)
    assert lm.tokenizer.pad_token_id is None
    enc = encode_pairs(lm.tokenizer, make_pairs(4))
    np.testing.assert_allclose(capture(lm, enc, (), batch_size=8).logits,
                               capture(lm, enc, (), batch_size=1).logits, atol=1e-5)


def test_float16_overflow_is_an_error_not_a_nan():
    lm = tiny_lm("tiny", dtype="float16")
    with torch.no_grad():
        lm.model.score.weight.mul_(1e6)           # rewards far beyond float16's range
    lm = dataclasses.replace(lm, head=read_head(lm.model, lm.family))      # re-read the scaled head
    enc = encode_pairs(lm.tokenizer, make_pairs(2))
    with pytest.raises(CaptureError, match="non-finite"):
        capture(lm, enc, (), batch_size=2)


def test_only_needed_positions_are_kept(encoded_for):
    lm = tiny_lm("tiny")
    cap = capture(lm, encoded_for(lm), ("resid_post",), batch_size=4)
    assert cap.sites["resid_post"].shape == (5, 2, lm.n_layers, lm.d_model)
    assert cap.counts["forward_passes"] == 3          # 10 sequences, batches of 4


def test_identical_sides_run_once_and_give_exactly_zero_margin():
    lm = tiny_lm("tiny")
    ps = make_pairs(3) + [Pair(id="same", prompt="Say hi", chosen="hi there", rejected="hi there")]
    enc = encode_pairs(lm.tokenizer, ps)
    for bs in (1, 3, 8):
        cap = capture(lm, enc, ("resid_post",), batch_size=bs)
        assert cap.logits[3, 0, 0] - cap.logits[3, 1, 0] == 0.0
        np.testing.assert_array_equal(cap.sites["resid_post"][3, 0], cap.sites["resid_post"][3, 1])
    assert capture(lm, enc, (), batch_size=1).counts["forward_passes"] == 7     # 8 sides, 7 distinct
