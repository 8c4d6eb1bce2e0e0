"""The registries (``reward_lens_spec.registries``): one ``Registry`` per extension point, each member one object
carrying its facts; criteria carry their floors; dataset readers read through the one loading path."""
from __future__ import annotations

import json

import pytest

from reward_lens_spec.errors import SpecError
from reward_lens_spec.registries import CRITERIA, DATASET_READERS, OPERATORS, Registry

# Every criterion's (floor, rtol, exact, cells) as the gate read them from trust.evidence's tables (FLOORS,
# MAG_RTOL, EXACT_CRITERIA, CELL_CRITERIA, KIND_FLOORS, SAE_FLOORS, DRIFT_FLOORS) before they moved beside the
# criteria, snapshot from main at e46a7c8. The numbers may not change.
BEFORE = {
    "ablation_share": (0.5, None, False, False),
    "attribution_share": (0.5, 0.25, False, True),
    "contested_direction": (0.8, None, False, True),
    "contested_margin": (1e-09, None, False, True),
    "crystallization": (0.8, 0.15, True, False),
    "curvature_direction": (0.9, None, False, True),
    "cyclic_gain": (1e-09, None, False, True),
    "dla_share": (0.5, 0.1, True, False),
    "drift_margin": (0.999, None, False, False),
    "drift_similarity": (0.999, None, False, False),
    "drift_step": (1.0, None, False, False),
    "effective_objectives": (0.99, None, False, False),
    "ensemble_member_margin": (0.999, None, False, False),
    "ensemble_reward": (0.999, None, False, False),
    "group_stats": (0.5, None, False, True),
    "implicit_log_ratio": (0.999, None, False, False),
    "label_cycles": (0.0, None, False, True),
    "leace_removal": (0.8, None, False, True),
    "leace_specificity": (0.75, None, False, True),
    "lens_jump": (0.5, 0.15, True, False),
    "null_excess": (0.95, None, False, True),
    "patch_share": (0.5, 0.1, True, False),
    "path_separation": (0.5, None, False, True),
    "prm_bad_step": (0.9, None, False, False),
    "prm_step_margin": (0.999, None, False, False),
    "prm_step_reward": (0.999, None, False, False),
    "sae_contribution": (0.999, None, False, False),
    "sae_error": (0.999, None, False, False),
    "sae_patch": (0.999, None, False, False),
    "scalar_cost": (0.5, None, False, True),
    "score": (0.8, 0.1, True, False),
    "steer_alignment": (0.5, None, False, True),
    "verdict_margin": (0.999, None, False, False),
}


def test_every_criterion_carries_the_floor_it_had():
    got = {n: (c.floor, c.rtol, c.exact, c.cells is not None) for n, c in CRITERIA.items()}
    assert got == BEFORE


class Thing:
    """A thing, for the registry's own tests."""

    def __init__(self, name):
        self.name = name


BOX = Thing("boxed")                   # the target of a lazy reference below


def test_register_by_decorator_and_by_lazy_reference():
    reg = Registry("thing", "things.name", kind=Thing)
    reg.register(Thing("alpha"))
    reg.lazy("boxed", f"{__name__}:BOX")
    assert "boxed" in reg and reg.names() == ["alpha", "boxed"]
    assert reg.get("boxed") is BOX and reg["alpha"].name == "alpha"
    assert reg.describe() == {"alpha": "A thing, for the registry's own tests.",
                              "boxed": "A thing, for the registry's own tests."}
    with pytest.raises(SpecError) as e:
        reg.get("alpah")
    assert str(e.value).startswith("things.name: unknown thing 'alpah'. Did you mean 'alpha'? Valid: alpha, boxed.")
    assert reg.get("nothing", default=None) is None


def test_a_reference_is_checked_when_resolved():
    reg = Registry("thing", "things.name", kind=Thing)
    reg.lazy("wrong", f"{__name__}:test_register_by_decorator_and_by_lazy_reference")   # not a Thing
    with pytest.raises(SpecError, match="does not give a thing"):
        reg.get("wrong")
    reg.lazy("misnamed", f"{__name__}:BOX")                  # names itself 'boxed'
    with pytest.raises(SpecError, match="names itself 'boxed'"):
        reg.get("misnamed")
    reg.lazy("gone", "no_such_module_h38:X")
    with pytest.raises(SpecError, match="cannot be imported"):
        reg.get("gone")
    with pytest.raises(TypeError, match="instance of"):
        reg.register(object(), name="plain")


