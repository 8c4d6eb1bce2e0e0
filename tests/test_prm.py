"""Process reward models (issue 28 item 2): the head at every step boundary, steps found in the tokens; a tiny
PRM organism with a planted bad step that the per-step instrument must locate; a plain forward as reference."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.prm import aggregate, boundaries
from reward_lens_spec.models.prm_organism import TEMPLATE, located_steps, prm_organism
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.base import PlanInfo
from reward_lens_spec.registry import build_plan
from reward_lens_spec.run import compose_run, compute, execute
from reward_lens_spec.run.inputs import load_inputs


def _compute(lm, pairs, observable):
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=("reward",))
    plan = build_plan(load_observable(observable), info, load_observable)
    res, _, enc = compute(lm, pairs, plan, info, template=TEMPLATE)
    return res, enc


@pytest.fixture(scope="module")
def organism():
    org = prm_organism(1.0)
    res, enc = _compute(org.lm, org.pairs, "prm_steps")
    return org, res, enc


def test_boundaries_are_found_in_token_ids():
    ids = [1, 9, 7, 7, 5, 7, 7, 7, 3, 7]
    assert boundaries(ids, (7, 7), 0) == [3, 6]            # non-overlapping, left to right
    assert boundaries(ids, (7, 7), 4) == [6]               # only from the response start on
    assert boundaries(ids, (7,), 8) == [9]
    assert boundaries([1, 2, 3], (7,), 1) == [2]           # no delimiter: the whole response is one step


@torch.no_grad()
def test_step_rewards_match_a_plain_forward(organism):
    """Head on the final-norm output at each "\\n" after the solution starts, from one unpadded forward."""
    org, res, enc = organism
    model, tok = org.lm.model, org.lm.tokenizer
    w = model.score.weight.double()
    for i, pid in enumerate(enc.pair_ids):
        pair = next(p for p in org.pairs.pairs if p.id == pid)
        for s, text in enumerate((pair.chosen, pair.rejected)):
            full = f"Problem: {pair.prompt}\nSolution:\n{text}"
            ids = tok(full)["input_ids"]
            start = len(tok(f"Problem: {pair.prompt}\nSolution:\n")["input_ids"])
            nl = tok("\n", add_special_tokens=False)["input_ids"][0]
            pos = [t for t in range(start, len(ids)) if ids[t] == nl]
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0].double()   # after the final norm
            ref = (h[pos] @ w.T)[:, 0].numpy()
            got = res["step_reward"].values[i, s, :len(pos)]
            np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)
    # the readout (last) step is the run's reward/margin
    last = res["step_margin"].values[np.arange(len(enc.pair_ids)), res["step_reward"]["n_steps"].values[:, 0] - 1]
    np.testing.assert_allclose(last, res["margin"].values, atol=1e-5)


def test_the_planted_bad_step_is_located(organism):
    org, res, enc = organism
    truth = [org.truth["bad_step"][p] for p in enc.pair_ids]
    assert len(set(truth)) > 1                                       # the planted step varies over pairs
    assert located_steps(res["step_reward"].values).tolist() == truth
    # with nothing planted the same reading does not find them (the construction is what it finds)
    org0 = prm_organism(0.0)
    res0, enc0 = _compute(org0.lm, org0.pairs, "prm_steps")
    assert located_steps(res0["step_reward"].values).tolist() != truth


def test_aggregates_are_the_recorded_ones(organism):
    org, res, _ = organism
    steps = res["step_reward"].values
    p = 1 / (1 + np.exp(-steps))
    expect = {"last": p[..., -1], "min": p.min(-1), "prod": p.prod(-1)}       # every side has all its steps
    assert res["aggregate"].attrs["aggregate"] == "last"
    np.testing.assert_allclose(res["aggregate"].values, expect["last"], rtol=1e-6)
    for how in ("min", "prod"):
        np.testing.assert_allclose(aggregate(steps, how), expect[how], rtol=1e-12)
    ragged = np.array([[0.0, 1.0, np.nan]])
    np.testing.assert_allclose(aggregate(ragged, "last"), [1 / (1 + np.exp(-1.0))])


@pytest.mark.parametrize("step", [0, 2])
def test_every_instrument_reads_any_step(organism, step):
    """model.prm.step=k cuts each side after step k's boundary: the margin there is step_margin[k] and the
    direct linear attribution sums to it exactly."""
    org, res, _ = organism
    lm = replace(org.lm, signal=replace(org.lm.signal, step=step))
    got, enc = _compute(lm, org.pairs, "dla")
    margin, _ = _compute(lm, org.pairs, "margin")
    np.testing.assert_allclose(margin["margin"].values, res["step_margin"].values[:, step], atol=1e-5)
    dla = got["dla"]
    np.testing.assert_allclose(dla.sum([d for d in dla.dims if d != "pair"]).values, margin["margin"].values,
                               atol=1e-5)


def test_a_step_that_does_not_exist_is_refused(organism):
    org = organism[0]
    lm = replace(org.lm, signal=replace(org.lm.signal, step=7))
    with pytest.raises(SpecError, match=r"model.prm.step: step 7 does not exist .*Fix:"):
        _compute(lm, org.pairs, "margin")


@pytest.mark.parametrize("override, message", [
    ("model.prm.aggregate=mni", "model.prm.aggregate: unknown aggregate 'mni'. Did you mean 'min'"),
    ("model.kind=pmr", "model.kind: unknown kind of reward signal 'pmr'. Did you mean 'prm'"),
    ("model.prm.tokens=[+]", "model.prm.tokens: needs two distinct"),
])
def test_bad_prm_settings_are_refused_before_loading(override, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compose_run(["model=tiny_prm", override])


def test_verdict_tokens_of_a_prm_must_be_single_tokens():
    run, _ = compose_run(["model=tiny_prm", "model.prm.tokens=['++','-']", "dataset.limit=2"])
    with pytest.raises(SpecError, match=r"model.prm.tokens: '\+\+' is 2 tokens"):
        load_inputs(run)


@pytest.mark.parametrize("extra, observable", [([], "prm_steps"), (["model.prm.tokens=[+,-]"], "prm_steps"),
                                               (["model.prm.step=0"], "dla")])
def test_prm_configs_run_through_the_executor(extra, observable, tmp_path):
    run, yaml_text = compose_run(["model=tiny_prm", f"observable={observable}", "dataset.limit=4", *extra])
    out = execute(run, resolved_yaml=yaml_text, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                  progress=False)
    assert out.status == "complete"
    if observable == "prm_steps":
        assert out.result["aggregate"].attrs["aggregate"] == "min"
        assert np.isfinite(out.result["aggregate_margin"].values).all()
