"""Generative judges (issue 28 item 1): the verdict logit difference as a one-row readout, on every tiny family,
against a plain forward of an independently built causal LM (its own next-token logits)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.tiny import TINY_CONFIGS, build_tiny_causal
from reward_lens_spec.planning import plan_for
from reward_lens_spec.run import compose_run, compute, execute
from reward_lens_spec.inputs import load_inputs

FAMILIES = sorted(TINY_CONFIGS)


def _run(args):
    run, yaml_text = compose_run(args)
    plan, info = plan_for(run)
    inp = load_inputs(run)
    m = run.model
    res, ctx, enc = compute(inp.lm, inp.pairs, plan, info, fmt=m.format.value, template=m.template,
                            max_length=m.max_length, batch_size=m.batch_size, padding_side=m.padding_side.value)
    return run, inp, res, enc


@torch.no_grad()
def _verdicts(name, seqs, yes, no):
    """logit(yes) − logit(no) at each sequence's last token: a fresh causal LM, one unpadded forward each."""
    model, _ = build_tiny_causal(name, seed=0)
    if getattr(model.config, "final_logit_softcapping", None):     # the readout is the pre-cap difference
        model.config.final_logit_softcapping = None
    out = []
    for ids in seqs:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        out.append(float(logits[yes] - logits[no]))
    return np.array(out)


