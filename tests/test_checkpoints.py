"""Checkpoint sequences (issue 29 item 1): a model spec naming ordered checkpoints, a chain of fingerprints,
one multirun over them into one store; the training organism's checkpoints loaded through the one loader."""
from __future__ import annotations

import json

import numpy as np
import pytest

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.checkpoints import chain, content_digest, link, select_checkpoint, sequence
from reward_lens_spec.run import compose_run
from reward_lens_spec.spec import ModelSpec


@pytest.fixture
def organisms(tmp_path_factory, monkeypatch):
    """The training organism, trained once per test session into a shared folder."""
    from reward_lens_spec.models.training_organism import resolve

    monkeypatch.setenv("REWARD_LENS_SPEC_ORGANISMS", str(tmp_path_factory.getbasetemp() / "rls_organisms"))
    return resolve("training")


def _folders(tmp_path, n=3):
    out = []
    for i in range(n):
        d = tmp_path / f"ck{i}"
        d.mkdir()
        (d / "weights.bin").write_bytes(bytes([i]) * (10 + i))
        (d / "config.json").write_text(json.dumps({"i": i}))
        out.append(str(d))
    return out


def test_list_and_step_forms_select_one_checkpoint():
    m = ModelSpec(name="rm", checkpoints={"folder": "runs/a", "steps": [100, 200]}, checkpoint=1)
    select_checkpoint(m)
    assert (m.source, m.name) == ("runs/a/checkpoint-200", "rm@step200")
    select_checkpoint(m)                                   # idempotent: the name keeps one @label
    assert (m.source, m.name) == ("runs/a/checkpoint-200", "rm@step200")
    m = ModelSpec(name="rm", checkpoints=["x/first", "x/second"], checkpoint=0)
    select_checkpoint(m)
    assert (m.source, m.name) == ("x/first", "rm@first")
    assert [c.step for c in sequence(ModelSpec(checkpoints={"folder": "f", "steps": [1, 5]}))] == [1, 5]


@pytest.mark.parametrize("spec,key", [
    (dict(checkpoints=["a", "b"]), "model.checkpoint"),                       # no index: a run reads one
    (dict(checkpoints=["a", "b"], checkpoint=2), "model.checkpoint"),         # out of range
    (dict(checkpoint=0), "model.checkpoint"),                                 # no sequence
    (dict(checkpoints={"folder": "f", "steps": [200, 100]}, checkpoint=0), "model.checkpoints.steps"),
    (dict(checkpoints={"folder": "f"}, checkpoint=0), "model.checkpoints"),
    (dict(checkpoints=["a", "a"], checkpoint=0), "model.checkpoints"),
])
def test_bad_sequences_are_refused_naming_the_key(spec, key):
    with pytest.raises(SpecError) as err:
        select_checkpoint(ModelSpec(**spec))
    assert err.value.field == key


def test_composed_config_points_at_the_checkpoint():
    run, _ = compose_run(["model=tiny_checkpoints", "model.checkpoint=3"])
    assert run.model.source == "organism:training/checkpoint-60" and run.model.name == "tiny_checkpoints@step60"
    with pytest.raises(SpecError, match="model.checkpoint"):
        compose_run(["model=tiny_checkpoints", "model.checkpoint=11"])


def test_chain_changes_when_any_checkpoint_changes(tmp_path):
    paths = _folders(tmp_path)
    spec = ModelSpec(checkpoints=paths, checkpoint=2)
    before = chain(spec)
    assert before["index"] == 2 and len(before["digests"]) == 3
    c = None
    for d in before["digests"]:                            # the chain is the plain fold of the digests
        c = link(c, d)
    assert c == before["chain_sha256"]
    (tmp_path / "ck0" / "weights.bin").write_bytes(b"changed, longer")      # an EARLIER checkpoint changes
    after = chain(spec)
    assert after["content_sha256"] == before["content_sha256"]              # checkpoint 2 itself did not
    assert after["chain_sha256"] != before["chain_sha256"]
    (tmp_path / "ck2" / "config.json").write_text(json.dumps({"i": 2, "more": 1}))
    last = chain(spec)
    assert last["content_sha256"] != after["content_sha256"] and last["chain_sha256"] != after["chain_sha256"]
    assert chain(ModelSpec(checkpoints=paths, checkpoint=0))["digests"] == [last["digests"][0]]
    assert content_digest(paths[1]) == last["digests"][1]


def test_training_organism_checkpoints_load_through_the_one_loader(organisms):
    """Real HF folders (safetensors + tokenizer) read by models.hub; the planted step is in truth.json."""
    from reward_lens_spec.models.loading import load_model, resolve_source
    from reward_lens_spec.models.training_organism import PLANTED_STEP, checkpoint_steps

    kind, loc = resolve_source("organism:training/checkpoint-100")
    assert kind == "folder" and (loc.endswith("checkpoint-100"))
    truth = json.loads((organisms / "truth.json").read_text())
    assert truth["planted_step"] == PLANTED_STEP and checkpoint_steps()[-1] == truth["steps"]
    a = load_model(ModelSpec(name="a", source="organism:training/checkpoint-0"))
    b = load_model(ModelSpec(name="b", source="organism:training/checkpoint-200"))
    assert a.family.name == b.family.name
    wa, wb = np.asarray(a.head.W), np.asarray(b.head.W)
    assert wa.shape == wb.shape and abs(wa - wb).max() > 0                   # training moved the head
    with pytest.raises(SpecError, match="checkpoint-7"):
        resolve_source("organism:training/checkpoint-7")


def test_all_expands_to_one_multirun_over_the_sequence():
    from reward_lens_spec.cli import expand_checkpoints

    argv = ["model=tiny_checkpoints", "model.checkpoints.steps=[0,20,40]", "observable=margin"]
    assert expand_checkpoints(argv[:2] + ["model.checkpoint=all"] + argv[2:]) == \
        ["-m", *argv, "model.checkpoint=0,1,2"]
    assert expand_checkpoints(argv) == argv                                   # nothing to expand
    with pytest.raises(SpecError) as err:
        expand_checkpoints(["model=tiny", "model.checkpoint=all"])
    assert err.value.field == "model.checkpoint"


@pytest.mark.parametrize("value, checkpoint, source, cps", [
    ("[runs/a,runs/b]", 1, "runs/b", ["runs/a", "runs/b"]),                   # a list over the option's mapping
    ("{folder: r, steps: [5, 9]}", 0, "r/checkpoint-5", {"folder": "r", "steps": [5, 9]}),
])
def test_the_checkpoint_list_override_its_fix_names_works_over_a_checkpoint_option(value, checkpoint, source, cps):
    """Issue 36: ``model=tiny_checkpoints model.checkpoints=[a,b]`` (the form the Fix text gives) was Hydra's raw
    5-line merge error; now it replaces the option's sequence."""
    with pytest.raises(SpecError) as e:
        select_checkpoint(ModelSpec(checkpoint=0))
    assert "model.checkpoints=[folder_a, folder_b, ...]" in str(e.value)
    run, _ = compose_run(["model=tiny_checkpoints", f"model.checkpoints={value}", f"model.checkpoint={checkpoint}"])
    assert run.model.checkpoints == cps and run.model.source == source
    assert run.model.name == f"tiny_checkpoints@{source.rsplit('/', 1)[-1].replace('checkpoint-', 'step')}"
