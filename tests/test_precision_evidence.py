"""Issue 40 item 2: precision is part of the evidence.

A scorecard records the dtype its organisms were graded in; a card lifts only runs computed in that dtype, so a
float32 card does not calibrate a bfloat16 run (and the reason says so). A card that claims another dtype than
the one its own identity records were computed in fails. bf16 / fp16 runs carry their numerics in identity
(dtype, and the device type that executes them).
"""
from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from reward_lens_spec.run.identity import numerics
from reward_lens_spec.spec import DType, ModelSpec
from reward_lens_spec.store import open_store
from reward_lens_spec.trust.evidence import card_verdict
from reward_lens_spec.trust.scorecard import card_run_id, write_card

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(url, tmp_path, *extra):
    from reward_lens_spec.run import execute
    from reward_lens_spec.run.compose import compose_run
    run, _ = compose_run(["model=tiny_llama", "observable=dla", "dataset.limit=3", *extra])
    return execute(run, resolved_yaml=OmegaConf.to_yaml(OmegaConf.structured(run)), base_dir=str(tmp_path),
                   store_url=url, progress=False).run_id


def test_a_float32_card_does_not_lift_a_bfloat16_run(tmp_path, dla_card):
    url = str(tmp_path / "s.zarr")
    assert dla_card.dtype == "float32" and dla_card.passed
    write_card(dla_card, url)
    f32 = _run(url, tmp_path)
    bf16 = _run(url, tmp_path, "model.dtype=bfloat16")
    st = open_store(url)
    assert st.trust(f32)["trust_by_variable"]["dla"] == "calibrated"          # the control: same card, same code
    t = st.trust(bf16)
    assert t["trust_by_variable"]["dla"] == "exploratory" and t["trust"] == "exploratory"
    assert "in bfloat16" in t["trust_reason"] and "cards calibrated in float32 do not lift a bfloat16 run" in \
        t["trust_reason"], t["trust_reason"]
    assert st.provenance(bf16)["dtype"] == "bfloat16" and bf16 != f32


def test_a_card_that_claims_another_dtype_than_it_was_graded_in_fails(tmp_path, dla_card):
    forged = copy.deepcopy(dla_card)
    forged.dtype = "bfloat16"                  # graded in float32 (its identity records say so), relabelled
    ok, why = card_verdict(vars(forged))
    assert not ok and why == "the card says dtype bfloat16 but its identities were computed in float32"
    url = str(tmp_path / "s.zarr")
    forged.passed = True                       # as a forger would store it: sealed, "passing"
    write_card(forged, url)
    t = open_store(url).trust(_run(url, tmp_path, "model.dtype=bfloat16"))
    assert t["trust_by_variable"]["dla"] == "exploratory"
    assert "its identities were computed in float32" in t["trust_reason"], t["trust_reason"]
    assert card_run_id(forged) != card_run_id(dla_card)        # another dtype is another card, not a replacement


def test_reduced_precision_numerics_are_in_identity_float32_unchanged():
    f32 = numerics(ModelSpec())
    assert "execution" not in f32 and f32["dtype"] == "float32"          # float32 run ids as before
    for dt in ("bfloat16", "float16"):
        n = numerics(ModelSpec(dtype=DType(dt)))
        assert n["dtype"] == dt and n["execution"] == "cpu"
        assert n != numerics(ModelSpec(dtype=DType("bfloat16" if dt == "float16" else "float16")))
    # where weights live is provenance, not numerics
    assert numerics(ModelSpec(dtype=DType.bfloat16, device_map="auto", max_memory={"cpu": "1GB"})) == \
        numerics(ModelSpec(dtype=DType.bfloat16))
