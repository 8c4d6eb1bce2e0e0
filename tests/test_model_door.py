"""One guarded door for every model spec (issue 36, deliver 1): ``models.door``.

Every field of every schema that names a model (the top-level ``model``, ``model.members``,
``model.implicit.reference``, ``frame.partner``, ``model.checkpoints``) is enumerated from the dataclasses, and
each is driven through the real entry point (``cli.main`` in this process) from a shared file: a checkpoint
folder whose ``auto_map`` names a ``configuration_x.py`` / ``tokenization_x.py`` / ``modeling_x.py`` that would
create a marker file if imported; each run must exit 2 with one error line naming the spec's key, and the
marker must be absent. What the person types for that exact spec still counts.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import typing
from pathlib import Path

import pytest

from reward_lens_spec import spec as spec_module
from reward_lens_spec.cli import main
from reward_lens_spec.errors import SpecError
from reward_lens_spec import admission
from reward_lens_spec.models import door
from reward_lens_spec.paths import ENV
from reward_lens_spec.spec import ModelSpec, RunConfig

SECRET = "s3cr3t-36door-5e1b"


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, "")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DOOR_SECRET", SECRET)
    monkeypatch.setattr(sys, "argv", ["reward-lens-spec"])
    return tmp_path


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
    from reward_lens_spec.models.tiny import build_tiny

    d = tmp_path_factory.mktemp("door") / "plain"
    model, tok = build_tiny("tiny_llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture
def ckpt(tmp_path, llama_ckpt):
    """A tiny Llama checkpoint whose config and tokenizer name their own Python (``auto_map``); importing any of
    it creates ``ran.marker``. Its folder and module names are new for every test, so a module transformers
    imported in an earlier test cannot hide a second import."""
    import shutil
    import uuid

    tag = uuid.uuid4().hex[:10]
    d, marker = tmp_path / f"ckpt_{tag}", tmp_path / "ran.marker"
    shutil.copytree(llama_ckpt, d)
    touch = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (d / f"configuration_{tag}.py").write_text(touch + "from transformers import LlamaConfig\n"
                                              "class XConfig(LlamaConfig):\n    model_type = 'llama'\n")
    (d / f"modeling_{tag}.py").write_text(touch)
    (d / f"tokenization_{tag}.py").write_text(touch + "from transformers import PreTrainedTokenizerFast\n"
                                              "class XTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": f"configuration_{tag}.XConfig",
                       "AutoModelForSequenceClassification": f"modeling_{tag}.X",
                       "AutoModelForCausalLM": f"modeling_{tag}.X"}
    (d / "config.json").write_text(json.dumps(cfg))
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    tcfg["auto_map"] = {"AutoTokenizer": [None, f"tokenization_{tag}.XTokenizer"]}
    (d / "tokenizer_config.json").write_text(json.dumps(tcfg))
    return d, marker


def refused(capsys, argv, key: str) -> str:
    """``main(argv)`` exits 2 with exactly one error line naming ``key``."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], err
    return lines[0]