def test_operators_are_one_registry():
    from reward_lens_spec.ops.base import Operator
    from reward_lens_spec.registry import get_operator, list_operators, register
    assert register.__self__ is OPERATORS and len(OPERATORS) >= 40
    assert all(issubclass(c, Operator) and c.name == n for n, c in OPERATORS.items())
    assert list(list_operators()) == OPERATORS.names() and get_operator("diff") is OPERATORS["diff"]


def test_dataset_kinds_are_the_readers():
    from reward_lens_spec.data.loaders import KINDS
    from reward_lens_spec.spec import DatasetKind
    assert DATASET_READERS.names() == sorted(KINDS) == sorted(k.value for k in DatasetKind)
    for name, r in DATASET_READERS.items():
        assert r.name == name and r.description and {"path", "limit"} <= set(r.open_dataset_parameters)


def test_a_reader_opens_through_the_one_loading_path(tmp_path, monkeypatch):
    import reward_lens_spec.inputs as inputs
    seen = []
    real = inputs.load_pairs
    monkeypatch.setattr(inputs, "load_pairs", lambda *a, **k: seen.append(a[0]) or real(*a, **k))
    rows = [{"prompt": "p", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    jsonl = DATASET_READERS["jsonl"]
    assert jsonl.guess_can_open(f) and not DATASET_READERS["diagnostic"].guess_can_open(f)
    ps = jsonl.open_dataset(f, limit=2)
    assert [p.chosen for p in ps] == ["good 0", "good 1"]
    from reward_lens_spec.data.readers import READERS          # a TRL shape: the trl reader, the same path
    assert READERS["standard_explicit"].open_dataset(f).checksum == jsonl.open_dataset(f).checksum
    assert seen == ["jsonl", "trl", "jsonl"]


def test_an_unknown_dataset_is_one_line_with_did_you_mean():
    from omegaconf import OmegaConf
    from reward_lens_spec.spec import validate
    with pytest.raises(SpecError) as e:
        validate(OmegaConf.create({"dataset": {"kind": "jsonll"}}))
    msg = str(e.value)
    assert msg.startswith("dataset.kind: unknown dataset reader 'jsonll'. Did you mean 'jsonl'?") and "\n" not in msg


def test_kinds_and_families_are_registries():
    from reward_lens_spec import kinds
    from reward_lens_spec.models.families import Family, family_for
    from reward_lens_spec.registries import FAMILIES, KINDS
    assert kinds.KINDS is KINDS and list(KINDS) == ["classifier", "judge", "prm", "implicit", "ensemble"]
    with pytest.raises(SpecError, match=r"^model\.kind: unknown kind of reward signal 'judg'\. Did you mean 'judge'\?"):
        kinds.get_kind("judg")
    assert FAMILIES.names() == ["gemma2", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3"]
    assert all(isinstance(f, Family) for f in FAMILIES.values()) and family_for("qwen2") is FAMILIES["qwen2"]


def test_organism_families_are_one_registry():
    """Every family the two old if/elif dispatchers knew (the classifier's nine, each kind's own, the three
    instruments') is one ``OrganismFamily`` in ``ORGANISMS``; a family registered in one line is built by
    ``organism_family``; a misspelt one is one line with "did you mean"."""
    from reward_lens_spec import kinds
    from reward_lens_spec.organisms.kind_organisms import organism_family
    from reward_lens_spec.organisms.organism_base import OrganismFamily, each_strength
    from reward_lens_spec.registries import ORGANISMS
    before = {"planted", "planted_head", "planted_paths", "trained_keyword", "trained_length", "planted_cycle",
              "annotator_mixture", "annotator_agreement", "multi_objective", "judge_planted", "prm_planted",
              "implicit_planted", "ensemble_planted", "concept", "curvature", "sparse_feature"}
    assert set(ORGANISMS) == before
    assert all(isinstance(ORGANISMS[n], OrganismFamily) and ORGANISMS[n].description for n in ORGANISMS)
    assert {n for k in kinds.KINDS.values() for n in k.organisms} <= set(ORGANISMS)
    seen = []
    ORGANISMS.register(each_strength("scratch", lambda s, n_pairs=3: seen.append((s, n_pairs)) or s, "a test's"))
    try:
        assert organism_family("scratch", (0.0, 0.5), n_pairs=5) == [0.0, 0.5] and seen == [(0.0, 5), (0.5, 5)]
    finally:
        ORGANISMS.pop("scratch")
    with pytest.raises(SpecError, match=r"^organism: unknown organism 'planted_hed'\. Did you mean 'planted_head'\?"):
        organism_family("planted_hed")