@pytest.mark.parametrize("name", FAMILIES)
def test_judge_margin_is_the_verdict_margin_and_dla_sums_to_it(name):
    run, inp, res, enc = _run(["model=tiny_judge", f"model.source=builtin:{name}", "observable=dla", "observable.include=[score,lens]",
                               "observable.outputs=[reward,margin,lens,dla]",
                               "dataset.limit=4"])
    yes, no = inp.lm.signal.token_ids
    assert inp.lm.tokenizer.convert_ids_to_tokens([yes, no]) == ["Y", "N"]
    chosen = _verdicts(name, enc.chosen, yes, no)
    rejected = _verdicts(name, enc.rejected, yes, no)
    np.testing.assert_allclose(res["reward"].sel(side="chosen").values, chosen, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(res["reward"].sel(side="rejected").values, rejected, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(res["margin"].values, chosen - rejected, atol=2e-5, rtol=1e-4)
    dla = res["dla"]
    total = dla.sum([d for d in dla.dims if d != "pair"]).values
    np.testing.assert_allclose(total, res["margin"].values, atol=1e-5)        # Σ DLA = verdict margin
    # the normed lens at the last layer is the verdict margin too
    np.testing.assert_allclose(res["lens"].isel(layer=-1).values, res["margin"].values, atol=1e-5)


def test_judge_template_puts_the_readout_at_the_judgment_position():
    run, inp, res, enc = _run(["model=tiny_judge", "observable=margin", "dataset.limit=2"])
    pair = inp.pairs.pairs[0]
    text = f"Question: {pair.prompt}\nResponse: {pair.chosen}\nIs the response good (Y/N)? "
    assert enc.chosen[0] == inp.lm.tokenizer(text)["input_ids"]


def test_pairwise_margin_averages_both_orders_and_reports_order_bias():
    run, inp, res, enc = _run(["model=tiny_judge_pairwise", "observable=judge_pairwise", "dataset.limit=4"])
    tok = inp.lm.tokenizer
    a, b = inp.lm.signal.token_ids
    by_id = {p.id: p for p in inp.pairs.pairs}
    form = "Question: {p}\nA: {x}\nB: {y}\nWhich answer is better (A/B)? "
    ab = [tok(form.format(p=by_id[i].prompt, x=by_id[i].chosen, y=by_id[i].rejected))["input_ids"] for i in enc.pair_ids]
    ba = [tok(form.format(p=by_id[i].prompt, x=by_id[i].rejected, y=by_id[i].chosen))["input_ids"] for i in enc.pair_ids]
    assert enc.chosen == ab and enc.rejected == ba
    v_ab, v_ba = _verdicts("tiny_llama", ab, a, b), _verdicts("tiny_llama", ba, a, b)
    np.testing.assert_allclose(res["margin"].values, 0.5 * (v_ab - v_ba), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(res["order_bias"].values, 0.5 * (v_ab + v_ba), atol=2e-5, rtol=1e-4)


def test_pairwise_refuses_per_token_reward_with_a_reason():
    run, _ = compose_run(["model=tiny_judge_pairwise", "observable.name=pt",
                          "observable.steps=[{name: r, op: prefix, quantity: margin}]", "observable.outputs=[r]"])
    with pytest.raises(SpecError, match="does not apply to model.kind=judge: a pairwise side"):
        plan_for(run)


def test_verdict_tokens_must_be_one_token_each():
    run, _ = compose_run(["model=tiny_judge", "model.judge.tokens=[' Yes',' No']", "dataset.limit=2"])
    with pytest.raises(SpecError, match=r"model.judge.tokens: ' Yes' is 4 tokens .*Fix:"):
        load_inputs(run)


@pytest.mark.parametrize("override, field", [
    ("model.kind=jduge", "model.kind: unknown kind of reward signal 'jduge'. Did you mean 'judge'"),
    ("model.judge.mode=pairwize", "model.judge.mode: unknown judge mode 'pairwize'. Did you mean 'pairwise'"),
    ("model.judge.tokens=[Y,Y]", "model.judge.tokens: needs two distinct"),
])
def test_bad_judge_settings_are_refused_before_loading(override, field):
    with pytest.raises(SpecError, match=field.replace("(", r"\(").replace(")", r"\)")):
        compose_run(["model=tiny_judge", override])


def test_pairwise_needs_the_other_response_in_the_template():
    with pytest.raises(SpecError, match=r"model.template: a pairwise judge shows both"):
        compose_run(["model=tiny_judge_pairwise", "model.template='Q: {prompt} A: {response}'"])


@pytest.mark.parametrize("model, observable", [("tiny_judge", "score"), ("tiny_judge_pairwise", "judge_pairwise")])
def test_judge_configs_run_through_the_executor(model, observable, tmp_path):
    run, yaml_text = compose_run([f"model={model}", f"observable={observable}", "dataset.limit=4"])
    out = execute(run, resolved_yaml=yaml_text, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                  progress=False)
    assert out.status == "complete" and np.isfinite(out.result["margin"].values).all()
    again = execute(run, resolved_yaml=yaml_text, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                    progress=False)
    assert again.run_id == out.run_id and again.reused
    # the same checkpoint read as a classifier is another run (kind and tokens are in the identity)
    run2, y2 = compose_run([f"model={model}", "model.kind=classifier", f"observable={observable}",
                            "dataset.limit=4", "model.template='{prompt} {response} {other}'"])
    other = execute(run2, resolved_yaml=y2, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                    progress=False)
    assert other.run_id != out.run_id


@torch.no_grad()
def test_judge_organism_carries_the_planted_unit():
    """Trust organism for judges: the planted organism read as a judge. Its verdict margin is the causal LM's
    own next-token logit difference, equals the planted classifier's margin, and DLA puts the planted write in
    mlp_L1, growing with the planted strength."""
    from reward_lens_spec.kinds.judge.organism import judge_organism
    from reward_lens_spec.organisms.organisms import planted_organism
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan

    def run(lm, pairs, observable):
        info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=("reward",))
        return compute(lm, pairs, build_plan(load_observable(observable), info, load_observable), info)

    planted = []
    for s in (0.0, 0.5, 1.0):
        org = judge_organism(s, n_pairs=4)
        assert org.truth["unit"] == "mlp_L1"
        res, _, enc = run(org.lm, org.pairs, "dla")
        margin = run(org.lm, org.pairs, "margin")[0]["margin"].values
        yes, no = org.lm.signal.token_ids
        causal = org.lm.model.judge_causal
        own = [float(causal(input_ids=torch.tensor([c])).logits[0, -1, yes] - causal(input_ids=torch.tensor([c])).logits[0, -1, no])
               - float(causal(input_ids=torch.tensor([r])).logits[0, -1, yes] - causal(input_ids=torch.tensor([r])).logits[0, -1, no])
               for c, r in zip(enc.chosen, enc.rejected)]
        np.testing.assert_allclose(margin, own, atol=2e-5, rtol=1e-4)
        clf = planted_organism(s, n_pairs=4)
        np.testing.assert_allclose(margin, run(clf.lm, clf.pairs, "margin")[0]["margin"].values, atol=1e-5)
        dla = res["dla"]
        np.testing.assert_allclose(dla.sum(["layer", "component"]).values, margin, atol=1e-5)
        cell = dla.sel(layer=1, component="mlp").values
        planted.append(float(cell.mean()))
        if s > 0:
            flat = dla.fillna(0).mean("pair").stack(u=("layer", "component"))
            assert flat.u.values[int(abs(flat).argmax())] == (1, "mlp")
    assert planted[0] < planted[1] < planted[2]
