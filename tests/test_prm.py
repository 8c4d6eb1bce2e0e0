"""Process reward models (issue 28 item 2): the head at every step boundary, steps found in the tokens; a tiny
PRM organism with a planted bad step that the per-step instrument must locate; a plain forward as reference."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from reward_lens_spec.data import Pair
from reward_lens_spec.errors import SpecError
from reward_lens_spec.kinds.prm.steps import aggregate, boundaries
from reward_lens_spec.kinds.prm.organism import TEMPLATE, located_steps, prm_organism
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.base import PlanInfo
from reward_lens_spec.registry import build_plan
from reward_lens_spec.run import compose_run, compute, execute
from reward_lens_spec.inputs import load_inputs, load_lm


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


# -- the unterminated final step and the missing separator (issue 37 Deliver 3, issue 36 item 5) ----------
ANSWER_PAIRS = [Pair(id="seven", prompt="What is 3 + 4?", chosen="Add 3 and 4.\nx = 7", rejected="Add 3 and 4.\nx = 13"),
                Pair(id="ended", prompt="What is 2 + 2?", chosen="Add 2 and 2.\nx = 4\n", rejected="Guess.\nx = 5\n"),
                Pair(id="oneline", prompt="What is 1 + 1?", chosen="x = 2", rejected="Add 1 and 1.\nx = 3")]


@pytest.fixture(scope="module")
def tiny_prm_lm():
    run, _ = compose_run(["model=tiny_prm", "dataset.limit=1"])
    return load_lm(run.model)


@torch.no_grad()
def _naive_step_rewards(lm, pair, text, final: bool) -> list[float]:
    """The head on an unpadded forward's final-norm output at each "\\n" after the solution starts, then (``final``)
    at the last token when text follows the last "\\n": written from the tokenizer and model alone."""
    model, tok = lm.model, lm.tokenizer
    ids = tok(TEMPLATE.format(prompt=pair.prompt, response=text))["input_ids"]
    start = len(tok(TEMPLATE.format(prompt=pair.prompt, response=""))["input_ids"])
    nl = tok("\n", add_special_tokens=False)["input_ids"][0]
    pos = [t for t in range(start, len(ids)) if ids[t] == nl]
    if final and text.split("\n")[-1].strip():
        pos.append(len(ids) - 1)
    pos = pos or [len(ids) - 1]
    h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0].double()
    return (h[pos] @ model.score.weight.double().T)[:, 0].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("final_step", ["include", "drop"])
def test_an_unterminated_final_step_is_read_unless_dropped(tiny_prm_lm, final_step):
    """"x = 7" vs "x = 13" after the last "\\n" is a step of its own (include, the default), read at the last token,
    and the readout step; ``drop`` reads only the steps that end with the delimiter (the readings before
    ``model.prm.final_step`` existed). Every step against an independent unpadded forward."""
    lm = replace(tiny_prm_lm, signal=replace(tiny_prm_lm.signal, final_step=final_step))
    res, enc = _compute(lm, ANSWER_PAIRS, "prm_steps")
    include = final_step == "include"
    by_id = {p.id: p for p in ANSWER_PAIRS}
    for i, pid in enumerate(enc.pair_ids):
        for s, side in enumerate(("chosen", "rejected")):
            ref = _naive_step_rewards(lm, by_id[pid], getattr(by_id[pid], side), include)
            got = res["step_reward"].values[i, s]
            assert int(res["step_reward"]["n_steps"].values[i, s]) == len(ref), (pid, side)
            np.testing.assert_allclose(got[:len(ref)], ref, atol=1e-4, rtol=1e-4, err_msg=f"{pid}/{side}")
            assert np.isnan(got[len(ref):]).all()
    seven = enc.pair_ids.index("seven")
    n = res["step_reward"]["n_steps"].values[seven]
    assert n.tolist() == ([2, 2] if include else [1, 1])
    last = res["step_margin"].values[seven, n[0] - 1]
    np.testing.assert_allclose(res["margin"].values[seven], last, atol=1e-5)     # the readout step is the last one
    if include:                                   # the two sides differ only in their final answer: it is read
        assert abs(res["step_margin"].values[seven, 1]) > 1e-3 and abs(res["step_margin"].values[seven, 0]) < 1e-6
    else:
        assert abs(res["step_margin"].values[seven, 0]) < 1e-6 and abs(res["margin"].values[seven]) < 1e-6


def test_final_step_is_part_of_the_run_identity_and_checked():
    from reward_lens_spec.inputs import numerics

    default, _ = compose_run(["model=tiny_prm"])
    drop, _ = compose_run(["model=tiny_prm", "model.prm.final_step=drop"])
    assert numerics(default.model)["signal"]["final_step"] == "include"
    assert numerics(drop.model) != numerics(default.model)
    with pytest.raises(SpecError, match=r"model.prm.final_step: unknown value 'dorp'. Did you mean 'drop'"):
        compose_run(["model=tiny_prm", "model.prm.final_step=dorp"])


def test_a_side_without_the_step_token_flags_its_pair(tiny_prm_lm):
    """"x = 2" holds no "\\n": its pair carries ``no_step_separator`` (a coord of every result, and the run's
    accounting) instead of being read as one step in silence; the other pairs do not."""
    from reward_lens_spec.data.accounting import accounting
    from reward_lens_spec.inputs import encode

    res, enc = _compute(tiny_prm_lm, ANSWER_PAIRS, "prm_steps")
    for v in ("step_reward", "margin", "aggregate"):
        flag = dict(zip(res[v]["pair"].values, res[v]["no_step_separator"].values))
        assert flag == {"seven": False, "ended": False, "oneline": True}, v
    enc = encode(tiny_prm_lm, ANSWER_PAIRS, template=TEMPLATE)
    assert accounting(ANSWER_PAIRS, enc)["pair_flags"]["no_step_separator"] == ["oneline"]