def write(root: Path, rel: str, text: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


RUN = ["dataset.limit=2", "store.url=s.zarr"]


def member_yaml(d: Path, flag: str = "trust_remote_code", name: str = "shared") -> str:
    return f"name: {name}\nsource: {d}\n{flag}: true\n"


def hostile_route(route: str, here: Path, d: Path) -> tuple[list[str], str]:
    """``(argv, key the refusal names)`` for one route a shared file takes to a loader (issue 36, finding 1)."""
    if route == "experiment member":
        cd = here / "shared_cfgs"
        write(cd, "experiment/shared.yaml", "# @package _global_\nmodel:\n  name: ens\n  kind: ensemble\n"
              f"  members:\n    - tiny\n    - {{name: shared, source: {d}, trust_remote_code: true}}\n")
        return ["--config-dir", str(cd), "experiment=shared", "observable=ensemble"], "model.members.1.trust_remote_code"
    if route == "experiment implicit reference":
        cd = here / "shared_cfgs"
        write(cd, "experiment/shared.yaml", "# @package _global_\nmodel:\n  name: dpo\n  kind: implicit\n"
              "  source: builtin:tiny_llama\n  implicit:\n"
              f"    reference: {{name: ref, source: {d}, trust_remote_code: true}}\n")
        return (["--config-dir", str(cd), "experiment=shared", "observable=implicit"],
                "model.implicit.reference.trust_remote_code")
    path = write(here, "member.yaml", member_yaml(d))
    if route == "frame.partner by path":
        return (["model=tiny_llama", "observable=score", "frame=shared", f"frame.partner={path}"],
                "frame.partner.trust_remote_code")
    if route == "member by path":
        return (["model=tiny_ensemble", f"model.members=[tiny,{path}]", "observable=ensemble"],
                "model.members.1.trust_remote_code")
    if route == "implicit reference by path":
        return (["model=tiny_implicit", f"model.implicit.reference={path}", "observable=implicit"],
                "model.implicit.reference.trust_remote_code")
    if route == "member by name from --config-dir":
        cd = here / "shared_cfgs"
        write(cd, "model/shared.yaml", member_yaml(d))
        return (["--config-dir", str(cd), "model=tiny_ensemble", "model.members=[tiny,shared]", "observable=ensemble"],
                "model.members.1.trust_remote_code")
    if route == "allow_pickle from a shared model YAML":
        p = write(here, "pickled.yaml", member_yaml(d, "allow_pickle"))
        return [f"model={p}", "observable=score"], "model.allow_pickle"
    if route == "allow_pickle of a member":
        p = write(here, "pickled.yaml", member_yaml(d, "allow_pickle"))
        return (["model=tiny_ensemble", f"model.members=[tiny,{p}]", "observable=ensemble"],
                "model.members.1.allow_pickle")
    raise AssertionError(route)


ROUTES = ["experiment member", "experiment implicit reference", "frame.partner by path", "member by path",
          "implicit reference by path", "member by name from --config-dir", "allow_pickle from a shared model YAML",
          "allow_pickle of a member"]


def grant_form(key: str) -> str:
    """What the Fix must say for ``<spec key>.<flag>`` (a form Hydra composes; ``model.members.1.x=true`` is not)."""
    spec, _, flag = key.rpartition(".")
    if spec == "model":
        return f"type model.{flag}=true on the command line"
    if spec.startswith("model.members."):
        return f"'model.members=[tiny,{{source: ..., {flag}: true}}]'"
    if spec == "model.implicit.reference":
        return f"'model.implicit.reference={{source: ..., {flag}: true}}'"
    return "cannot be granted that"


def test_a_grant_for_ones_own_member_never_covers_a_partner_files_member(here, ckpt):
    """Adversarial pass (after issue 36): a grant typed for one's own member 0 or implicit reference also covered
    the member 0 / reference named inside a shared frame.partner YAML, whose checkpoint code then ran. Keys are
    absolute now: the partner's member is ``frame.partner.members.0``, which nothing typed grants."""
    d, marker = ckpt
    typed = ["model=tiny_llama", "frame=shared",
             "model.members=[{name: m0, source: builtin:tiny_llama, trust_remote_code: true}]",
             "model.implicit.reference={name: r, source: builtin:tiny_llama, trust_remote_code: true}"]
    g = door.grants(typed)
    assert ("model.members.0", "trust_remote_code") in g and ("model.implicit.reference", "trust_remote_code") in g
    partner_file = write(here, "partner.yaml", f"name: p\nkind: ensemble\nmembers:\n  - {{name: e, source: {d}, "
                                               f"trust_remote_code: true}}\nimplicit: {{reference: {{name: q, source: "
                                               f"{d}, trust_remote_code: true}}}}\n")
    top = door.admit(door.ModelSpec(name="tiny_llama", source="builtin:tiny_llama"), "model", granted=g)
    partner = door.nested(top, str(partner_file), "frame.partner")
    for rel, ref in (("model.members.0", partner.members[0]), ("model.implicit.reference", partner.implicit.reference)):
        with pytest.raises(SpecError) as e:
            door.nested(partner, ref, rel)
        key = "frame.partner" + rel[len("model"):] + ".trust_remote_code"
        assert str(e.value).startswith(key) and "cannot be granted" in str(e.value) and "\n" not in str(e.value)
    own = door.nested(top, {"name": "m0", "source": "builtin:tiny_llama", "trust_remote_code": True}, "model.members.0")
    assert admission.permitted(own, "trust_remote_code") is True          # the grant still counts where typed
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES)
def test_a_shared_file_never_enables_checkpoint_code_or_pickle(here, capsys, ckpt, route):
    d, marker = ckpt
    argv, key = hostile_route(route, here, d)
    line = refused(capsys, argv + RUN, key)
    assert grant_form(key) in line                       # the Fix names a form Hydra accepts for that key
    assert not marker.exists()
    assert not (here / "s.zarr").exists()


@pytest.mark.slow
def test_a_partner_yaml_reading_the_environment_is_refused_and_the_secret_never_stored(here, capsys):
    """Finding 1: ``frame.partner=…yaml`` whose ``name: ${oc.env:SECRET}`` put the secret in the frame run's
    ``model`` coordinate. Now: one line naming the key, nothing written, the secret nowhere under the folder."""
    p = write(here, "partner.yaml", "name: ${oc.env:DOOR_SECRET}\nsource: builtin:tiny_llama\nseed: 3\n")
    line = refused(capsys, ["model=tiny_llama", "frame=whitened", "frame=shared", f"frame.partner={p}", *RUN],
                   "frame.partner.name")
    assert "oc.env" in line and SECRET not in line
    hits = [f for f in here.rglob("*") if f.is_file() and f != p and SECRET.encode() in f.read_bytes()]
    assert hits == [] and not (here / "s.zarr").exists()


