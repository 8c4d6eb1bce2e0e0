"""Every config in the tree composes and plans; schema and plan errors name the key and the fix."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from reward_lens_spec.overrides import precheck_overrides
from reward_lens_spec.errors import SpecError
from reward_lens_spec.ops.bradley_terry import bt
from reward_lens_spec.paths import conf_dir, group_options
from reward_lens_spec.observables import load_observable
from reward_lens_spec.planning import plan_for
from reward_lens_spec.spec import ObservableSpec, register_configs, validate

register_configs()


def composed(*overrides):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("group", ["model", "dataset", "observable", "frame", "store"])
def test_every_option_of_every_group_composes(group):
    opts = group_options(group)
    assert opts
    for opt in opts:
        over = [f"{group}={opt}"]
        if opt == "jsonl":
            over.append("dataset.path=pairs.jsonl")
        if opt == "shared":                           # a shared frame needs its second model
            with pytest.raises(SpecError, match="frame.partner"):
                validate(composed(*over))
            over.append("frame.partner=tiny_llama")
        run = validate(composed(*over))
        assert run is not None


def test_every_observable_plans_on_every_tiny_model():
    """Every (tiny model, observable) pair validates and plans. Model and observable options each write
    only their own package (no defaults list, no interpolation), so a pair's config is the observable's
    composed config with the model's ``model`` node: each option is composed once (44 compositions, not
    340), and the pair is still validated and planned as a whole; one pair is checked against its own
    composition."""
    from omegaconf import OmegaConf

    def tree(*over):
        return OmegaConf.to_container(composed(*over), resolve=False)

    models = {m: tree(f"model={m}")["model"] for m in group_options("model") if m.startswith("tiny")}
    observables = {o: tree(f"observable={o}") for o in group_options("observable")}
    assert len(models) >= 10 and "tiny_gated" in models
    pair = dict(observables["examples/gated_scalar_cost"], model=models["tiny_gated"])
    assert pair == tree("model=tiny_gated", "observable=examples/gated_scalar_cost")
    refused = {}
    for model, model_node in models.items():
        for obs, cfg in observables.items():
            if obs == "examples/gated_scalar_cost" and model != "tiny_gated":
                continue                                    # its scalar is a gated head's own score
            node = dict(model_node)
            if obs in ("objectives", "scalar_cost"):        # need K > 1 rows
                node["num_labels"] = 3
            try:
                plan, _ = plan_for(validate(OmegaConf.create(dict(cfg, model=node))))
            except SpecError as e:
                refused[model, obs] = str(e)
                continue
            assert plan.outputs, (model, obs)
    # a refusal is one line naming the field and why, and only where the model cannot carry the instrument:
    # a kind without one linear head on one residual stream (model.kind), a one-row verdict asked for K rows,
    # or curvature (one linear row) on a gated head; every classifier plans every observable
    for (model, obs), msg in refused.items():
        kind = models[model].get("kind", "classifier")
        if obs == "prm_labels":                             # reads stepwise rows, not the default pairs
            assert msg.startswith("dataset.kind:") and "dataset=trl_stepwise" in msg and "\n" not in msg.strip(), msg
            continue
        own = next((k for k in ("implicit", "ensemble") if obs.startswith(k)), None)
        if own is not None and kind != own:                 # an observable of one kind, on another
            assert f"reads model.kind={own}" in msg and "Fix" in msg, (model, obs, msg)
            continue
        assert kind != "classifier" or (model, obs) == ("tiny_gated", "examples/curvature"), (model, obs, msg)
        assert "\n" not in msg.strip() and ("Fix" in msg or "does not apply to model.kind=" in msg), msg
        if kind in ("judge", "prm") and "num_labels" in msg:
            assert obs in ("objectives", "scalar_cost"), (model, obs, msg)
    for kind in ("implicit", "ensemble"):
        own = [o for o in observables if o.startswith(kind)]
        assert own and all((f"tiny_{kind}", o) not in refused for o in own), kind


@pytest.mark.parametrize("override,field,hint", [
    ("model.bach_size=3", "model.bach_size", "batch_size"),
    ("observable=scroe", "observable", "score"),
    ("model=tiny_lama", "model", "tiny_llama"),
    ("datset=diagnostic", "datset", "dataset"),
])
def test_precheck_names_key_and_suggests(override, field, hint):
    with pytest.raises(SpecError) as err:
        precheck_overrides([override])
    assert err.value.field == field and f"Did you mean '{hint}'" in str(err.value)


def test_schema_errors():
    with pytest.raises(SpecError, match="model.dtype.*float32"):
        precheck_overrides(["model.dtype=float64"])
    with pytest.raises(SpecError, match="model.batch_size.*positive"):
        precheck_overrides(["model.batch_size=-1"])
    with pytest.raises(SpecError, match="model.batch_size.*type"):
        precheck_overrides(["model.batch_size=many"])
    with pytest.raises(SpecError, match="model.bach_size"):
        validate({"model": {"bach_size": 3}})
    with pytest.raises(SpecError, match="trust is computed by gates"):
        validate(composed("+model.trust=calibrated"))


def _plan_error(steps, outputs, model="tiny"):
    obs = ObservableSpec(name="custom", steps=steps, outputs=outputs)
    run = validate(composed(f"model={model}"))
    run.observable = obs
    with pytest.raises(SpecError) as err:
        plan_for(run)
    return str(err.value)


def test_plan_validation_names_the_step_and_fix():
    msg = _plan_error([{"name": "x", "op": "captur", "site": "resid"}], ["x"])
    assert "steps.x.op" in msg and "Did you mean 'capture'" in msg
    msg = _plan_error([{"name": "x", "op": "capture", "site": "resid", "sight": 1}], ["x"])
    assert "sight" in msg and "Did you mean 'site'" in msg
    msg = _plan_error([{"name": "x", "op": "capture"}], ["x"])
    assert "missing params ['site']" in msg
    msg = _plan_error([{"name": "h", "op": "capture", "site": "readout"},
                       {"name": "p", "op": "bradley_terry", "input": "h"}], ["p"])
    assert "steps.p" in msg and "diff" in msg
    msg = _plan_error([{"name": "m", "op": "diff", "input": "nothing"}], ["m"])
    assert "'nothing' is not an earlier step" in msg


def test_layer_out_of_range_is_a_plan_error():
    run = validate(composed("observable=patch", "observable.layers=[1,9]"))
    with pytest.raises(SpecError, match=r"\[9\] out of range.*0\.\.3"):
        plan_for(run)


def test_bradley_terry_worked_example():
    d = math.log(3)
    assert bt(d, "p") == pytest.approx(0.75, abs=1e-12)
    assert bt(d, "loss") == pytest.approx(0.287682, abs=1e-6)
    assert bt(d, "grad") == pytest.approx(-0.25, abs=1e-12)
    assert d - 0.1 * bt(d, "grad") - d == pytest.approx(0.025, abs=1e-12)     # one gradient step on Δ
    a, b = np.array([5 + d, 5.0]), np.array([d, 0.0])
    for q in ("p", "loss", "grad"):
        assert bt(a[0] - a[1], q) == pytest.approx(bt(b[0] - b[1], q), abs=1e-12)


def test_examples_are_observables_with_their_own_names():
    for opt in [o for o in group_options("observable") if o.startswith("examples/")]:
        assert load_observable(opt).name == opt.split("/")[-1]


@pytest.mark.parametrize("override, key", [("observable.pairs=0", "observable.pairs"),
                                           ("observable.pairs=-1", "observable.pairs"),
                                           ("observable.layers=[]", "observable.layers"),
                                           ("observable.layers=[1,1]", "observable.layers"),
                                           ("observable.components=[mlp,mlp]", "observable.components"),
                                           ("observable.steps.0.mode=noise", "observable.steps.0.mode")])
def test_bad_restrictions_are_refused_at_plan_time_naming_the_key(override, key):
    with pytest.raises(SpecError) as err:
        precheck_overrides([override])
    assert err.value.field == key