def test_what_the_person_types_for_that_exact_spec_still_counts(here, ckpt):
    """The rule: ``<key>.<flag>=true`` typed, or the flag inside an inline mapping typed as that key's value."""
    d, marker = ckpt
    g = door.grants([f"model.members=[tiny,{{name: s, source: {d}, trust_remote_code: true}}]",
                     "model.implicit.reference.allow_pickle=true", "model.trust_remote_code=false",
                     "frame.partner=x.yaml", "model=tiny_ensemble", "+model.members.2.allow_pickle=yes"])
    assert g == {("model.members.1", "trust_remote_code"), ("model.implicit.reference", "allow_pickle"),
                 ("model.members.2", "allow_pickle")}
    inline = {"name": "s", "source": str(d), "trust_remote_code": True}
    spec = door.admit(inline, "model.members.1", granted=g)
    assert admission.permitted(spec, "trust_remote_code") is True
    with pytest.raises(SpecError) as e:                      # granted for member 1, not for member 0
        door.admit(inline, "model.members.0", granted=g)
    assert "model.members.0.trust_remote_code" in str(e.value) and "\n" not in str(e.value)
    path = write(here, "member.yaml", member_yaml(d))          # a file never enables it, whatever is typed elsewhere
    with pytest.raises(SpecError, match="model.members.0.trust_remote_code"):
        door.admit(str(path), "model.members.0", granted=g)
    assert not marker.exists()


def test_a_spec_changed_after_the_door_or_never_through_it_is_refused_by_every_loader(ckpt):
    from reward_lens_spec.models.causal import load_causal
    from reward_lens_spec.models.describe import model_config
    from reward_lens_spec.models.fingerprint_cache import load_tokenizer_only
    from reward_lens_spec.models.loading import load_model

    d, marker = ckpt
    after = door.admit({"name": "a", "source": str(d)}, "model.members.0")
    after.trust_remote_code = True                            # set after the door: not granted
    composed = spec_module.validate({"model": {"source": str(d), "allow_pickle": True}}).model   # never through it
    for spec, key in ((after, "model.members.0.trust_remote_code"), (composed, "model.allow_pickle")):
        for loader in (load_model, load_causal, model_config, load_tokenizer_only):
            with pytest.raises(SpecError) as e:
                loader(spec)
            assert key in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


# ----------------------------------------------------------------------------- every model field of every schema

def _contains(tp, target) -> bool:
    return tp is target or any(_contains(a, target) for a in typing.get_args(tp))


def model_fields(schema=RunConfig, prefix: str = "") -> dict[str, str]:
    """``{dotted key: why}`` for every field of the schemas (walked from ``RunConfig``) that names a model: its
    type is or contains ``ModelSpec``, or it takes free-form values (``Any``) or a string its schema documents as
    a ``conf/model`` option or model YAML."""
    hints = typing.get_type_hints(schema)
    doc = " ".join((schema.__doc__ or "").split())
    out = {}
    for f in dataclasses.fields(schema):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if _contains(tp, ModelSpec):
            out[key] = "ModelSpec"
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or \
            ([tp] if dataclasses.is_dataclass(tp) else [])
        for sub in inner:
            out.update(model_fields(sub, key + "."))
        if _contains(tp, typing.Any) and key not in NOT_MODELS:
            out[key] = "free-form"
        if _contains(tp, str) and f"``{f.name}``: " in doc and "conf/model" in doc.split(f"``{f.name}``: ")[1][:120]:
            out[key] = "documented as a model option"
    return out


# free-form fields that never name a model (a new free-form field must be classified: here or in door.MODEL_REFS)
NOT_MODELS = {"model.checkpoint", "model.batch_size", "observable.steps", "store.storage_options", "experiment",
              "model.device_map", "model.max_memory"}     # placement (models.placement): devices and sizes


def test_every_model_field_of_every_schema_goes_through_the_door():
    found = model_fields()
    assert set(found) == set(door.MODEL_REFS), (
        f"model-shaped fields {sorted(set(found) - set(door.MODEL_REFS))} are not resolved by models.door "
        f"(or door.MODEL_REFS lists {sorted(set(door.MODEL_REFS) - set(found))} that no schema has)")
    # every nested reference of a RunConfig is one of them, and each has a hostile route above
    run = spec_module.validate({"model": {"kind": "ensemble", "members": ["tiny", "tiny_llama"],
                                          "implicit": {"reference": "tiny"}}, "frame": {"name": "shared",
                                                                                       "partner": "tiny_llama"}})
    keys = {k.rsplit(".", 1)[0] if k[-1].isdigit() else k for k, _ in door.model_refs(run)}
    assert keys == set(door.MODEL_REFS) - {"model", "model.checkpoints"}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Two plain tiny Llama checkpoint folders (no code of their own)."""
    from reward_lens_spec.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("clean")
    out = []
    for seed in (0, 1):
        model, tok = build_tiny("tiny_llama", seed=seed)
        model.save_pretrained(root / f"c{seed}")
        tok.save_pretrained(root / f"c{seed}")
        out.append(root / f"c{seed}")
    return out


def benign_route(route: str, here: Path, clean) -> tuple[list[str], str]:
    if route == "model":
        return [f"model={write(here, 'top.yaml', f'name: top{chr(10)}source: {clean[0]}{chr(10)}')}"], "model"
    if route == "model.members":
        p = write(here, "m.yaml", "name: m\nsource: builtin:tiny\nseed: 5\n")
        return ["model=tiny_ensemble", f"model.members=[tiny,{p}]", "observable=ensemble"], "model.members.1"
    if route == "model.implicit.reference":
        p = write(here, "ref.yaml", "name: r\nsource: builtin:tiny_llama\nseed: 0\n")
        return ["model=tiny_implicit", f"model.implicit.reference={p}", "observable=implicit"], \
            "model.implicit.reference"
    if route == "frame.partner":
        p = write(here, "partner.yaml", "name: p\nsource: builtin:tiny_llama\nseed: 4\n")
        return ["model=tiny_llama", "frame=shared", f"frame.partner={p}", "frame.reference_limit=4"], "frame.partner"
    if route == "model.checkpoints":
        return ["model=tiny_checkpoints", f"model.checkpoints=[{clean[0]},{clean[1]}]", "model.checkpoint=1"], "model"
    raise AssertionError(route)


@pytest.mark.slow
@pytest.mark.parametrize("route", sorted(door.MODEL_REFS))
def test_every_spec_that_reaches_a_loader_came_through_the_door(here, capsys, monkeypatch, clean, route):
    """Each model field's route, run for real: every spec any loader reads carries the door's stamp for that
    field's key (a loader reading one that did not would fail here)."""
    seen = []
    real = admission.permitted

    def record(spec, flag):
        seen.append(admission.stamp_of(spec))
        return real(spec, flag)
    monkeypatch.setattr(admission, "permitted", record)
    argv, key = benign_route(route, here, clean)
    main(["observable=score"] + argv + RUN)
    assert "error" not in capsys.readouterr().err.lower()
    assert seen and all(s is not None and s.via == "door" for s in seen), seen
    assert key in {s.key for s in seen}


def test_intervention_artifacts_cross_the_door_under_their_spec_key(here):
    """``model.interventions`` (issue 40, item 4): the schema walk reaches every field of an entry and none names a
    model; each spec's artifacts are read at the door under that spec's own absolute key (a member's, a frame
    partner's), before any model loads: a tampered file or a pickle is refused in one line."""
    import numpy as np

    from reward_lens_spec.models.artifacts import write
    from reward_lens_spec.spec import InterventionSpec

    found = model_fields()
    assert not any(k.startswith("model.interventions") for k in found)
    assert dataclasses.is_dataclass(InterventionSpec) and {f.name for f in dataclasses.fields(InterventionSpec)} == \
        {"kind", "path", "site", "alpha"}
    good, _ = write(here / "v.safetensors", "steer", {"vector": np.ones(64)}, {})
    bad, _ = write(here / "t.safetensors", "steer", {"vector": np.ones(64)}, {})
    bad.write_bytes(bad.read_bytes()[:-1] + b"\x01")                       # tampered after export
    entry = lambda p: {"kind": "steer", "path": str(p), "site": "resid_post.0"}    # noqa: E731
    spec = door.admit({"name": "m", "source": "builtin:tiny", "interventions": [entry(good)]}, "model.members.1")
    assert spec.interventions[0].path == str(good)
    with pytest.raises(SpecError) as e:
        door.admit({"name": "m", "source": "builtin:tiny", "interventions": [entry(good), entry(bad)]},
                   "model.members.1")
    assert str(e.value).startswith("model.members.1.interventions.1.path") and "\n" not in str(e.value)
    (here / "p.pt").write_bytes(b"\x80\x04K\x01.")                        # a pickle, never read
    partner = here / "partner.yaml"
    partner.write_text(f"name: p\nsource: builtin:tiny_llama\ninterventions:\n  - {{kind: erase, path: {here / 'p.pt'}, "
                          "site: resid_post.0}\n")
    top = door.admit(ModelSpec(name="tiny_llama", source="builtin:tiny_llama"), "model")
    with pytest.raises(SpecError) as e:
        door.nested(top, str(partner), "frame.partner")
    assert str(e.value).startswith("frame.partner.interventions.0.path") and "\n" not in str(e.value)
